// Fuzzes the server's request parsing: the input is a request body, given to both endpoints
// (parse_completion_request, parse_chat_request with the bundled model's chat template and tokenizer).
//
// Bad input must be an ApiError with an HTTP status the server sends (4xx) and, for a 400 about one field, a
// message naming it; any other exception escapes and fails the run. An accepted request must be one the
// engine can run: prompts within the vocabulary, prompt + max_tokens within the context, valid parameters.
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "engine/structured/token_filter.h"
#include "fuzz_util.h"
#include "serve/api_error.h"
#include "serve/chat_template/chat_template.h"
#include "serve/openai_request.h"

namespace {

using nextn::serve::ApiError;

struct Served {
  Served()
      : tok(nextn::Tokenizer::from_dir(std::string(NEXTN_SOURCE_DIR) + "/models/nextn-hy4-tiny")),
        templ(nextn::serve::ChatTemplate::from_checkpoint(std::string(NEXTN_SOURCE_DIR) + "/models/nextn-hy4-tiny")) {
    facts.vocab_size = int64_t(tok.vocab_size());
    facts.context = 4096;
    facts.num_mtp_layers = 2;
    facts.eos_token_ids = {2};
    model.id = "nextn-hy4-tiny";
    model.facts = &facts;
    model.tokenizer = &tok;
    model.chat_template = templ ? &*templ : nullptr;
    model.vocab = nextn::structured::TokenVocab::from_tokenizer(tok, facts.vocab_size);  // (response_format)
  }
  nextn::Tokenizer tok;
  std::optional<nextn::serve::ChatTemplate> templ;
  nextn::ModelFacts facts;
  nextn::serve::ServedModel model;
};

void check_accepted(const nextn::serve::ApiRequest& r, const Served& s) {
  NEXTN_FUZZ_CHECK(!r.prompts.empty());
  for (const auto& p : r.prompts) {
    NEXTN_FUZZ_CHECK(!p.empty());
    for (int32_t t : p) NEXTN_FUZZ_CHECK(t >= 0 && t < s.facts.vocab_size);
    NEXTN_FUZZ_CHECK(int64_t(p.size()) + r.params.max_tokens <= s.facts.context);
  }
  NEXTN_FUZZ_CHECK(r.params.max_tokens >= 1);
  NEXTN_FUZZ_CHECK(r.n >= 1 && r.n <= s.model.max_n);
  NEXTN_FUZZ_CHECK(r.logprobs >= -1 && r.logprobs <= 20);
  r.params.validate();
  r.spec.validate();
}

template <class Parse>
void one(const nlohmann::json& body, const Served& s, Parse parse) {
  try {
    check_accepted(parse(body, s.model), s);
  } catch (const ApiError& e) {
    NEXTN_FUZZ_CHECK(e.status == 400 || e.status == 404);
    NEXTN_FUZZ_CHECK(std::string(e.what()).size() > 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Served served;
  const nlohmann::json body = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return 0;  // (the server answers 400 before parsing fields)
  one(body, served, [](const nlohmann::json& b, const auto& m) { return nextn::serve::parse_completion_request(b, m); });
  one(body, served, [](const nlohmann::json& b, const auto& m) { return nextn::serve::parse_chat_request(b, m); });
  return 0;
}
