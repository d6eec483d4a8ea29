// Structured output: what a generated text must be, as a small graph of JSON value nodes compiled from a
// JSON Schema (OpenAI's response_format json_schema) or "any JSON object" (json_object). The matcher
// (matcher.h) walks it byte by byte; the token filter (token_filter.h) turns that into allowed token ids.
//
// The generated text is always valid against the schema, and may be a subset of what the schema allows:
// object properties come in the schema's order with no others (as OpenAI's strict mode and xgrammar emit
// them), each enum value in its compact JSON spelling, numbers of at most kMaxNumberBytes bytes (exponents of
// two digits at most: no number overflows a double), nesting at most kMaxNesting containers deep, and
// whitespace only where JSON printers put it (after '{', '[', ',' and ':', and before '}' and ']'), in runs of
// at most kMaxWhitespaceRun bytes: free whitespace lets a small model fill every gap with newlines until
// max_tokens. A keyword that would constrain values in a way the matcher cannot enforce (minimum, pattern,
// format, ...) is refused by name, never ignored.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace nextn::structured {

constexpr int kMaxWhitespaceRun = 24;
constexpr int kMaxNumberBytes = 40;
constexpr int kMaxNesting = 24;
constexpr int kMaxSchemaDepth = 64;  // schema objects within schema objects (deeper: refused)

enum class Kind : uint8_t {
  kAny,      // any JSON value
  kObject,   // declared properties in order; or, with none declared, any keys with values of `additional`
  kArray,    // items of `items`, min_items..max_items of them
  kString,   // min_length..max_length characters (code points)
  kNumber,
  kInteger,  // a number without fraction or exponent
  kLiteral,  // one of `literals` exactly (true / false / null, enum, const)
  kAnyOf,    // one of `alternatives`
};

struct Property {
  std::string key;  // the key's JSON spelling without its opening quote, closing quote included: name"
  int node = -1;
  bool required = false;
};

struct Node {
  Kind kind = Kind::kAny;
  std::vector<Property> properties;  // kObject, in schema order
  bool free_keys = false;            // kObject: any keys (no properties declared); values of `additional`
  int additional = -1;               // kObject with free_keys: the values' node
  int items = -1;                    // kArray
  int64_t min_items = 0, max_items = -1;    // kArray (-1: no maximum)
  int64_t min_length = 0, max_length = -1;  // kString, in code points (-1: no maximum)
  std::vector<std::string> literals;        // kLiteral: compact JSON texts
  std::vector<int> alternatives;            // kAnyOf
};

struct Grammar {
  std::vector<Node> nodes;
  int root = 0;

  // OpenAI's json_object: one JSON object, any keys and values.
  static Grammar any_object();
  // Any JSON value.
  static Grammar any_value();
  // From a JSON Schema document. Throws nextn::Error naming the keyword and its JSON pointer in the schema
  // (prefixed by `where`, e.g. "response_format.json_schema.schema") for what is not supported or malformed.
  static Grammar from_schema(const nlohmann::ordered_json& schema, const std::string& where = "schema");
};

// A grammar made of several JSON Schema documents, each resolving its "$ref"s within itself ("#/..." points into
// that document, whatever else the grammar holds), joined by nodes of the caller's: tool_choice "required"'s
// anyOf over the tools' {"name", "arguments"} objects, each tool's parameters a document of its own.
class GrammarBuilder {
 public:
  // One document's values; returns its root node. Throws as Grammar::from_schema (naming `where`).
  int schema(const nlohmann::ordered_json& document, const std::string& where);
  // An object of these properties (key, node), all of them required, in this order.
  int object(const std::vector<std::pair<std::string, int>>& properties);
  // Exactly this JSON value (in its compact spelling).
  int literal(const nlohmann::ordered_json& value);
  // A value of any of these nodes.
  int any_of(std::vector<int> alternatives);
  // The grammar, rooted at `root`. Throws nextn::Error naming `where` when every value of root nests deeper than
  // kMaxNesting (it could never be generated).
  Grammar finish(int root, const std::string& where) &&;

 private:
  int add(Node n);
  Grammar g_;
};

// OpenAI's response_format object: {"type": "text"} (nullopt), {"type": "json_object"}, or {"type":
// "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": bool}} (no schema: any JSON value).
// Throws nextn::Error naming `where` and the field for anything else.
std::optional<Grammar> grammar_of_response_format(const nlohmann::ordered_json& rf, const std::string& where);

// [node]: the fewest containers a value of each node nests (its own included; a large number for a node
// whose values cannot end).
std::vector<int> min_nesting(const Grammar& g);

}  // namespace nextn::structured
