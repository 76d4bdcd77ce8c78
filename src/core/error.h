// Errors. Two kinds, never mixed:
//  - di::Error: a recoverable failure caused by input (a bad file, field, value or request). The
//    message names the file/field/value and what was expected. Thrown inside the library, caught at
//    the boundaries (CLI command, request submission) so a bad request fails alone.
//  - DI_CHECK: an invariant of our own code is broken. Aborts loudly with file:line.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace di {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

[[noreturn]] inline void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "DI_CHECK failed at %s:%d: %s %s\n", file, line, expr, msg.c_str());
  std::abort();
}

}  // namespace di

#define DI_CHECK(cond)                                                  \
  do {                                                                  \
    if (!(cond)) ::di::check_failed(#cond, __FILE__, __LINE__, "");     \
  } while (0)

#define DI_CHECK_MSG(cond, msg)                                         \
  do {                                                                  \
    if (!(cond)) ::di::check_failed(#cond, __FILE__, __LINE__, (msg));  \
  } while (0)
