// Small helpers the file-writing tests share: a scratch directory removed at scope exit, and the
// message of the megadlm::Error a call throws.
#pragma once
#include <stdlib.h>
#include <filesystem>
#include <string>
#include "megadlm/core/error.h"

namespace megadlm::test {

/// A fresh directory /tmp/<prefix>XXXXXX, removed with everything in it when this goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "megadlm_test_") {
    std::string tmpl = "/tmp/" + prefix + "XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) MDLM_FAIL("cannot create a scratch directory ", tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& str() const { return path_; }
  std::string operator/(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

 private:
  std::string path_;
};

/// What `fn()` throws as megadlm::Error, or "" when it returns.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace megadlm::test
