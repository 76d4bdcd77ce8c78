// JSON text byte-identical to Python's `json.dumps(value, ensure_ascii=False)`: separators ", " and
// ": ", object keys in stored order (use nlohmann::ordered_json to keep a request's order), floats as
// Python's repr (1.0, 1e-05, 1e+16), non-ASCII kept as UTF-8, control characters escaped. The V4.1
// reference encoder writes tool schemas and tool-call values this way, so the prompt depends on it.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace di {

std::string python_json_dumps(const nlohmann::ordered_json& value);
void append_python_json(std::string& out, const nlohmann::ordered_json& value);
// Appends `text` (valid UTF-8) as a quoted JSON string.
void append_python_json_string(std::string& out, std::string_view text);
// Python's repr() of a float: shortest round-trip digits, fixed notation for exponents -4..15.
std::string python_float_repr(double value);

}  // namespace di
