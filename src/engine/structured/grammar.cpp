#include "engine/structured/grammar.h"

#include <map>
#include <set>

#include "core/error.h"

namespace nextn::structured {
namespace {

using ojson = nlohmann::ordered_json;

// Keywords that describe a schema without constraining its values.
const std::set<std::string>& annotations() {
  static const std::set<std::string> k{"title",    "description", "default",  "examples", "$schema", "$id",
                                       "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",  "definitions",
                                       "discriminator"};
  return k;
}

// Keywords the compiler enforces (with their type-specific meaning below).
const std::set<std::string>& supported() {
  static const std::set<std::string> k{"type",  "enum",     "const",    "anyOf",    "oneOf",     "properties",
                                       "required", "additionalProperties", "items", "minItems", "maxItems",
                                       "minLength", "maxLength", "$ref"};
  return k;
}

// JSON pointer escaping of one reference token (RFC 6901).
std::string pointer_token(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return o;
}

// A property's key as Property::key spells it: its JSON string without the opening quote.
std::string property_key(const std::string& key) { return ojson(key).dump().substr(1); }

// The most value nodes a grammar holds (the matcher numbers them in 16 bits, and adds its own).
constexpr size_t kMaxNodes = size_t(1) << 15;

// Appends n to g's nodes, refusing past kMaxNodes (`where` names the schema or grammar in the error).
int add_node(Grammar& g, Node n, const std::string& where) {
  if (g.nodes.size() >= kMaxNodes) throw Error(where + ": the schema is too large (more than 32768 value nodes)");
  g.nodes.push_back(std::move(n));
  return int(g.nodes.size()) - 1;
}

// One document into a grammar's nodes; its references resolve within it.
class Compiler {
 public:
  Compiler(const ojson& document, std::string where, Grammar& g) : doc_(document), where_(std::move(where)), g_(&g) {}

  int run() { return build(doc_, ""); }

 private:
  [[noreturn]] void fail(const std::string& ptr, const std::string& what) const {
    throw Error(where_ + (ptr.empty() ? "" : " at " + ptr) + ": " + what);
  }

  int add(Node n) { return add_node(*g_, std::move(n), where_); }

  int64_t count(const ojson& s, const char* key, const std::string& ptr) const {
    const ojson& v = s.at(key);
    if (!v.is_number_integer() && !v.is_number_unsigned()) fail(ptr + "/" + key, "must be a non-negative integer");
    const int64_t n = v.get<int64_t>();
    if (n < 0) fail(ptr + "/" + key, "must be a non-negative integer");
    return n;
  }

  // "#/..." within the document; the target is compiled once (recursive schemas refer back to it).
  int reference(const ojson& s, const std::string& ptr) {
    const ojson& r = s.at("$ref");
    if (!r.is_string()) fail(ptr + "/$ref", "must be a string");
    const std::string ref = r.get<std::string>();
    if (ref.empty() || ref[0] != '#')
      fail(ptr + "/$ref", "only references within the schema (\"#/...\") are supported, not '" + ref + "'");
    for (const auto& [k, v] : s.items())
      if (k != "$ref" && !annotations().count(k))
        fail(ptr + "/" + pointer_token(k), "a keyword beside $ref is not supported");
    if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
    const ojson* target = nullptr;
    try {
      target = &doc_.at(nlohmann::json_pointer<std::string>(ref.substr(1)));
    } catch (const std::exception&) {
      fail(ptr + "/$ref", "'" + ref + "' does not name a schema in the document");
    }
    // A placeholder node, filled once the target is built, so that a reference back to it resolves.
    const int slot = add(Node{});
    refs_[ref] = slot;
    const int built = build(*target, ref.substr(1));
    Node alias;
    alias.kind = Kind::kAnyOf;
    alias.alternatives = {built};
    g_->nodes[size_t(slot)] = std::move(alias);
    return slot;
  }

  int build(const ojson& s, const std::string& ptr) {
    if (++depth_ > kMaxSchemaDepth)
      fail(ptr, "the schema nests deeper than " + std::to_string(kMaxSchemaDepth) + " levels");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(ptr, "the schema 'false' allows no value");
      return add(Node{});
    }
    if (!s.is_object()) fail(ptr, "a schema must be an object or a boolean");
    if (s.contains("$ref")) return reference(s, ptr);
    for (const auto& [k, v] : s.items())
      if (!supported().count(k) && !annotations().count(k))
        fail(ptr + "/" + pointer_token(k), "the keyword '" + k + "' is not supported (it would not be enforced)");
    if (s.contains("enum") || s.contains("const")) return literals(s, ptr);
    for (const char* k : {"anyOf", "oneOf"})
      if (s.contains(k)) return any_of(s, k, ptr);
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s.at("type");
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const ojson& e : t) {
          if (!e.is_string()) fail(ptr + "/type", "must be a type name or an array of them");
          types.push_back(e.get<std::string>());
        }
      } else {
        fail(ptr + "/type", "must be a type name or an array of them");
      }
    } else {
      // No type: what the other keywords describe, or any value.
      if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) types = {"object"};
      else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) types = {"array"};
      else if (s.contains("minLength") || s.contains("maxLength")) types = {"string"};
      else return add(Node{});
    }
    if (types.size() == 1) return typed(s, types[0], ptr);
    Node alt;
    alt.kind = Kind::kAnyOf;
    for (const std::string& t : types) alt.alternatives.push_back(typed(s, t, ptr));
    return add(std::move(alt));
  }

  int typed(const ojson& s, const std::string& type, const std::string& ptr) {
    auto only = [&](std::initializer_list<const char*> allowed) {
      for (const char* k : {"properties", "required", "additionalProperties", "items", "minItems", "maxItems",
                            "minLength", "maxLength"}) {
        bool ok = false;
        for (const char* a : allowed) ok |= std::string(a) == k;
        if (!ok && s.contains(k) && !multi_type(s))
          fail(ptr + "/" + k, std::string("'") + k + "' does not apply to type '" + type + "'");
      }
    };
    Node n;
    if (type == "object") {
      only({"properties", "required", "additionalProperties"});
      return object(s, ptr);
    } else if (type == "array") {
      only({"items", "minItems", "maxItems"});
      n.kind = Kind::kArray;
      n.items = s.contains("items") ? build(s.at("items"), ptr + "/items") : add(Node{});
      if (s.contains("minItems")) n.min_items = count(s, "minItems", ptr);
      if (s.contains("maxItems")) n.max_items = count(s, "maxItems", ptr);
      if (n.max_items >= 0 && n.max_items < n.min_items) fail(ptr + "/maxItems", "is less than minItems");
    } else if (type == "string") {
      only({"minLength", "maxLength"});
      n.kind = Kind::kString;
      if (s.contains("minLength")) n.min_length = count(s, "minLength", ptr);
      if (s.contains("maxLength")) n.max_length = count(s, "maxLength", ptr);
      if (n.max_length >= 0 && n.max_length < n.min_length) fail(ptr + "/maxLength", "is less than minLength");
    } else if (type == "number" || type == "integer") {
      only({});
      n.kind = type == "number" ? Kind::kNumber : Kind::kInteger;
    } else if (type == "boolean") {
      only({});
      n.kind = Kind::kLiteral;
      n.literals = {"true", "false"};
    } else if (type == "null") {
      only({});
      n.kind = Kind::kLiteral;
      n.literals = {"null"};
    } else {
      fail(ptr + "/type", "unknown type '" + type + "'");
    }
    return add(std::move(n));
  }

  static bool multi_type(const ojson& s) { return s.contains("type") && s.at("type").is_array(); }

  int object(const ojson& s, const std::string& ptr) {
    Node n;
    n.kind = Kind::kObject;
    std::set<std::string> required;
    if (s.contains("required")) {
      const ojson& r = s.at("required");
      if (!r.is_array()) fail(ptr + "/required", "must be an array of property names");
      for (const ojson& e : r) {
        if (!e.is_string()) fail(ptr + "/required", "must be an array of property names");
        required.insert(e.get<std::string>());
      }
    }
    const bool declared = s.contains("properties");
    if (declared) {
      const ojson& props = s.at("properties");
      if (!props.is_object()) fail(ptr + "/properties", "must be an object");
      for (const auto& [key, sub] : props.items()) {
        Property p;
        p.key = property_key(key);
        p.required = required.count(key) > 0;
        p.node = build(sub, ptr + "/properties/" + pointer_token(key));
        n.properties.push_back(std::move(p));
      }
    }
    for (const std::string& r : required) {
      const std::string key = property_key(r);
      bool found = false;
      for (const Property& p : n.properties) found |= p.key == key;
      if (!found) fail(ptr + "/required", "'" + r + "' is required but not among the properties");
    }
    if (!declared) {
      // A map: any keys, values of additionalProperties (any value when absent or true).
      n.free_keys = true;
      n.additional = s.contains("additionalProperties") && !s.at("additionalProperties").is_boolean()
                         ? build(s.at("additionalProperties"), ptr + "/additionalProperties")
                         : add(Node{});
      if (s.contains("additionalProperties") && s.at("additionalProperties").is_boolean() &&
          !s.at("additionalProperties").get<bool>())
        n.free_keys = false;  // {} only
    } else if (s.contains("additionalProperties")) {
      // Extra keys are allowed by the schema, but the output keeps to the declared ones (a valid subset);
      // a malformed value is still an error.
      const ojson& a = s.at("additionalProperties");
      if (!a.is_boolean()) build(a, ptr + "/additionalProperties");
    }
    return add(std::move(n));
  }

  int literals(const ojson& s, const std::string& ptr) {
    for (const auto& [k, v] : s.items())
      if (k != "enum" && k != "const" && k != "type" && !annotations().count(k))
        fail(ptr + "/" + pointer_token(k), "a keyword beside enum / const is not supported");
    Node n;
    n.kind = Kind::kLiteral;
    std::vector<ojson> values;
    if (s.contains("const")) values.push_back(s.at("const"));
    if (s.contains("enum")) {
      const ojson& e = s.at("enum");
      if (!e.is_array() || e.empty()) fail(ptr + "/enum", "must be a non-empty array");
      for (const ojson& v : e) values.push_back(v);
    }
    std::set<std::string> seen;
    for (const ojson& v : values) {
      std::string text = v.dump();
      if (seen.insert(text).second) n.literals.push_back(std::move(text));
    }
    return add(std::move(n));
  }

  int any_of(const ojson& s, const char* key, const std::string& ptr) {
    for (const auto& [k, v] : s.items())
      if (k != key && !annotations().count(k))
        fail(ptr + "/" + pointer_token(k), std::string("a keyword beside ") + key + " is not supported");
    const ojson& list = s.at(key);
    if (!list.is_array() || list.empty()) fail(ptr + "/" + key, "must be a non-empty array of schemas");
    Node n;
    n.kind = Kind::kAnyOf;
    for (size_t i = 0; i < list.size(); ++i)
      n.alternatives.push_back(build(list[i], ptr + "/" + key + "/" + std::to_string(i)));
    return add(std::move(n));
  }

  const ojson& doc_;
  std::string where_;
  Grammar* g_ = nullptr;
  std::map<std::string, int> refs_;
  int depth_ = 0;  // build()'s recursion (schemas in schemas, references followed)
};

}  // namespace

// By relaxation to a fixed point (recursive schemas make the graph cyclic).
std::vector<int> min_nesting(const Grammar& g) {
  constexpr int kEndless = 1 << 20;
  const std::vector<Node>& nodes = g.nodes;
  std::vector<int> d(nodes.size(), kEndless);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = nodes[i];
      int v = 0;
      if (n.kind == Kind::kAnyOf) {
        v = kEndless;
        for (int a : n.alternatives) v = std::min(v, d[size_t(a)]);
      } else if (n.kind == Kind::kObject) {
        for (const Property& p : n.properties)
          if (p.required) v = std::max(v, d[size_t(p.node)]);
        v = std::min(kEndless, v + 1);
      } else if (n.kind == Kind::kArray) {
        v = std::min(kEndless, 1 + (n.min_items > 0 ? d[size_t(n.items)] : 0));
      }
      if (v < d[i]) d[i] = v, changed = true;
    }
  }
  return d;
}

Grammar Grammar::any_value() {
  Grammar g;
  g.nodes.push_back(Node{});
  return g;
}

Grammar Grammar::any_object() {
  Grammar g;
  g.nodes.push_back(Node{});  // 0: the values
  Node o;
  o.kind = Kind::kObject;
  o.free_keys = true;
  o.additional = 0;
  g.nodes.push_back(std::move(o));
  g.root = 1;
  return g;
}

Grammar Grammar::from_schema(const nlohmann::ordered_json& schema, const std::string& where) {
  GrammarBuilder b;
  const int root = b.schema(schema, where);
  return std::move(b).finish(root, where);
}

int GrammarBuilder::schema(const nlohmann::ordered_json& document, const std::string& where) {
  return Compiler(document, where, g_).run();
}

int GrammarBuilder::add(Node n) { return add_node(g_, std::move(n), "structured output"); }

int GrammarBuilder::object(const std::vector<std::pair<std::string, int>>& properties) {
  Node n;
  n.kind = Kind::kObject;
  for (const auto& [key, node] : properties) {
    Property p;
    p.key = property_key(key);
    p.node = node;
    p.required = true;
    n.properties.push_back(std::move(p));
  }
  return add(std::move(n));
}

int GrammarBuilder::literal(const nlohmann::ordered_json& value) {
  Node n;
  n.kind = Kind::kLiteral;
  n.literals = {value.dump()};
  return add(std::move(n));
}

int GrammarBuilder::any_of(std::vector<int> alternatives) {
  Node n;
  n.kind = Kind::kAnyOf;
  n.alternatives = std::move(alternatives);
  return add(std::move(n));
}

// A schema whose every value nests deeper than kMaxNesting (a required property chain) could never be
// generated: refused here rather than found stuck mid-generation.
Grammar GrammarBuilder::finish(int root, const std::string& where) && {
  if (root < 0 || size_t(root) >= g_.nodes.size()) throw Error(where + ": the grammar has no root");
  g_.root = root;
  if (min_nesting(g_)[size_t(root)] > kMaxNesting)
    throw Error(where + ": every value of this schema nests deeper than " + std::to_string(kMaxNesting) +
                " containers");
  return std::move(g_);
}

std::optional<Grammar> grammar_of_response_format(const nlohmann::ordered_json& rf, const std::string& where) {
  if (!rf.is_object() || !rf.contains("type") || !rf.at("type").is_string())
    throw Error("'" + where + "' must be an object with a string 'type'");
  const std::string type = rf.at("type").get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") return Grammar::any_object();
  if (type != "json_schema")
    throw Error("'" + where + ".type' must be 'text', 'json_object' or 'json_schema', got '" + type + "'");
  const auto js = rf.find("json_schema");
  if (js == rf.end() || !js->is_object())
    throw Error("'" + where + ".json_schema' must be an object holding 'schema'");
  if (const auto strict = js->find("strict"); strict != js->end() && !strict->is_null() && !strict->is_boolean())
    throw Error("'" + where + ".json_schema.strict' must be true or false");
  const auto schema = js->find("schema");
  if (schema == js->end() || schema->is_null()) return Grammar::any_value();
  return Grammar::from_schema(*schema, where + ".json_schema.schema");
}

}  // namespace nextn::structured
