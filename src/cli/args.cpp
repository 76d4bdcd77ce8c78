#include "cli/args.h"

#include <cerrno>
#include <cstdlib>

#include "core/error.h"

namespace di::cli {

Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& value_options,
           const std::set<std::string>& flag_options) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0) throw Error("unexpected argument '" + a + "' (options start with --)");
    std::string name = a.substr(2);
    std::string value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    if (flag_options.count(name)) {
      if (inline_value) throw Error("option --" + name + " takes no value");
      flags_.insert(name);
    } else if (value_options.count(name)) {
      if (!inline_value) {
        if (i + 1 >= argv.size()) throw Error("option --" + name + " needs a value");
        value = argv[++i];
      }
      values_[name] = value;
    } else {
      throw Error("unknown option --" + name);
    }
  }
}

bool Args::has(const std::string& name) const { return values_.count(name) || flags_.count(name); }

std::string Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw Error("missing required option --" + name);
  return it->second;
}

std::string Args::get_or(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::optional<std::string> Args::get_opt(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

long long Args::get_int_or(const std::string& name, long long fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (errno || end == it->second.c_str() || *end)
    throw Error("option --" + name + ": expected an integer, got '" + it->second + "'");
  return v;
}

double Args::get_double_or(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(it->second.c_str(), &end);
  if (errno || end == it->second.c_str() || *end)
    throw Error("option --" + name + ": expected a number, got '" + it->second + "'");
  return v;
}

bool Args::flag(const std::string& name) const { return flags_.count(name) > 0; }

std::vector<int> parse_int_list(const std::string& option, const std::string& text) {
  std::vector<int> out;
  if (text.empty()) return out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    errno = 0;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || errno || *end || v < 0 || v > 0x7fffffff)
      throw Error("option --" + option + ": expected comma-separated non-negative integers, got '" + item + "'");
    out.push_back(static_cast<int>(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace di::cli
