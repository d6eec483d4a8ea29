#include "models/common/binder.h"

#include "core/finite.h"
#include "core/tensor.h"
#include "models/common/name_rules.h"

namespace nextn {

using names::ends_with;
using names::starts_with;

TensorBinder::TensorBinder(const WeightStore& store, LoadReport& report) : store_(store), r_(report) {}

// ---------------------------------------------------------------------------------------------------
// The name table

void TensorBinder::add(const std::string& canon, const std::string& raw) {
  auto [it, fresh] = canon_.emplace(canon, raw);
  if (!fresh) error("tensors '" + it->second + "' and '" + raw + "' both map to '" + canon + "'");
}

bool TensorBinder::skip_activation_scale(const std::string& raw, const std::string& canon) {
  if (const std::string kv = names::remap_kv_scale_name(canon); !kv.empty()) {
    kv_scales_.emplace_back(raw, kv);
    return true;
  }
  if (ends_with(canon, ".input_scale")) {
    ++input_scales_;
    return true;
  }
  return false;
}

void TensorBinder::set_exclusions(const QuantScheme& q, const std::function<std::string(const std::string&)>& canonical) {
  auto& entries = exclusions_[&q];
  entries.clear();
  for (const std::string& pat : q.ignored) entries.emplace_back(pat, canonical(pat));
}

// ---------------------------------------------------------------------------------------------------
// Lookups

bool TensorBinder::has_prefix(const std::string& prefix) const {
  auto it = canon_.lower_bound(prefix);
  return it != canon_.end() && starts_with(it->first, prefix);
}

const TensorView* TensorBinder::peek(const std::string& canon) const {
  auto it = canon_.find(canon);
  return it == canon_.end() ? nullptr : store_.find(it->second);
}

const TensorView* TensorBinder::take(const std::string& canon) {
  auto it = canon_.find(canon);
  if (it == canon_.end()) return nullptr;
  used_.insert(it->first);
  return store_.find(it->second);
}

const TensorView* TensorBinder::take_unread(const std::string& wname) {
  const TensorView* t = take(wname);
  if (t)
    for (const std::string& sn : scale_names(wname)) take(sn);
  return t;
}

std::string TensorBinder::raw_of(const std::string& canon) const {
  auto it = canon_.find(canon);
  return it == canon_.end() ? canon : it->second;
}

// ---------------------------------------------------------------------------------------------------
// Checks and small tensors

bool TensorBinder::check(const TensorView* t, const std::vector<int64_t>& shape, bool allow_fp8) {
  if (t->shape != shape) {
    error("tensor '" + t->name + "' in " + store_.file_of(t->name) + ": expected shape " + list_string(shape) +
          ", found " + list_string(t->shape));
    return false;
  }
  const bool ok = t->dtype == DType::F32 || t->dtype == DType::BF16 || t->dtype == DType::F16 ||
                  (allow_fp8 && t->dtype == DType::F8_E4M3);
  if (!ok) {
    error("tensor '" + t->name + "' in " + store_.file_of(t->name) + ": expected dtype F32, BF16, F16" +
          (allow_fp8 ? " or F8_E4M3" : "") + ", found " + dtype_name(t->dtype));
    return false;
  }
  return true;
}

void TensorBinder::witness_size(const ConfigField& f, const std::string& canon, size_t rank, size_t axis,
                                int64_t scale, int64_t offset) {
  const TensorView* t = peek(canon);
  if (!t || t->shape.size() != rank || witnessed_.count(f.name)) return;
  const int64_t found = t->shape[axis];
  if (found == scale * f.value + offset) return;
  witnessed_.insert(f.name);
  const bool implied = found > offset && (found - offset) % scale == 0;
  const std::string shown = "tensor '" + t->name + "' " + list_string(t->shape) + " in " + store_.file_of(t->name);
  const std::string fits = implied ? " (" + f.name + " = " + std::to_string((found - offset) / scale) + ")" : "";
  if (f.defaulted)
    error(f.file + ": field '" + f.name + "' is missing, and transformers' default " + std::to_string(f.value) +
          " does not fit " + shown + fits);
  else
    error(f.file + ": field '" + f.name + "' is " + std::to_string(f.value) + ", which does not fit " + shown + fits);
}

std::vector<float> TensorBinder::vec_any(const std::vector<std::string>& names, int64_t n) {
  std::vector<float> out;
  std::vector<const TensorView*> found;
  for (const auto& nm : names)
    if (const TensorView* t = take(nm)) found.push_back(t);
  if (found.empty()) {
    std::string m = names[0];
    for (size_t i = 1; i < names.size(); ++i) {
      m += i == 1 ? " (or " : ", ";
      m += names[i];
    }
    if (names.size() > 1) m += ")";
    missing(m);
    return out;
  }
  if (found.size() > 1) {
    error("tensors '" + found[0]->name + "' and '" + found[1]->name + "' name the same parameter");
    return out;
  }
  if (!check(found[0], {n}, false)) return out;
  out.resize(static_cast<size_t>(n));
  convert_to_f32(found[0]->dtype, found[0]->data, out.data(), n);
  if (!finite_values(found[0], out.data(), n)) out.clear();
  return out;
}

std::vector<float> TensorBinder::small(const std::string& name, const std::vector<int64_t>& shape) {
  std::vector<float> out;
  const TensorView* t = take(name);
  if (!t) {
    missing(name);
    return out;
  }
  if (!check(t, shape, false)) return out;
  const int64_t n = t->numel();
  out.resize(static_cast<size_t>(n));
  convert_to_f32(t->dtype, t->data, out.data(), n);
  if (!finite_values(t, out.data(), n)) out.clear();
  return out;
}

bool TensorBinder::finite_values(const TensorView* t, const float* v, int64_t n) {
  const NonFiniteCount bad = count_non_finite(v, n);
  if (bad.count == 0) return true;
  error("tensor '" + t->name + "' in " + store_.file_of(t->name) + " has " + std::to_string(bad.count) +
        " non-finite value(s) (NaN or inf), the first at index " + std::to_string(bad.first));
  return false;
}

// ---------------------------------------------------------------------------------------------------
// Linears

Linear TensorBinder::linear(const std::string& prefix, int64_t out, int64_t in, Role role, std::vector<float>* bias) {
  Linear l = named_linear(prefix + ".weight", prefix, out, in, role);
  if (bias) {
    *bias = vec(prefix + ".bias", out);
    l.bias = bias->data();
  }
  return l;
}

Linear TensorBinder::named_linear(const std::string& wname, const std::string& module, int64_t out, int64_t in,
                                  Role role) {
  const TensorView* t = take(wname);
  if (!t) {
    missing(wname);
    return {};
  }
  if (!check(t, {out, in}, true)) return {};
  const QuantScheme& q = scheme_for(wname);
  Quant qt = quant(t, q, ignored_by(modules_of(module, t->name), q), role, scale_names(wname), {}, out, in);
  return qt.ok ? make_linear(t, qt, out, in, 0, 0) : Linear{};
}

std::vector<Linear> TensorBinder::stacked(const std::string& p, const std::string& fused,
                                          const std::vector<Part>& parts, int64_t in, Role role) {
  std::vector<Linear> out(parts.size());
  const std::string fw = p + fused + ".weight";
  if (!has(fw)) {
    for (size_t i = 0; i < parts.size(); ++i) out[i] = linear(p + parts[i].name, parts[i].rows, in, role, parts[i].bias);
    return out;
  }
  const TensorView* t = take(fw);
  std::vector<std::string> separate;
  for (const Part& part : parts)
    if (const TensorView* s = take(p + part.name + ".weight")) separate.push_back(s->name);
  if (!separate.empty()) {
    error("checkpoint has both the fused tensor '" + t->name + "' and its part '" + separate[0] + "'");
    return out;
  }
  int64_t total = 0;
  for (const Part& part : parts) total += part.rows;
  if (!check(t, {total, in}, true)) return out;
  const QuantScheme& q = scheme_for(fw);
  bool ok = true;
  const std::string by = fused_ignored_by(t, p, fused, parts, q, ok);
  if (!ok) return out;
  Quant qt = quant(t, q, by, role, scale_names(fw), {}, total, in);
  if (!qt.ok) return out;
  const Linear whole = make_linear(t, qt, total, in, 0, 0);
  int64_t r0 = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    // Linear::rows handles a part that starts inside a scale block (the scale row is shared).
    out[i] = whole.rows(r0, parts[i].rows);
    r0 += parts[i].rows;
  }
  stacked_bias(p, fused, parts, total, out);
  return out;
}

std::string TensorBinder::fused_ignored_by(const TensorView* t, const std::string& p, const std::string& fused,
                                           const std::vector<Part>& parts, const QuantScheme& q, bool& ok) const {
  std::string by = ignored_by(modules_of(p + fused, t->name), q);
  if (!by.empty()) return by;
  // The parts' checkpoint names: the fused tensor's prefix as stored, with each part's name.
  const std::string tail = fused + ".weight";
  const std::string raw_prefix = ends_with(t->name, tail) ? t->name.substr(0, t->name.size() - tail.size()) : p;
  std::vector<std::string> hits;
  for (const Part& part : parts)
    if (std::string h = ignored_by(modules_of(p + part.name, raw_prefix + part.name + ".weight"), q); !h.empty())
      hits.push_back(h);
  if (hits.size() == parts.size()) return hits[0];
  if (!hits.empty()) {
    r_.errors.push_back("tensor '" + t->name + "' fuses " + std::to_string(parts.size()) +
                        " modules but the exclusion list ('" + hits[0] +
                        "') names only some of them; a fused tensor is quantized as a whole");
    ok = false;
  }
  return "";
}

void TensorBinder::stacked_bias(const std::string& p, const std::string& fused, const std::vector<Part>& parts,
                                int64_t total, std::vector<Linear>& out) {
  bool want_bias = false;
  for (const Part& part : parts) want_bias |= part.bias != nullptr;
  if (!want_bias) return;
  const std::vector<float> fb = vec(p + fused + ".bias", total);
  if (fb.size() != static_cast<size_t>(total)) return;  // (the problem is in the report)
  int64_t off = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].bias) {
      parts[i].bias->assign(fb.begin() + off, fb.begin() + off + parts[i].rows);
      out[i].bias = parts[i].bias->data();
    }
    off += parts[i].rows;
  }
}

Quant TensorBinder::quant(const TensorView* t, const QuantScheme& q, const std::string& ignored, Role role,
                          const std::vector<std::string>& scales, const std::vector<int64_t>& lead, int64_t rows,
                          int64_t cols) {
  Quant r;
  if (t->dtype != DType::F8_E4M3) {
    if (q.fp8 && role == Role::Quantized && ignored.empty()) {
      error("tensor '" + t->name + "' is " + dtype_name(t->dtype) + " and has no block scale ('" + t->name +
            "_scale_inv'), but " + q.source + " quantizes it: store it as FP8 with its scale, or list the module in "
            "quantization_config.ignored_layers");
      r.ok = false;
    }
    return r;
  }
  r.fp8 = true;
  if (!q.fp8) {
    error("tensor '" + t->name + "' is F8_E4M3 but " + q.source);
    r.ok = false;
    return r;
  }
  if (!ignored.empty()) {
    error("tensor '" + t->name + "' is F8_E4M3 but its module is excluded from quantization by '" + ignored + "' (" +
          q.source + "): excluded modules must be stored unquantized (BF16, F16 or F32)");
    r.ok = false;
    return r;
  }
  std::vector<const TensorView*> found;
  for (const auto& n : scales)
    if (const TensorView* s = take(n)) found.push_back(s);
  if (found.empty()) {
    error("FP8 tensor '" + t->name + "' has no block scale (expected '" + t->name + "_scale_inv')");
    r.ok = false;
    return r;
  }
  if (found.size() > 1) {
    error("FP8 tensor '" + t->name + "' has several block scales: '" + found[0]->name + "' and '" + found[1]->name + "'");
    r.ok = false;
    return r;
  }
  std::vector<int64_t> want = lead;
  want.push_back(block_count(rows, q.block_out));
  want.push_back(block_count(cols, q.block_in));
  r.ok = check_scale(t, found[0], q, want, r);
  return r;
}

bool TensorBinder::check_scale(const TensorView* t, const TensorView* s, const QuantScheme& q,
                               const std::vector<int64_t>& want, Quant& r) {
  if (s->shape != want) {
    error("scale tensor '" + s->name + "' of '" + t->name + "': expected shape " + list_string(want) + " (block [" +
          std::to_string(q.block_out) + ", " + std::to_string(q.block_in) +
          "] from quantization_config.weight_block_size), found " + list_string(s->shape));
    return false;
  }
  switch (s->dtype) {
    case DType::F32:
    case DType::BF16:
    case DType::F8_E8M0:
      r.scale_dtype = s->dtype;
      break;
    case DType::U8:
      if (!q.ue8m0) {
        error("scale tensor '" + s->name + "' is U8 but quantization_config.scale_fmt is not \"ue8m0\"");
        return false;
      }
      r.scale_dtype = DType::F8_E8M0;  // raw exponent bytes: reinterpreted, not converted
      break;
    default:
      error("scale tensor '" + s->name + "': expected dtype F32, BF16, F8_E8M0 or U8 (ue8m0), found " +
            dtype_name(s->dtype));
      return false;
  }
  r.scale = s->data;
  r.block_out = q.block_out;
  r.block_in = q.block_in;
  return true;
}

Linear TensorBinder::make_linear(const TensorView* t, const Quant& q, int64_t out, int64_t in, int64_t elem_offset,
                                 int64_t scale_offset) {
  Linear l;
  l.dtype = t->dtype;
  l.out = out;
  l.in = in;
  l.row_stride = in;
  l.data = static_cast<const uint8_t*>(t->data) + static_cast<size_t>(elem_offset) * dtype_size(t->dtype);
  if (q.fp8) {
    l.scale = static_cast<const uint8_t*>(q.scale) + static_cast<size_t>(scale_offset) * dtype_size(q.scale_dtype);
    l.scale_dtype = q.scale_dtype;
    l.block_out = q.block_out;
    l.block_in = q.block_in;
    l.scale_cols = block_count(in, q.block_in);
  }
  return l;
}

std::string TensorBinder::ignored_by(const std::vector<std::string>& modules, const QuantScheme& q) const {
  auto it = exclusions_.find(&q);
  if (it == exclusions_.end()) return "";
  for (const auto& [pat, canon_pat] : it->second)
    for (const std::string& m : modules)
      if (names::module_matches(pat, m) || names::module_matches(canon_pat, m)) return pat;
  return "";
}

// ---------------------------------------------------------------------------------------------------
// When everything is bound

void TensorBinder::report_unused(const std::function<std::string(const std::string& raw)>& hint) {
  for (const auto& [canon, raw] : canon_) {
    if (used_.count(canon)) continue;
    r_.warnings.push_back("unknown checkpoint tensor '" + raw + "' (skipped)" + hint(raw));
  }
}

void TensorBinder::report_skipped_scales() {
  if (!kv_scales_.empty())
    r_.infos.push_back("ignoring " + std::to_string(kv_scales_.size()) + " KV-cache scale tensor(s) (e.g. '" +
                       kv_scales_[0].first + "' -> '" + kv_scales_[0].second +
                       "'): nextn does not quantize the KV cache");
  if (input_scales_ > 0)
    r_.infos.push_back("ignoring " + std::to_string(input_scales_) +
                       " activation scale tensor(s) (input_scale): FP8 compute is weight-only");
}

// ---------------------------------------------------------------------------------------------------
// Defaults of what the family decides

std::vector<std::string> TensorBinder::modules_of(const std::string& canon_module, const std::string& raw_weight) const {
  std::vector<std::string> m = {canon_module};
  std::string raw = raw_weight;
  if (ends_with(raw, ".weight")) raw.resize(raw.size() - 7);
  if (raw != canon_module) m.push_back(raw);
  return m;
}

std::vector<std::string> TensorBinder::scale_names(const std::string& w) const {
  if (ends_with(w, ".weight")) {
    const std::string base = w.substr(0, w.size() - 7);
    return {base + ".weight_scale_inv", base + ".weight_scale"};
  }
  return {w + "_scale_inv", w + "_scale"};
}


// ---- MoE experts

namespace {
std::string expert_prefix(const std::string& p, int64_t e) { return p + "experts." + std::to_string(e) + "."; }
std::string split_hint(const std::string& p, int64_t E) {
  return p + "experts.{0.." + std::to_string(E - 1) + "}.";
}
}  // namespace

// gate / up of the routed experts: fused [E, 2I, H] (`up` may start inside a scale block when
// I % block != 0: Linear::rows handles it), or per expert (themselves split or stacked).
void TensorBinder::experts_gate_up(const std::string& p, int64_t E, int64_t I, int64_t H, std::vector<Linear>& gate,
                                 std::vector<Linear>& up) {
  const std::string fgu = p + "experts.gate_up_proj";
  bool split = false;
  for (int64_t e = 0; e < E; ++e) {
    const std::string ep = expert_prefix(p, e);
    split |= has(ep + "gate_proj.weight") || has(ep + "up_proj.weight") || has(ep + "gate_up_proj.weight");
  }
  if (has(fgu) && split) {
    error("checkpoint has both fused '" + raw_of(fgu) + "' and split " + split_hint(p, E) + "gate_proj/up_proj tensors");
    take(fgu);
  } else if (has(fgu)) {
    const TensorView* t = take(fgu);
    if (!check(t, {E, 2 * I, H}, true)) return;
    const QuantScheme& q = scheme_for(fgu);
    const Quant qt = quant(t, q, ignored_by(modules_of(fgu, t->name), q), Role::Quantized, scale_names(fgu), {E},
                           2 * I, H);
    if (!qt.ok) return;
    const int64_t srows = qt.fp8 ? block_count(2 * I, qt.block_out) * block_count(H, qt.block_in) : 0;
    for (int64_t e = 0; e < E; ++e) {
      const Linear gu = make_linear(t, qt, 2 * I, H, e * 2 * I * H, e * srows);
      gate[e] = gu.rows(0, I);
      up[e] = gu.rows(I, I);
    }
  } else if (split) {
    for (int64_t e = 0; e < E; ++e) {
      auto v = stacked(expert_prefix(p, e), "gate_up_proj", {{"gate_proj", I}, {"up_proj", I}}, H, Role::Quantized);
      gate[e] = v[0];
      up[e] = v[1];
    }
  } else {
    missing(fgu + " (or split " + split_hint(p, E) + "gate_proj.weight / up_proj.weight)");
  }
}

// down of the routed experts: fused [E, H, I] or per expert.
void TensorBinder::experts_down(const std::string& p, int64_t E, int64_t I, int64_t H, std::vector<Linear>& down) {
  const std::string fdn = p + "experts.down_proj";
  bool split = false;
  for (int64_t e = 0; e < E; ++e) split |= has(expert_prefix(p, e) + "down_proj.weight");
  if (has(fdn) && split) {
    error("checkpoint has both fused '" + raw_of(fdn) + "' and split " + split_hint(p, E) + "down_proj tensors");
    take(fdn);
  } else if (has(fdn)) {
    const TensorView* t = take(fdn);
    if (!check(t, {E, H, I}, true)) return;
    const QuantScheme& q = scheme_for(fdn);
    const Quant qt = quant(t, q, ignored_by(modules_of(fdn, t->name), q), Role::Quantized, scale_names(fdn), {E}, H, I);
    if (!qt.ok) return;
    const int64_t srows = qt.fp8 ? block_count(H, qt.block_out) * block_count(I, qt.block_in) : 0;
    for (int64_t e = 0; e < E; ++e) down[e] = make_linear(t, qt, H, I, e * H * I, e * srows);
  } else if (split) {
    for (int64_t e = 0; e < E; ++e) down[e] = linear(expert_prefix(p, e) + "down_proj", H, I, Role::Quantized);
  } else {
    missing(fdn + " (or split " + split_hint(p, E) + "down_proj.weight)");
  }
}

void TensorBinder::experts(const std::string& p, int64_t E, int64_t I, int64_t H, std::vector<Linear>& gate,
                           std::vector<Linear>& up, std::vector<Linear>& down) {
  gate.assign(E, Linear{});
  up.assign(E, Linear{});
  down.assign(E, Linear{});
  experts_gate_up(p, E, I, H, gate, up);
  experts_down(p, E, I, H, down);
}

}  // namespace nextn
