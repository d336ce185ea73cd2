// One run per checkpoint directory. Two runs saving into one folder overwrite each other's
// checkpoints and "latest" pointer (the second used to die later on a hash mismatch, or not at
// all). A run takes DIR/megadlm.lock before it saves there: the file names its holder (pid,
// host, process start time, when). A second run refuses at start-up, naming the holder; a lock
// left by a process that no longer exists on this host (a crash, kill -9) is taken over with a
// warning. A lock from another host cannot be checked from here and is never taken over.
#pragma once
#include <string>

namespace megadlm::checkpoint {

inline constexpr const char* kLockFileName = "megadlm.lock";

class DirectoryLock {
 public:
  /// Takes DIR/megadlm.lock (creating DIR). Throws megadlm::Error naming the holder when another
  /// live process holds it. `warning` receives a message when a stale lock was taken over.
  DirectoryLock(const std::string& dir, const std::string& flag, std::string* warning = nullptr);
  /// Removes the lock file if it is still this process's.
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string content_;  ///< what this process wrote: removed only if unchanged
};

}  // namespace megadlm::checkpoint
