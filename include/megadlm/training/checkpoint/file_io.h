// POSIX file helpers with the durability checkpoints need: complete writes (EINTR and short
// writes retried), fsync of files and of the directories that name them, atomic replacement
// (write a temporary, fsync, rename, fsync the directory), and reads that name the file and say
// "truncated" when fewer bytes exist than the caller was promised. Every error names the path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include "megadlm/training/checkpoint/sha256.h"

namespace megadlm::checkpoint {

/// A file being written from the start; every byte written is hashed (SHA-256).
class OutputFile {
 public:
  /// Creates (or truncates) `path`.
  explicit OutputFile(std::string path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t bytes);
  /// fsync and close; returns the SHA-256 of everything written.
  std::string finish();
  uint64_t bytes() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  static constexpr size_t kChunkBytes = size_t{64} << 20;
  void start_writeback();

  std::string path_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  uint64_t flushed_ = 0;  ///< bytes handed to the kernel's writeback so far
  Sha256 hash_;
};

/// A file read at arbitrary offsets (pread), opened once.
class InputFile {
 public:
  explicit InputFile(std::string path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// Reads exactly `bytes` bytes at `offset`; throws "truncated" naming the file otherwise.
  void read(uint64_t offset, void* dst, size_t bytes) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// fsync of a directory, so that renames and creations inside it survive a crash.
void fsync_directory(const std::string& dir);
/// Replaces `path` by a file holding `content`, atomically: a reader sees the old or the new
/// content, never a mix, even across a crash.
void write_file_atomic(const std::string& path, const std::string& content);
/// The whole file as a string; throws naming the file.
std::string read_text_file(const std::string& path);
/// Size in bytes, or -1 when the file does not exist.
int64_t file_size_or_missing(const std::string& path);

/// Runs task(0..n-1) on up to `max_threads` threads (this one included) and, once all have
/// finished, throws the error of the lowest-numbered task that failed. Checkpoint files are
/// written, hashed and read concurrently: one thread hashes (SHA-256) at 1-2 GB/s, below what a
/// node's disks take, so one file at a time leaves the disk idle.
void run_io_tasks(size_t n, const std::function<void(size_t)>& task, size_t max_threads = 8);

}  // namespace megadlm::checkpoint
