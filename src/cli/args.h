// A small command-line parser for the `deepinfer` subcommands: `--name value` and `--flag` forms.
// Unknown options and missing values are di::Error naming the option.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace di::cli {

class Args {
 public:
  // value_options take a value; flag_options do not. argv excludes the program and subcommand name.
  Args(const std::vector<std::string>& argv, const std::set<std::string>& value_options,
       const std::set<std::string>& flag_options);

  bool has(const std::string& name) const;
  std::string get(const std::string& name) const;  // throws if absent
  std::string get_or(const std::string& name, const std::string& fallback) const;
  std::optional<std::string> get_opt(const std::string& name) const;
  long long get_int_or(const std::string& name, long long fallback) const;
  double get_double_or(const std::string& name, double fallback) const;
  bool flag(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
};

// Parses "0,5,9" into integers; names the option in errors.
std::vector<int> parse_int_list(const std::string& option, const std::string& text);

}  // namespace di::cli
