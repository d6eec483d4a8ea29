#include "serve/chat_template/jinja.h"

#include "serve/chat_template/jinja_eval.h"
#include "serve/chat_template/jinja_lexer.h"
#include "serve/chat_template/jinja_parser.h"

namespace nextn::serve::jinja {

struct Template::Impl {
  std::string origin;
  Limits limits;
  Body body;
};

Template Template::parse(std::string_view source, const std::string& origin, const Limits& limits) {
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;
  impl->limits = limits;
  try {
    impl->body = jinja::parse(tokenize(source), limits.max_nesting);
  } catch (const SyntaxError& e) {
    throw nextn::Error(origin + ", line " + std::to_string(e.line()) + ": " + e.what());
  }
  return Template(std::move(impl));
}

std::string Template::render(const Variables& variables) const {
  Interpreter interp(impl_->limits);
  try {
    return interp.render(impl_->body, variables);
  } catch (const Failure& e) {
    throw RenderError(impl_->origin, interp.line(), e.what());
  }
}

const std::string& Template::origin() const { return impl_->origin; }

}  // namespace nextn::serve::jinja
