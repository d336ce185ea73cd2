#include "megadlm/core/error.h"

namespace megadlm {

void throw_error(const char* file, int line, const std::string& msg) {
  std::string f(file);
  // Keep paths short and stable: from "src/" or "include/" on.
  for (const char* root : {"/src/", "/include/", "/tests/", "/apps/"}) {
    auto pos = f.rfind(root);
    if (pos != std::string::npos) {
      f = f.substr(pos + 1);
      break;
    }
  }
  throw Error(msg + " [" + f + ":" + std::to_string(line) + "]");
}

}  // namespace megadlm
