// The logging flags -> LoggingConfig, and rule M-20 (see logging_rules.h).
#include "training/arguments/logging_rules.h"
#include <filesystem>

namespace megadlm::training::detail {

namespace {

logging::Level level_named(const std::string& name) {
  if (name == "trace") return logging::Level::Trace;
  if (name == "debug") return logging::Level::Debug;
  if (name == "warning") return logging::Level::Warning;
  if (name == "error") return logging::Level::Error;
  return logging::Level::Info;  // the table's choices guarantee one of the five
}

}  // namespace

logging::Level level_of_python_logging_level(int64_t python_level) {
  if (python_level <= 10) return logging::Level::Debug;
  if (python_level <= 20) return logging::Level::Info;
  if (python_level <= 30) return logging::Level::Warning;
  return logging::Level::Error;
}

void check_logging(const ArgState& a, Diagnostics& d) {
  if (a.was_given("log_level") && a.is_set("logging_level")) {
    const logging::Level from_python = level_of_python_logging_level(a.i("logging_level"));
    if (from_python != level_named(a.s("log_level")))
      d.error("M-20", "give one of " + a.flag_value("log_level") + " and " +
                          a.flag_value("logging_level") + " (that Python level means `--log-level " +
                          logging::level_name(from_python) + "`)");
  }
  // M-26: a profiled range that holds no step would silently profile nothing.
  if (a.b("profile")) {
    if (a.i("profile_step_start") < 0 || a.i("profile_step_end") <= a.i("profile_step_start"))
      d.error("M-26", "`--profile` profiles the steps after " + a.flag_value("profile_step_start") +
                          " completed iterations up to " + a.flag_value("profile_step_end") +
                          ": give 0 <= start < end");
    for (int64_t r : a.ints("profile_ranks"))
      if (r < 0) d.error("M-26", a.flag_value("profile_ranks") + " holds a negative rank; give global ranks >= 0");
  }
  const std::string dir = a.s("log_dir");
  std::error_code ec;
  if (!dir.empty() && std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec))
    d.error("M-20", a.flag_value("log_dir") + " is a file; give a directory (it is created when missing)");
}

LoggingConfig build_logging_config(const ArgState& a) {
  LoggingConfig c;
  c.level = a.is_set("logging_level") && !a.was_given("log_level")
                ? level_of_python_logging_level(a.i("logging_level"))
                : level_named(a.s("log_level"));
  c.all_ranks = a.b("log_all_ranks");
  c.dir = a.s("log_dir");
  return c;
}

}  // namespace megadlm::training::detail
