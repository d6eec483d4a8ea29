// An error the server answers with OpenAI's error body and an HTTP status:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}
#pragma once
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace nextn::serve {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = "", std::string type = "", std::string code = "")
      : std::runtime_error(message), status(status), param(std::move(param)), type(std::move(type)),
        code(std::move(code)) {}
  int status;
  std::string param, type, code;  // empty: null (type: chosen from the status)
};

// 400 naming the request field.
inline ApiError bad_field(const std::string& param, const std::string& message) {
  return ApiError(400, message, param);
}

// OpenAI's error object for `e` (the type defaults from the status: 4xx invalid_request_error, 429
// rate_limit_error, 5xx server_error).
nlohmann::json error_body(const ApiError& e);

// JSON text that is always valid UTF-8 (token text can hold partial characters: those bytes become U+FFFD).
std::string dump_json(const nlohmann::json& j);

}  // namespace nextn::serve
