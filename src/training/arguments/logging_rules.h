// Internal to training/: the logging flags (--log-level, --logging-level, --log-all-ranks,
// --log-dir; rule M-20) resolved into LoggingConfig. Called by parse_arguments after the other
// rules (argument_rules.cpp), so that this concern stays in one small file.
#pragma once
#include <cstdint>
#include "training/arguments/argument_state.h"

namespace megadlm::training::detail {

/// Megatron's --logging-level (a Python logging level) as a megadlm level: Python writes a
/// message when its level (DEBUG 10, INFO 20, WARNING 30, ERROR 40) is at least the threshold,
/// so 10 or below shows debug, 11..20 info, 21..30 warnings, anything higher errors only.
logging::Level level_of_python_logging_level(int64_t python_level);

/// M-20: one source of the level (--log-level and --logging-level may both be given only when
/// they agree), and --log-dir is not an existing file.
void check_logging(const ArgState& args, Diagnostics& diag);

/// The typed logging settings (call when check_logging found no error).
LoggingConfig build_logging_config(const ArgState& args);

}  // namespace megadlm::training::detail
