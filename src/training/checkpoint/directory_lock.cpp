// checkpoint/directory_lock.h. The lock file is created complete or not at all: its content is
// written to a private temporary file that is then hard-linked to the lock name (link() fails
// atomically when the name exists), so a crash never leaves a half-written lock. Liveness on the
// same host: kill(pid, 0), and the process start time from /proc/<pid>/stat, so that a reused
// pid is not mistaken for the holder.
#include "megadlm/training/checkpoint/directory_lock.h"
#include <signal.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>
#include "megadlm/core/error.h"
#include "megadlm/training/checkpoint/file_io.h"

namespace megadlm::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string this_host() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

// Fields of /proc/<pid>/stat after the command name: 3 is the state, 22 the start time (clock
// ticks since boot; with the pid, it names one process). Empty when there is no such process.
std::string stat_field(long pid, int field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return "";
  const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return "";
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  for (int i = 3; fields >> f; ++i)
    if (i == field) return f;
  return "";
}

std::string process_start_time(long pid) { return stat_field(pid, 22); }

// A process that has exited but not been reaped yet (a zombie, e.g. a killed rank whose
// launcher is gone) still answers kill(pid, 0): it holds nothing any more.
bool running(long pid) {
  if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM)) return false;
  const std::string state = stat_field(pid, 3);
  return state != "Z" && state != "X";
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& flag, std::string* warning) {
  fs::create_directories(dir);
  path_ = (fs::path(dir) / kLockFileName).string();
  const long pid = static_cast<long>(::getpid());
  const std::string host = this_host();
  nlohmann::ordered_json me = {{"pid", pid}, {"host", host}, {"start_time", process_start_time(pid)},
                               {"since", now_text()}, {"program", "megadlm"}};
  content_ = me.dump() + "\n";
  const std::string tmp = path_ + ".tmp-" + host + "-" + std::to_string(pid);
  write_file_atomic(tmp, content_);
  for (int attempt = 0;; ++attempt) {
    if (::link(tmp.c_str(), path_.c_str()) == 0) break;
    const int err = errno;
    if (err != EEXIST) {
      ::unlink(tmp.c_str());
      MDLM_FAIL(flag, " ", dir, ": cannot create the lock file ", path_, ": ", std::strerror(err));
    }
    // Someone holds (or held) it.
    const std::string held = read_all(path_);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(held);
    } catch (const std::exception&) {
      ::unlink(tmp.c_str());
      MDLM_FAIL(flag, " ", dir, ": the lock file ", path_, " is not megadlm's (", held.size(),
                " bytes that are not its JSON); if no run uses this directory, remove it");
    }
    const long other = j.value("pid", 0L);
    const std::string other_host = j.value("host", std::string("?"));
    const std::string since = j.value("since", std::string("?"));
    const std::string holder = "pid " + std::to_string(other) + " on host " + other_host + " (since " + since + ")";
    bool alive = true;
    if (other_host == host)
      alive = running(other) && process_start_time(other) == j.value("start_time", std::string());
    if (alive || attempt > 0) {
      ::unlink(tmp.c_str());
      MDLM_FAIL(flag, " ", dir, " is in use by another run: ", holder, " holds ", path_,
                other == pid && other_host == host ? " (this process: a second trainer saving to the same directory)" : "",
                ". Two runs saving into one directory overwrite each other's checkpoints; give this "
                "run another directory, or wait for that one to end",
                other_host == host ? "" : " (if it is gone, e.g. its node crashed, remove the lock file)");
    }
    // A dead holder on this host: replace its lock (rename is atomic) and check that we won.
    fs::rename(tmp, path_);
    write_file_atomic(tmp, content_);
    if (warning)
      *warning = "took over the lock " + path_ + " of " + holder +
                 ", a process that no longer runs (it ended without releasing it: a crash or kill -9)";
    if (read_all(path_) == content_) break;
  }
  ::unlink(tmp.c_str());
  fsync_directory(dir);
}

DirectoryLock::~DirectoryLock() {
  // Only our own lock: a stale-lock takeover by another run must not be undone by us.
  if (read_all(path_) == content_) ::unlink(path_.c_str());
}

}  // namespace megadlm::checkpoint
