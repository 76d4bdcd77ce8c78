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

}  // namespace di
