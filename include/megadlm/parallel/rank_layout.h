// Which global ranks form each process group, exactly as Megatron-Core orders them
// (Megatron's RankGenerator). Pure computation on a ParallelConfig: no communicator,
// no globals, so a test can hold several layouts at once. Creating communicators from these lists
// is comm/'s job; validating user flags (with flag-named messages) is training/arguments'.
//
// The masked mixed-radix rule (RankGenerator)
// -------------------------------------------
// A generator has an order of dimensions, fastest first, e.g. "tp-cp-ep-dp-pp"; dimensions missing
// from the order must have size 1 and are appended in the fixed order tp, pp, dp, ep, cp.
// With sizes s_0..s_{n-1} and strides stride_i = s_0·…·s_{i-1}, a rank is the mixed-radix number
//     rank = Σ_i idx_i · stride_i,     idx_i ∈ [0, s_i).
// get_ranks("tp-pp") masks the named dimensions (M) and leaves the others unmasked (U), both kept
// in generator order. There are W / Π_{M} s_i groups; group g decomposes g mixed-radix over the
// sizes of U (first U dimension fastest), member j decomposes j over the sizes of M, and
//     member = Σ_{i∈M} m_i·stride_i + Σ_{i∈U} u_i·stride_i.
// Group order (g ascending) and member order (j ascending) are part of the contract: position in
// the list is the group index, position inside a group is the rank in that group, and the first
// member is the group's source rank.
//
// Worked example (Example A of the tests): W = 16, tp = 2, cp = 2, pp = 2 → dp = 16/(2·2·2) = 2.
// Dense order tp-cp-ep-dp-pp, sizes (2, 2, 1, 2, 2), strides (1, 2, 4, 4, 8), so
//     rank = tp_r + 2·cp_r + 4·dp_r + 8·pp_r.
// get_ranks("dp"): M = {dp} (size 2), U = (tp, cp, ep, pp) with sizes (2, 2, 1, 2): 8 groups.
//     g = 0 → u = (0,0,0,0) → [0, 4];  g = 1 → u = (1,0,0,0) → [1, 5];
//     g = 2 → u = (0,1,0,0) → [2, 6];  g = 4 → u = (0,0,0,1) → [8, 12] …
// get_ranks("dp-cp"): M = (cp, dp) sizes (2, 2), U = (tp, ep, pp): group 0 = {j = cp_r + 2·dp_r}
//     = [0, 2, 4, 6], group 1 = [1, 3, 5, 7], group 2 = [8, 10, 12, 14], group 3 = [9, 11, 13, 15].
// The expert generator uses the same order with sizes (tp = etp, cp = 1, ep, dp = edp, pp); with
// etp = 2, ep = 1, edp = 4 its "dp" groups are [0,2,4,6] [1,3,5,7] [8,10,12,14] [9,11,13,15].
#pragma once
#include <string>
#include <string_view>
#include <vector>
#include "megadlm/parallel/parallel_config.h"

namespace megadlm::parallel {

/// Sizes of one generator's dimensions. Dense: {tp, cp, ep = 1, dp, pp}; expert:
/// {tp = etp, cp = 1, ep, dp = edp, pp}.
struct GeneratorSizes {
  int tp = 1;
  int cp = 1;
  int ep = 1;
  int dp = 1;
  int pp = 1;
};

class RankGenerator {
 public:
  /// Throws megadlm::Error when the order names an unknown or repeated dimension, omits a
  /// dimension of size > 1, a size is < 1, or both ep and cp exceed 1.
  RankGenerator(const GeneratorSizes& sizes, std::string_view order);

  int world_size() const { return world_size_; }
  /// The expanded order, fastest first (e.g. {"tp","pp","dp","ep","cp"} for "tp-pp-dp").
  const std::vector<std::string>& dims() const { return dims_; }
  int size_of(std::string_view dim) const;
  int stride_of(std::string_view dim) const;

  /// Groups of the dimensions named in `token` ("tp-pp"; order inside the token is irrelevant),
  /// in Megatron's group order and member order. O(world size).
  std::vector<std::vector<int>> get_ranks(std::string_view token) const;

 private:
  int index_of(std::string_view dim) const;
  std::vector<std::string> dims_;
  std::vector<int> sizes_;
  std::vector<int> strides_;
  int world_size_ = 1;
};

/// The process groups Megatron creates. Names follow Megatron's (parallel_state.py).
enum class GroupKind {
  Tp,                ///< TENSOR_MODEL_PARALLEL: dense "tp"
  Cp,                ///< CONTEXT_PARALLEL: dense "cp"
  Dp,                ///< DATA_PARALLEL: dense "dp"
  DpCp,              ///< DATA_PARALLEL_WITH_CP: dense "dp-cp"
  Pp,                ///< PIPELINE_MODEL_PARALLEL: dense "pp"
  TpPp,              ///< MODEL_PARALLEL: dense "tp-pp"
  TpDp,              ///< TENSOR_AND_DATA_PARALLEL: dense "tp-dp"
  TpCp,              ///< TENSOR_AND_CONTEXT_PARALLEL: dense "tp-cp"
  TpDpCp,            ///< TENSOR_AND_DATA_PARALLEL_WITH_CP: dense "tp-dp-cp"
  Embedding,         ///< first and last member of each pp group (only the first when pp == 1)
  PositionEmbedding, ///< first member of each pp group
  ExpertEp,          ///< EXPERT_MODEL_PARALLEL: expert "ep"
  ExpertTp,          ///< EXPERT_TENSOR_PARALLEL: expert "tp"
  ExpertTpEp,        ///< EXPERT_TENSOR_AND_MODEL_PARALLEL: expert "tp-ep"
  ExpertTpEpPp,      ///< EXPERT_TENSOR_MODEL_PIPELINE: expert "tp-ep-pp"
  ExpertDp,          ///< EXPERT_DATA_PARALLEL: expert "dp"
  DistOptIntra,      ///< intra-instance (shard) slices of each dp-cp group, size dp·cp/N
  DistOptInter,      ///< inter-instance strided slices of each dp-cp group, size N
  kCount,
};

/// Short name used in layout reports and messages ("tp", "dp-cp", "expert-tp", ...).
const char* group_kind_name(GroupKind kind);

/// A rank's position in each parallel dimension (= its position inside the matching group).
struct RankCoordinates {
  int tp = 0;
  int cp = 0;
  int dp = 0;
  int pp = 0;
  int ep = 0;         ///< position in the expert "ep" group
  int expert_tp = 0;  ///< position in the expert "tp" group
  int expert_dp = 0;  ///< position in the expert "dp" group
};

/// Every group of every rank of a job, precomputed (O(world size) memory per group kind) so that
/// each query is O(1).
class RankLayout {
 public:
  /// Builds the groups for `config.world_size` ranks. Throws megadlm::Error when the sizes do not
  /// tile the world (world % (tp·pp·cp), world % (etp·ep·pp)), the order cannot hold them, the
  /// dense and expert pp groups differ, the hierarchical CP sizes do not multiply to cp, or dp·cp
  /// is not divisible by the number of distributed-optimizer instances. The user-facing versions
  /// of these checks, with flag names, are in training/arguments.
  static RankLayout build(const ParallelConfig& config);

  int world_size() const { return world_size_; }
  int data_parallel_size() const { return dp_; }
  int expert_data_parallel_size() const { return edp_; }

  /// All groups of a kind, in Megatron's order.
  const std::vector<std::vector<int>>& groups(GroupKind kind) const;
  /// The group of `kind` that contains `rank`; empty when the rank belongs to none (embedding
  /// groups of middle pipeline stages, position-embedding groups of non-first stages).
  const std::vector<int>& group_of(GroupKind kind, int rank) const;
  /// Position of `rank` inside group_of(kind, rank); -1 when it belongs to none.
  int rank_in_group(GroupKind kind, int rank) const;

  /// Hierarchical CP: number of levels (0 without --hierarchical-context-parallel-sizes).
  int num_hierarchical_cp_levels() const { return static_cast<int>(hier_cp_.size()); }
  /// All groups of level `level` (0-based), listed cp group by cp group.
  const std::vector<std::vector<int>>& hierarchical_cp_groups(int level) const;
  /// The level-`level` group of `rank`.
  const std::vector<int>& hierarchical_cp_group_of(int level, int rank) const;

  RankCoordinates coordinates(int rank) const;

  /// Pipeline neighbours inside the rank's pp group: members[(i ± 1) mod pp].
  int pipeline_next_rank(int rank) const;
  int pipeline_prev_rank(int rank) const;

 private:
  struct Partition {
    std::vector<std::vector<int>> groups;
    std::vector<int> group_index;    ///< per rank; -1 = in no group
    std::vector<int> position;       ///< per rank; -1 = in no group
  };
  Partition& part(GroupKind kind) { return parts_[static_cast<size_t>(kind)]; }
  const Partition& part(GroupKind kind) const { return parts_[static_cast<size_t>(kind)]; }
  void check_rank(int rank) const;
  static void index(Partition& p, int world_size);

  int world_size_ = 1;
  int dp_ = 1;
  int edp_ = 1;
  std::vector<Partition> parts_;
  std::vector<Partition> hier_cp_;
};

/// The dry-run / start-up report of a layout: world size, every dimension's size, the order,
/// `rank`'s coordinates and every group `rank` belongs to (name: member list).
std::string format_layout(const ParallelConfig& config, int rank);

}  // namespace megadlm::parallel
