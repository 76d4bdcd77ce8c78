#include "tokenizer/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace di {

std::string python_float_repr(double value) {
  // json.dumps writes non-finite floats as these bare words (allow_nan=True is its default).
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";

  // Shortest round-trip digits in scientific form, e.g. "-1.2345e+03".
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  DI_CHECK(res.ec == std::errc());
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));

  bool negative = !sci.empty() && sci[0] == '-';
  if (negative) sci.remove_prefix(1);
  size_t e_pos = sci.find('e');
  DI_CHECK(e_pos != std::string_view::npos);
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  int exponent = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());

  // Built with append() only (GCC 12 raises a false -Wrestrict on chained string operator+).
  std::string out;
  if (negative) out.push_back('-');
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      size_t int_len = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= int_len) {
        out.append(digits).append(int_len - digits.size(), '0').append(".0");
      } else {
        out.append(digits, 0, int_len).append(".").append(digits, int_len);
      }
    } else {
      out.append("0.").append(static_cast<size_t>(-exponent - 1), '0').append(digits);
    }
  } else {
    out.push_back(digits[0]);
    if (digits.size() > 1) out.append(".").append(digits, 1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_buf;
  }
  return out;
}

void append_python_json_string(std::string& out, std::string_view text) {
  out.push_back('"');
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof(esc), "\\u%04x", c);
          out += esc;
        } else {
          out.push_back(ch);  // ASCII and UTF-8 bytes as they are (ensure_ascii=False)
        }
    }
  }
  out.push_back('"');
}

void append_python_json(std::string& out, const nlohmann::ordered_json& value) {
  using Type = nlohmann::ordered_json::value_t;
  switch (value.type()) {
    case Type::null: out += "null"; break;
    case Type::boolean: out += value.get<bool>() ? "true" : "false"; break;
    case Type::number_integer: out += std::to_string(value.get<int64_t>()); break;
    case Type::number_unsigned: out += std::to_string(value.get<uint64_t>()); break;
    case Type::number_float: out += python_float_repr(value.get<double>()); break;
    case Type::string: append_python_json_string(out, value.get_ref<const std::string&>()); break;
    case Type::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& item : value) {
        if (!first) out += ", ";
        first = false;
        append_python_json(out, item);
      }
      out.push_back(']');
      break;
    }
    case Type::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        append_python_json_string(out, key);
        out += ": ";
        append_python_json(out, item);
      }
      out.push_back('}');
      break;
    }
    case Type::binary:
    case Type::discarded:
      throw Error("cannot write a binary or discarded JSON value as text");
  }
}

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  append_python_json(out, value);
  return out;
}

}  // namespace di
