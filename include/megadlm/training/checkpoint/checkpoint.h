// Writing and reading megadlm checkpoints (format.h, docs/checkpoints.md) from any number of
// ranks, with the safety the format promises:
//   * a save writes into DIR/<tag>.incomplete/, each rank its own files, each file fsynced and
//     read back against the SHA-256 computed while writing; rank 0 then checks every file's size,
//     that the pieces of every tensor add up to the whole tensor, writes metadata.json, renames
//     the directory into place (atomically replacing an older one of the same name where the
//     file system can), and only then rewrites latest_checkpointed_iteration.txt (temporary file
//     + rename). A crash at any point leaves "latest" naming a complete checkpoint.
//   * an asynchronous save copies the pieces to host memory at the save point, writes them on a
//     background thread, and commits at a later iteration boundary when every rank has finished
//     (poll(), a collective); a second save waits for the first.
//   * a load verifies sizes and checksums of the files it needs (spread over the ranks) before it
//     returns a byte, and any rank's failure becomes every rank's error (agree()).
// Collective functions take the world communicator (null: a single process) and must be called
// by every rank in the same order.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/training/checkpoint/format.h"

namespace megadlm::checkpoint {

class SafetensorsFile;

/// Collective over `comm`: each rank passes its error ("" = none). When any rank failed, every
/// rank throws the same Error: `what`, the lowest failing world rank and its message.
void agree(comm::Communicator* comm, const Stream& stream, const std::string& error,
           const std::string& what);

/// One piece this rank stores: region.numel() elements of `dtype` at `data` (host memory).
struct OutgoingPiece {
  std::string tensor;  ///< full name: kModelPrefix + parameter name, ...
  Shape global_shape;
  Region region;
  DType dtype = DType::F32;
  const void* data = nullptr;
  bool optimizer = false;  ///< stored in optim_rank*.safetensors (else model_rank*)
};

class CheckpointWriter {
 public:
  /// `world`: every rank of the job (null: one process). `stream`: where the agreement
  /// collectives run (the trainer's stream; any stream of the communicator's device).
  CheckpointWriter(std::shared_ptr<comm::Communicator> world, Stream stream);
  /// Joins a background write without committing it (its directory stays *.incomplete).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Collective. Saves `pieces` (this rank's; may be empty) and `state` as DIR/<tag>, where tag
  /// is an iteration number or "release". `keep_alive` owns the memory the pieces point to
  /// until the files are written. Synchronous: returns when committed (or throws on every
  /// rank). Asynchronous: returns once the write has started; poll()/wait() commit it. A
  /// previous asynchronous save is waited for and committed first. `after_commit` (optional)
  /// runs on rank 0 once this save is committed and every rank knows it (wherever the commit
  /// happens: here, poll(), wait() or the next save); it must not throw.
  void save(const std::string& dir, const std::string& tag, const CheckpointState& state,
            std::vector<OutgoingPiece> pieces, std::shared_ptr<const void> keep_alive, bool async,
            std::function<void()> after_commit = nullptr);

  bool pending() const;
  /// Collective, at a point every rank reaches (an iteration boundary): commits the background
  /// save when every rank has finished writing. True when it committed.
  bool poll();
  /// Collective: waits for the background save and commits it (no-op when none is pending).
  void wait();
  /// The directory of the last committed save ("" before the first).
  const std::string& last_committed() const { return last_committed_; }
  /// Target size of one file (default 1 GiB): a rank's model and optimizer pieces are spread
  /// over files of about this size, written and hashed in parallel. Whole pieces: a larger
  /// piece gets a file of its own.
  void set_target_file_bytes(uint64_t bytes);
  static constexpr uint64_t kDefaultFileBytes = uint64_t{1} << 30;

 private:
  struct Job;
  void finish(Job& job);

  std::shared_ptr<comm::Communicator> world_;
  Stream stream_;
  int rank_ = 0;
  uint64_t file_bytes_ = kDefaultFileBytes;
  std::unique_ptr<Job> job_;
  std::string last_committed_;
};

/// The iteration directory to load from DIR: DIR/iter_<step> with `step`, else what
/// latest_checkpointed_iteration.txt names; nullopt when DIR holds no checkpoint at all. Throws
/// when latest names a directory that does not exist, and when there is no latest file but
/// complete iter_* checkpoints are there (a lost or deleted pointer must not turn a resume into
/// a fresh run that overwrites them): the error lists them and names --ckpt-step.
std::optional<std::string> find_checkpoint(const std::string& dir, std::optional<int64_t> step);

/// The iterations of the complete checkpoints in DIR (iter_* directories holding an index;
/// interrupted saves, *.incomplete, are not), ascending. Empty when DIR does not exist.
std::vector<int64_t> list_checkpoint_iterations(const std::string& dir);

/// Rolling (non-persistent) checkpoints: removes every iter_* checkpoint of DIR except the one
/// of `keep_tag` and the one latest_checkpointed_iteration.txt names, and the leftovers of an
/// interrupted removal. Each directory is first renamed to <name>.removing and then deleted, so a
/// crash half-way leaves no partial iter_* behind. Call on one rank, after the commit of
/// `keep_tag`. Returns the removed checkpoint directories; throws on a file-system error.
std::vector<std::string> remove_older_checkpoints(const std::string& dir, const std::string& keep_tag);

/// Retention (--keep-last-n-checkpoints): removes the complete iter_* checkpoints of DIR beyond
/// the `keep` newest by iteration (keep >= 1), never the one latest_checkpointed_iteration.txt
/// names, never one of `protect` (directory names, e.g. "iter_0000010": the checkpoint a run
/// was loaded from), never release/ or a directory without an index. With `trajectory`, only
/// the checkpoints of that trajectory (CheckpointState::trajectory) are ranked and removed: a
/// run never removes another trajectory's checkpoints, nor lets them push its own out. Same
/// removal protocol as above; call on one rank after a commit. Returns the removed directories.
std::vector<std::string> remove_checkpoints_beyond(const std::string& dir, int64_t keep,
                                                   const std::optional<std::string>& trajectory = std::nullopt,
                                                   const std::vector<std::string>& protect = {});

/// The trajectory an iteration directory's index records ("" when it records none: written
/// before trajectories existed); nullopt when the index cannot be read.
std::optional<std::string> read_trajectory(const std::string& checkpoint_dir);

/// An opened checkpoint directory: the index is read and checked; files are opened on use.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string dir);
  ~CheckpointReader();

  const std::string& dir() const { return dir_; }
  const CheckpointIndex& index() const { return index_; }
  bool has_tensor(const std::string& name) const { return index_.tensors.count(name) != 0; }
  /// Names of the files holding pieces of tensors whose names start with one of `prefixes`.
  std::vector<std::string> files_with(const std::vector<std::string>& prefixes) const;
  /// Throws naming the file when it is missing, has another size than the index says
  /// ("truncated"), or another SHA-256 (expected vs actual).
  void verify_file(const std::string& name) const;
  /// Collective: verifies `files`, file i on rank i % world size, and agrees on the outcome.
  void verify_files(const std::vector<std::string>& files, comm::Communicator* world,
                    const Stream& stream) const;

  /// Fills host tensor `dst` (region.numel() elements, any floating dtype) with `region` of
  /// tensor `name`. Throws naming the tensor when the checkpoint lacks it, stores another global
  /// shape, or its pieces do not cover the region.
  void read(const std::string& name, const Shape& global_shape, const Region& region, Tensor& dst) const;
  /// The whole tensor, in its stored dtype (host).
  Tensor read_whole(const std::string& name) const;

 private:
  const SafetensorsFile& file(const std::string& name) const;

  std::string dir_;
  CheckpointIndex index_;
  mutable std::mutex files_mutex_;
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
};

}  // namespace megadlm::checkpoint
