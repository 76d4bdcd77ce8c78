#pragma once
// Measurement switches: an optimisation stays on unless its DEEPINFER_* variable is "0" (A/B runs); a measuring
// mode stays off unless its variable is "1".
#include <cstdlib>
#include <string_view>

namespace di {

inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::string_view(v) != "0";
}

inline bool env_opt_in(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string_view(v) == "1";
}

// A measuring count: `fallback` unless the variable holds a whole number >= 0.
inline int env_count(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' && n >= 0 && n < (1 << 20) ? static_cast<int>(n) : fallback;
}

}  // namespace di
