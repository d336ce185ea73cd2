#include "megadlm/training/checkpoint/file_io.h"
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <thread>
#include <vector>
#include "megadlm/core/error.h"

namespace megadlm::checkpoint {

namespace {
std::string os_error() { return std::strerror(errno); }
}  // namespace

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) MDLM_FAIL("cannot create ", path_, ": ", os_error());
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputFile::write(const void* data, size_t bytes) {
  MDLM_CHECK(fd_ >= 0, "write to ", path_, " after finish()");
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // Hash and write in chunks, so that the data is still in cache when it is written.
    const size_t chunk = std::min(bytes, kChunkBytes);
    hash_.update(p, chunk);
    for (size_t done = 0; done < chunk;) {
      const ssize_t n = ::write(fd_, p + done, chunk - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) MDLM_FAIL("cannot write ", path_, " (", bytes_ + done, " bytes written so far): ", os_error());
      done += static_cast<size_t>(n);
    }
    p += chunk;
    bytes -= chunk;
    bytes_ += chunk;
    start_writeback();
  }
}

void OutputFile::start_writeback() {
#ifdef __linux__
  // Without this the kernel holds dirty pages until fsync, and the disk idles while we hash
  // and copy: start writing each finished chunk now (asynchronously; fsync still waits for all).
  if (bytes_ - flushed_ >= kChunkBytes) {
    ::sync_file_range(fd_, static_cast<off_t>(flushed_), static_cast<off_t>(bytes_ - flushed_),
                      SYNC_FILE_RANGE_WRITE);
    flushed_ = bytes_;
  }
#endif
}

std::string OutputFile::finish() {
  MDLM_CHECK(fd_ >= 0, "finish() twice on ", path_);
  if (::fsync(fd_) != 0) MDLM_FAIL("cannot fsync ", path_, ": ", os_error());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) MDLM_FAIL("cannot close ", path_, ": ", os_error());
  return hash_.hex_digest();
}

InputFile::InputFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) MDLM_FAIL("cannot open ", path_, ": ", os_error());
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const std::string err = os_error();
    ::close(fd_);
    MDLM_FAIL("cannot stat ", path_, ": ", err);
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read(uint64_t offset, void* dst, size_t bytes) const {
  if (offset + bytes > size_)
    MDLM_FAIL(path_, " is truncated: reading bytes [", offset, ", ", offset + bytes,
              ") but the file holds ", size_);
  auto* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, std::min<size_t>(bytes, size_t{1} << 30),
                              static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) MDLM_FAIL("cannot read ", path_, " at byte ", offset, ": ", os_error());
    if (n == 0) MDLM_FAIL(path_, " is truncated: it ends at byte ", offset);
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) MDLM_FAIL("cannot open directory ", dir, " to fsync it: ", os_error());
  const int rc = ::fsync(fd);
  const std::string err = rc != 0 ? os_error() : std::string();
  ::close(fd);
  // Some file systems (and /proc-like mounts) refuse fsync on directories: nothing to do then.
  if (rc != 0 && err != std::strerror(EINVAL)) MDLM_FAIL("cannot fsync directory ", dir, ": ", err);
}

void write_file_atomic(const std::string& path, const std::string& content) {
  const std::filesystem::path p(path);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    OutputFile f(tmp);
    f.write(content.data(), content.size());
    f.finish();
  }
  std::error_code ec;
  std::filesystem::rename(tmp, p, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    MDLM_FAIL("cannot rename ", tmp, " to ", path, ": ", ec.message());
  }
  fsync_directory(p.parent_path().empty() ? "." : p.parent_path().string());
}

std::string read_text_file(const std::string& path) {
  InputFile f(path);
  std::string s(static_cast<size_t>(f.size()), '\0');
  if (!s.empty()) f.read(0, s.data(), s.size());
  return s;
}

int64_t file_size_or_missing(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_size);
}

void run_io_tasks(size_t n, const std::function<void(size_t)>& task, size_t max_threads) {
  std::vector<std::exception_ptr> errors(n);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        task(i);
      } catch (...) {
        errors[i] = std::current_exception();  // rethrown as it was: type and message intact
      }
    }
  };
  const size_t threads =
      std::min({n, std::max<size_t>(1, max_threads), std::max<size_t>(2, std::thread::hardware_concurrency())});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace megadlm::checkpoint
