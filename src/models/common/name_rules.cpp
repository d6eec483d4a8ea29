#include "models/common/name_rules.h"

#include <cctype>

namespace nextn::names {

bool starts_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.compare(0, p.size(), p) == 0; }

bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

bool contains(std::string_view s, std::string_view p) { return s.find(p) != std::string_view::npos; }

std::string to_upper(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

std::string to_lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

bool split_indexed(const std::string& name, std::string_view head, int* index, std::string* rest) {
  if (!starts_with(name, head)) return false;
  size_t i = head.size(), j = i;
  while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
  if (j == i || j - i > 9 || j + 1 >= name.size() || name[j] != '.') return false;
  *index = std::stoi(name.substr(i, j - i));
  *rest = name.substr(j + 1);
  return true;
}

bool module_matches(const std::string& pattern, const std::string& module) {
  size_t n = pattern.size();
  while (n > 0 && pattern[n - 1] == '*') --n;
  const std::string_view p(pattern.data(), n);
  if (n < pattern.size()) return starts_with(module, p);
  return module == p || (module.size() > n && starts_with(module, p) && module[n] == '.');
}

std::string remap_kv_scale_name(const std::string& name) {
  if (ends_with(name, ".kv_scale")) return name.substr(0, name.size() - 9) + ".attn.k_scale";
  for (const char* kv : {"k", "v"}) {
    const std::string suffix = std::string(".") + kv + "_scale";
    if (!ends_with(name, suffix)) continue;
    const std::string modelopt = std::string(".self_attn.") + kv + "_proj" + suffix;
    if (ends_with(name, modelopt)) return name.substr(0, name.size() - modelopt.size()) + ".self_attn.attn" + suffix;
    return name.substr(0, name.size() - suffix.size()) + ".attn" + suffix;
  }
  return "";
}

bool is_split_expert(const std::string& n) {
  const size_t at = n.find(".experts.");
  if (at == std::string::npos) return false;
  size_t i = at + 9, j = i;
  while (j < n.size() && std::isdigit(static_cast<unsigned char>(n[j]))) ++j;
  return j > i && j < n.size() && n[j] == '.';
}

bool is_scale_tensor(const std::string& n) {
  for (const char* s : {"weight_scale_inv", "weight_scale", "_proj_scale_inv", "_proj_scale", ".k_scale", ".v_scale",
                        ".kv_scale", ".input_scale"})
    if (ends_with(n, s)) return true;
  return n.find(".experts.") != std::string::npos && ends_with(n, ".scale");
}

}  // namespace nextn::names
