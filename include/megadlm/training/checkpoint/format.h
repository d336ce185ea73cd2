// The on-disk layout of a megadlm checkpoint (docs/checkpoints.md is the specification):
//
//   DIR/latest_checkpointed_iteration.txt   "100" (or "release"): written last, atomically
//   DIR/iter_0000100/metadata.json          the index: training state, run configuration, every
//                                           tensor (global name, global shape, pieces), every
//                                           file (size, SHA-256)
//   DIR/iter_0000100/model_rank00003.safetensors   the pieces world rank 3 wrote: model weights
//   DIR/iter_0000100/optim_rank00003.safetensors   ... and Adam moments
//   DIR/iter_0000100.incomplete/            a save in progress (never loaded)
//
// A piece is any subset of a global tensor that a box plus a flat range can describe: the box
// [offset, offset + extent) in every dimension (a tensor-parallel slice), and within it, in
// row-major order, the elements [begin, end) (a distributed-optimizer shard of that slice).
// Loading intersects the pieces on disk with the pieces a rank needs, so any layout loads any
// other. This header is that geometry plus the index; saving and loading are in checkpoint.h.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>
#include "megadlm/core/dtype.h"
#include "megadlm/core/tensor.h"

namespace megadlm::checkpoint {

inline constexpr const char* kFormatName = "megadlm-checkpoint";
inline constexpr int kFormatVersion = 1;
inline constexpr const char* kIndexFileName = "metadata.json";
/// The index's own checksum: SHA-256 of the index without this field (compact JSON, keys sorted).
inline constexpr const char* kIndexChecksumField = "index_sha256";
inline constexpr const char* kLatestFileName = "latest_checkpointed_iteration.txt";
inline constexpr const char* kReleaseDirName = "release";
inline constexpr const char* kIncompleteSuffix = ".incomplete";

/// Tensor-name prefixes of the three kinds of state ("model/decoder.layers.0....weight").
inline constexpr const char* kModelPrefix = "model/";
/// State of the model that is not a parameter: "moe_state/expert_bias/decoder.layers.{i}" (f32 [E]).
inline constexpr const char* kMoeStatePrefix = "moe_state/";
/// FP8 delayed-scaling state (docs/fp8.md): "fp8_state/<linear weight name>.{input,weight,
/// grad_output}" = f32 [history length + 1]: the amax history, then the scale. Layout-free names.
inline constexpr const char* kFp8StatePrefix = "fp8_state/";
inline constexpr const char* kExpAvgPrefix = "optimizer/exp_avg/";
inline constexpr const char* kExpAvgSqPrefix = "optimizer/exp_avg_sq/";

/// "iter_0000100" (Megatron's seven digits; more when the iteration needs them).
std::string iteration_dir_name(int64_t iteration);

/// The elements of a global tensor that one piece holds (see the file comment).
struct Region {
  Shape offset;  ///< box start, one entry per dimension of the global tensor
  Shape extent;  ///< box size per dimension
  int64_t begin = 0, end = 0;  ///< flat range inside the row-major box
  int64_t numel() const { return end - begin; }
  /// The whole of a tensor of `shape`.
  static Region whole(const Shape& shape);
  bool operator==(const Region&) const = default;
};

/// Throws (naming `what`) unless `r` lies inside a tensor of `global_shape`.
void validate_region(const Shape& global_shape, const Region& r, const std::string& what);

/// `count` elements consecutive both in a region's own flat order (starting at `local`) and in
/// the global tensor's row-major order (starting at `global`).
struct FlatRun {
  int64_t global = 0, local = 0, count = 0;
};
/// A region as runs, ascending in both orders; adjacent runs are merged, so a box that spans
/// whole trailing dimensions is one run.
std::vector<FlatRun> region_runs(const Shape& global_shape, const Region& r);

/// Elements a stored region and a wanted region share: `count` elements from the stored
/// piece's local position `src` to the wanted piece's local position `dst`.
struct Overlap {
  int64_t src = 0, dst = 0, count = 0;
};
std::vector<Overlap> intersect_runs(const std::vector<FlatRun>& stored, const std::vector<FlatRun>& wanted);

struct PieceInfo {
  std::string file;  ///< file name inside the checkpoint directory
  std::string key;   ///< safetensors key inside that file
  DType dtype = DType::F32;
  Region region;
};

struct TensorInfo {
  Shape shape;  ///< global shape
  std::vector<PieceInfo> pieces;
};

struct FileInfo {
  uint64_t bytes = 0;
  std::string sha256;
};

/// The scalar training state a checkpoint carries besides tensors.
struct CheckpointState {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;         ///< the data position: next sample index
  int64_t optimizer_steps = 0;          ///< Adam's step count (bias correction)
  int64_t skipped_iterations = 0, nan_iterations = 0;
  bool has_optimizer = false;           ///< Adam moments (and steps) are stored
  std::optional<uint64_t> rng_seed;     ///< the whole RNG state (absent with --no-save-rng)
  std::string run_config_json;          ///< checkpoint/config_json.h; "" when unknown
  std::vector<std::string> model_args;  ///< flags for --use-checkpoint-args
  std::string saved_under;              ///< the layout that wrote it (for people, not for loading)
  std::string created_by;               ///< program and version
  /// Which run history the checkpoint belongs to (docs/checkpoints.md, "Trajectories"): a fresh
  /// run draws one, a resume inherits its checkpoint's, a rewind to an older checkpoint (an
  /// explicit --ckpt-step below newer checkpoints of the folder) draws a new one. "" for
  /// checkpoints written before the field existed.
  std::string trajectory;
};

struct CheckpointIndex {
  CheckpointState state;
  std::map<std::string, TensorInfo> tensors;  ///< by full name ("model/...", "optimizer/...")
  std::map<std::string, FileInfo> files;      ///< by file name
  bool checksummed = false;  ///< parse() found and verified kIndexChecksumField (older indices have none)

  std::string to_json() const;
  /// Parses and checks the index: its checksum (kIndexChecksumField; indices written before it
  /// existed have none), known format and version, pieces inside their tensors and naming listed
  /// files. Throws naming `path`.
  static CheckpointIndex parse(const std::string& json, const std::string& path);
};

/// What latest_checkpointed_iteration.txt in `dir` names: "release", an iteration, or nullopt
/// when the file does not exist. Throws when it exists but is not one of those.
std::optional<std::string> read_latest(const std::string& dir);
/// The directory for an iteration or "release" below `dir`.
std::string checkpoint_dir(const std::string& dir, const std::string& tag);

}  // namespace megadlm::checkpoint
