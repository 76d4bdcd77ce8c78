#pragma once
// Measurement switches: an optimisation stays on unless its DEEPINFER_* variable is "0" (A/B runs).
#include <cstdlib>
#include <string_view>

namespace di {

inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::string_view(v) != "0";
}

}  // namespace di
