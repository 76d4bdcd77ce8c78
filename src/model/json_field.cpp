#include "model/json_field.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace di {

nlohmann::json parse_json_text(std::string_view text, const std::string& file) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(file + ": not valid JSON (byte " + std::to_string(e.byte) + "): " + e.what());
  } catch (const nlohmann::json::exception& e) {  // e.g. out_of_range for a number beyond double
    throw Error(file + ": not valid JSON: " + e.what());
  }
}

std::string read_text_file(const std::string& path, uint64_t max_bytes) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw Error(path + ": missing or not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open file");
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  if (size < 0) throw Error(path + ": cannot read file size");
  if (static_cast<uint64_t>(size) > max_bytes) {
    throw Error(path + ": file is " + std::to_string(size) + " bytes, expected at most " +
                std::to_string(max_bytes));
  }
  in.seekg(0, std::ios::beg);
  std::string text(static_cast<size_t>(size), '\0');
  if (size > 0 && !in.read(text.data(), size)) throw Error(path + ": read failed");
  return text;
}

std::string describe_json(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::array:
      return "an array of " + std::to_string(v.size()) + " elements";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::string: {
      // Cutting may split a UTF-8 sequence: dump with replacement instead of throwing.
      const std::string& s = v.get_ref<const std::string&>();
      const auto replace = nlohmann::json::error_handler_t::replace;
      if (s.size() > 60) return nlohmann::json(s.substr(0, 60)).dump(-1, ' ', false, replace) + "...";
      return v.dump(-1, ' ', false, replace);
    }
    default:
      return v.dump();  // scalar: short
  }
}

std::string int_range_text(int64_t lo, int64_t hi) {
  return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::string number_range_text(double lo, double hi) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "a number in [%g, %g]", lo, hi);
  return buf;
}

JsonObject::JsonObject(const nlohmann::json& value, std::string file, std::string path)
    : value_(&value), file_(std::move(file)), path_(std::move(path)) {
  if (!value.is_object()) {
    throw Error(file_ + ": " + (path_.empty() ? std::string("top level") : "field '" + path_ + "'") +
                " is " + describe_json(value) + ", expected a JSON object");
  }
}

std::string JsonObject::field_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

const nlohmann::json* JsonObject::find(std::string_view key) const {
  auto it = value_->find(key);
  if (it == value_->end() || it->is_null()) return nullptr;
  return &*it;
}

bool JsonObject::has(std::string_view key) const { return find(key) != nullptr; }

void JsonObject::fail(std::string_view key, const std::string& expected) const {
  const nlohmann::json* v = find(key);
  if (!v) throw Error(file_ + ": missing field '" + field_path(key) + "' (expected " + expected + ")");
  throw Error(file_ + ": field '" + field_path(key) + "' = " + describe_json(*v) + ": expected " +
              expected);
}

namespace {

// Integer JSON value (no fractional numbers, no bools) that fits int64.
std::optional<int64_t> as_int(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

}  // namespace

int64_t JsonObject::get_int(std::string_view key, int64_t lo, int64_t hi) const {
  const nlohmann::json* v = find(key);
  std::optional<int64_t> i = v ? as_int(*v) : std::nullopt;
  if (!i || *i < lo || *i > hi) fail(key, int_range_text(lo, hi));
  return *i;
}

double JsonObject::get_number(std::string_view key, double lo, double hi) const {
  const nlohmann::json* v = find(key);
  if (!v || !v->is_number()) fail(key, number_range_text(lo, hi));
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) fail(key, number_range_text(lo, hi));
  return d;
}

bool JsonObject::get_bool(std::string_view key) const {
  const nlohmann::json* v = find(key);
  if (!v || !v->is_boolean()) fail(key, "true or false");
  return v->get<bool>();
}

std::string JsonObject::get_string(std::string_view key) const {
  const nlohmann::json* v = find(key);
  if (!v || !v->is_string()) fail(key, "a string");
  return v->get<std::string>();
}

std::vector<int64_t> JsonObject::get_int_list(std::string_view key, int64_t lo, int64_t hi,
                                              size_t max_len) const {
  const nlohmann::json* v = find(key);
  std::string expected = "a list of at most " + std::to_string(max_len) + " integers in [" +
                         std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!v || !v->is_array() || v->size() > max_len) fail(key, expected);
  std::vector<int64_t> out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    std::optional<int64_t> x = as_int((*v)[i]);
    if (!x || *x < lo || *x > hi) {
      throw Error(file_ + ": field '" + field_path(key) + "[" + std::to_string(i) +
                  "]' = " + describe_json((*v)[i]) + ": expected " + int_range_text(lo, hi));
    }
    out.push_back(*x);
  }
  return out;
}

std::vector<std::string> JsonObject::get_string_list(std::string_view key, size_t max_len) const {
  const nlohmann::json* v = find(key);
  std::string expected = "a list of at most " + std::to_string(max_len) + " strings";
  if (!v || !v->is_array() || v->size() > max_len) fail(key, expected);
  std::vector<std::string> out;
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string()) {
      throw Error(file_ + ": field '" + field_path(key) + "[" + std::to_string(i) +
                  "]' = " + describe_json((*v)[i]) + ": expected a string");
    }
    out.push_back((*v)[i].get<std::string>());
  }
  return out;
}

JsonObject JsonObject::get_object(std::string_view key) const {
  const nlohmann::json* v = find(key);
  if (!v || !v->is_object()) fail(key, "a JSON object");
  return JsonObject(*v, file_, field_path(key));
}

}  // namespace di
