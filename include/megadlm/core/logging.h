// Diagnostic messages of the library and the programs: levels, the rank prefix, rank-0-only by
// default, optional per-rank files. Backed by spdlog inside src/core/logging.cpp; this header has
// no third-party include, so code linking libmegadlm needs neither spdlog nor fmt.
// Not for Megatron's record (the argument dump, iteration lines, checkpoint lines): the Trainer
// writes that verbatim to the std::ostream it is given, which users and tests parse.
//
// Where messages go (configure() sets it; before that: rank 0, level info, console only):
//   console = stderr. Rank 0 writes every message at or above the level; other ranks write only
//             errors, unless `all_ranks` (then every rank writes, each line from rank r != 0
//             starting with "[rank r] ").
//   files   = with a non-empty `dir`, every rank also appends its messages at or above the level
//             to <dir>/rank_<r>.log, each line after a timestamp.
// Line format: "[rank r] " (ranks other than 0) + a tag ("trace: ", "debug: ", "" for info,
// "WARNING: ", "error: ") + the message; further lines of a multi-line message carry the rank
// prefix only.
// One logger per process (the one process-wide state of core, like stderr itself); thread-safe.
#pragma once
#include <string>
#include <string_view>
#include "megadlm/core/error.h"

namespace megadlm::logging {

enum class Level { Trace, Debug, Info, Warning, Error };

struct Options {
  Level level = Level::Info;  ///< messages below this level are dropped everywhere
  int rank = 0;               ///< global rank, from comm/bootstrap (the prefix of every line)
  bool all_ranks = false;     ///< every rank writes to the console, not only rank 0
  std::string dir;            ///< "" = no files; else <dir>/rank_<rank>.log (created, appended)
};

/// Replaces the process's logging setup. Creates `dir` when needed; throws megadlm::Error naming
/// the path when the directory or the file cannot be opened (the previous setup then stays).
void configure(const Options& options);

/// The current setup.
Options options();

/// Whether a message at `level` would be written anywhere (to skip building expensive text).
bool enabled(Level level);

/// Writes one message (its own lines; no trailing newline needed).
void write(Level level, std::string_view message);

/// Flushes the console and the file (every message is flushed already; for abort paths).
void flush();

/// "trace", "debug", "info", "warning", "error".
const char* level_name(Level level);

/// logging::warn("could not remove ", dir, ": ", e.what()): the parts are streamed into one message,
/// only when the level is enabled.
template <typename... Parts>
void trace(const Parts&... parts) {
  if (enabled(Level::Trace)) write(Level::Trace, ::megadlm::detail::concat(parts...));
}
template <typename... Parts>
void debug(const Parts&... parts) {
  if (enabled(Level::Debug)) write(Level::Debug, ::megadlm::detail::concat(parts...));
}
template <typename... Parts>
void info(const Parts&... parts) {
  if (enabled(Level::Info)) write(Level::Info, ::megadlm::detail::concat(parts...));
}
template <typename... Parts>
void warn(const Parts&... parts) {
  if (enabled(Level::Warning)) write(Level::Warning, ::megadlm::detail::concat(parts...));
}
template <typename... Parts>
void error(const Parts&... parts) {
  if (enabled(Level::Error)) write(Level::Error, ::megadlm::detail::concat(parts...));
}

}  // namespace megadlm::logging
