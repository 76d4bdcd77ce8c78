// Typed, checked access to fields of a parsed JSON object. Every failure is a di::Error that names
// the file, the field path, the value found and what was expected, e.g.
//   config.json: field 'text_config.hidden_size' = "5120": expected an integer in [1, 1048576]
// Values are described without recursion, so a hostile deeply nested document cannot overflow the
// stack while an error message is built.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace di {

// Parses JSON text; a syntax error becomes di::Error naming `file` and the byte offset.
nlohmann::json parse_json_text(std::string_view text, const std::string& file);

// Reads a whole (small) file; di::Error if missing, unreadable or larger than max_bytes.
std::string read_text_file(const std::string& path, uint64_t max_bytes);

// A short description of a value for error messages: scalars verbatim (long strings cut),
// containers as "an array of N elements" / "an object".
std::string describe_json(const nlohmann::json& value);

class JsonObject {
 public:
  // `value` must outlive this. `path` is the dotted prefix of its fields ("" for the root).
  // Throws if `value` is not an object.
  JsonObject(const nlohmann::json& value, std::string file, std::string path);

  const std::string& file() const { return file_; }
  std::string field_path(std::string_view key) const;
  bool has(std::string_view key) const;           // present and not null
  const nlohmann::json* find(std::string_view key) const;  // nullptr when absent or null

  [[noreturn]] void fail(std::string_view key, const std::string& expected) const;

  int64_t get_int(std::string_view key, int64_t lo, int64_t hi) const;
  double get_number(std::string_view key, double lo, double hi) const;
  bool get_bool(std::string_view key) const;
  std::string get_string(std::string_view key) const;
  std::vector<int64_t> get_int_list(std::string_view key, int64_t lo, int64_t hi,
                                    size_t max_len) const;
  std::vector<std::string> get_string_list(std::string_view key, size_t max_len) const;
  JsonObject get_object(std::string_view key) const;

 private:
  const nlohmann::json* value_;
  std::string file_;
  std::string path_;
};

std::string int_range_text(int64_t lo, int64_t hi);   // "an integer in [lo, hi]"
std::string number_range_text(double lo, double hi);  // "a number in [lo, hi]"

}  // namespace di
