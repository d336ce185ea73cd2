// The logging API of core/logging.h on spdlog: a stderr sink whose level depends on the rank and
// --log-all-ranks, and an optional per-rank file sink. spdlog and fmt are used header-only and
// compiled with hidden visibility (src/CMakeLists.txt), so libmegadlm neither links nor exports
// them: a program with its own spdlog cannot clash with this one.
// The rank prefix and level tag are built here, not by an spdlog pattern, so that every line of
// a multi-line message (a ConfigError lists one problem per line) carries the rank.
// This file is compiled with hidden visibility; the API it defines keeps default visibility.
#pragma GCC visibility push(default)
#include "megadlm/core/logging.h"
#pragma GCC visibility pop
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <spdlog/logger.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace megadlm::logging {

namespace {

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::Trace: return spdlog::level::trace;
    case Level::Debug: return spdlog::level::debug;
    case Level::Info: return spdlog::level::info;
    case Level::Warning: return spdlog::level::warn;
    case Level::Error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

const char* tag(Level level) {
  switch (level) {
    case Level::Trace: return "trace: ";
    case Level::Debug: return "debug: ";
    case Level::Info: return "";
    case Level::Warning: return "WARNING: ";
    case Level::Error: return "error: ";
  }
  return "";
}

// Whether the console takes a message at `level` on this rank.
bool console_takes(const Options& o, Level level) {
  return o.rank == 0 || o.all_ranks || level >= Level::Error;
}

struct Logger {
  Options options;
  std::shared_ptr<spdlog::logger> sink;
  bool has_file = false;
};

std::shared_ptr<spdlog::logger> make_logger(const Options& o) {
  auto console = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  console->set_pattern("%v");
  console->set_level(to_spdlog(console_takes(o, Level::Trace) ? o.level : std::max(o.level, Level::Error)));
  std::vector<spdlog::sink_ptr> sinks = {console};
  if (!o.dir.empty()) {
    const std::filesystem::path dir(o.dir);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || !std::filesystem::is_directory(dir))
      throw Error("cannot create the log directory `" + o.dir + "`" +
                  (ec ? " (" + ec.message() + ")" : std::string(" (a file of that name exists)")));
    const std::string path = (dir / ("rank_" + std::to_string(o.rank) + ".log")).string();
    try {
      // Appended: a resumed run adds to the record of the run it continues.
      auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
      file->set_pattern("[%Y-%m-%d %H:%M:%S.%e] %v");
      file->set_level(to_spdlog(o.level));
      sinks.push_back(file);
    } catch (const spdlog::spdlog_ex& e) {
      throw Error("cannot open the log file `" + path + "`: " + e.what());
    }
  }
  auto logger = std::make_shared<spdlog::logger>("megadlm", sinks.begin(), sinks.end());
  logger->set_level(to_spdlog(o.level));
  // A sink that cannot write (a full disk under --log-dir) is said once, plainly, on stderr:
  // the console sink still takes every message, the file misses them from here on. (spdlog's
  // default prints "[*** LOG ERROR ***]" lines; this handler must not log, only print.)
  const std::string prefix = o.rank == 0 ? std::string() : "[rank " + std::to_string(o.rank) + "] ";
  auto said = std::make_shared<std::atomic<bool>>(false);
  logger->set_error_handler([prefix, said, dir = o.dir](const std::string& what) {
    if (said->exchange(true)) return;
    std::fprintf(stderr, "%sWARNING: --log-dir %s: %s; the log file misses the messages from here on (the "
                 "console still shows them)\n", prefix.c_str(), dir.c_str(), what.c_str());
    std::fflush(stderr);
  });
  logger->flush_on(spdlog::level::trace);  // messages are few; none may be lost in a crash
  return logger;
}

// The process's logger, created on first use with the defaults and never destroyed, so that a
// message written while static objects are torn down at exit still has somewhere to go (every
// message is flushed when written). The mutex also keeps the lines of one message together.
std::mutex& mutex() {
  static std::mutex* m = new std::mutex;
  return *m;
}

Logger& logger_locked() {
  static Logger* l = new Logger{Options{}, make_logger(Options{}), false};
  return *l;
}

}  // namespace

void configure(const Options& options) {
  std::shared_ptr<spdlog::logger> fresh = make_logger(options);  // may throw: keep the old one
  std::lock_guard<std::mutex> lock(mutex());
  Logger& l = logger_locked();
  l.sink->flush();
  l.options = options;
  l.sink = std::move(fresh);
  l.has_file = !options.dir.empty();
}

Options options() {
  std::lock_guard<std::mutex> lock(mutex());
  return logger_locked().options;
}

bool enabled(Level level) {
  std::lock_guard<std::mutex> lock(mutex());
  const Logger& l = logger_locked();
  return level >= l.options.level && (l.has_file || console_takes(l.options, level));
}

void write(Level level, std::string_view message) {
  // stdout (the record: the argument dump, the iteration lines) is block-buffered when it goes
  // to a file and stderr is not: with `> log 2>&1` a message would land in the middle of text
  // printed before it. Flushing first keeps the file in the order things happened, so its last
  // lines say what went wrong.
  std::cout.flush();
  std::fflush(stdout);
  std::lock_guard<std::mutex> lock(mutex());
  Logger& l = logger_locked();
  const std::string prefix = l.options.rank == 0 ? std::string() : "[rank " + std::to_string(l.options.rank) + "] ";
  const spdlog::level::level_enum lvl = to_spdlog(level);
  size_t start = 0;
  bool first = true;
  do {
    size_t end = message.find('\n', start);
    if (end == std::string_view::npos) end = message.size();
    std::string line = prefix;
    if (first) line += tag(level);
    line.append(message.substr(start, end - start));
    l.sink->log(lvl, spdlog::string_view_t(line.data(), line.size()));
    first = false;
    start = end + 1;
  } while (start < message.size());  // a trailing newline adds no empty line
}

void flush() {
  std::lock_guard<std::mutex> lock(mutex());
  logger_locked().sink->flush();
}

const char* level_name(Level level) {
  switch (level) {
    case Level::Trace: return "trace";
    case Level::Debug: return "debug";
    case Level::Info: return "info";
    case Level::Warning: return "warning";
    case Level::Error: return "error";
  }
  return "?";
}

}  // namespace megadlm::logging
