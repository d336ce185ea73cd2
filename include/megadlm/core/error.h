// Errors: library code never exits; it throws megadlm::Error with what failed, where, and
// (for user input) what would be valid. Programs in apps/ catch it and exit with code 2.
#pragma once
#include <stdexcept>
#include <string>
#include <sstream>

namespace megadlm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// The one cold function every check funnels into (adds file:line).
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace megadlm

/// MDLM_CHECK(cond, parts...): throws megadlm::Error("file:line: parts...") when cond is false.
#define MDLM_CHECK(cond, ...)                                                           \
  do {                                                                                  \
    if (__builtin_expect(!(cond), 0))                                                           \
      ::megadlm::throw_error(__FILE__, __LINE__,                                        \
                             ::megadlm::detail::concat("check failed: " #cond ": ", __VA_ARGS__)); \
  } while (0)

/// MDLM_FAIL(parts...): unconditional error.
#define MDLM_FAIL(...) ::megadlm::throw_error(__FILE__, __LINE__, ::megadlm::detail::concat(__VA_ARGS__))
