// Rules over checkpoint tensor names that hold for any model family: prefixes and suffixes, indexed
// components ("model.layers.12.mlp..."), exclusion-list patterns, and the names of scale tensors. A family's
// own renames (hub -> internal) live with its loader.
//
// In namespace nextn::names: short names like ends_with would otherwise clash with a file's own helpers.
#pragma once
#include <string>
#include <string_view>

namespace nextn::names {

bool starts_with(std::string_view s, std::string_view prefix);
bool ends_with(std::string_view s, std::string_view suffix);
bool contains(std::string_view s, std::string_view part);
// ASCII case mapping (config values such as "fp8" / "FP8").
std::string to_upper(std::string s);
std::string to_lower(std::string s);

// "HEAD<digits>.REST" -> index and REST, e.g. ("model.layers.3.mlp.gate", "model.layers.") -> 3, "mlp.gate".
// False for anything else (no digits, more than 9 digits, nothing after the dot).
bool split_indexed(const std::string& name, std::string_view head, int* index, std::string* rest);

// An exclusion-list entry (quantization_config.ignored_layers, ...) against a module name: a trailing `*`
// makes it a plain string prefix; otherwise it names the module itself or one of its parents (whole dotted
// components: "model.layers.1" matches "model.layers.1.mlp", not "model.layers.10").
bool module_matches(const std::string& pattern, const std::string& module);

// vLLM's maybe_remap_kv_scale_name: where a KV-cache scale would go ("" if `name` is not one).
std::string remap_kv_scale_name(const std::string& name);

// "...experts.<digits>.*": one expert of the split MoE layout (as opposed to fused [E, ...] tensors).
bool is_split_expert(const std::string& name);

// FP8 block scales and KV / activation scales: tensors that are not parameters of the model.
bool is_scale_tensor(const std::string& name);

}  // namespace nextn::names
