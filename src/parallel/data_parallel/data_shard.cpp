#include "megadlm/parallel/data_parallel/data_shard.h"
#include "megadlm/core/error.h"

namespace megadlm {

DataShard DataShard::of(const parallel::RankLayout& layout, int global_rank) {
  DataShard d;
  d.rank = layout.rank_in_group(parallel::GroupKind::Dp, global_rank);
  d.size = static_cast<int>(layout.group_of(parallel::GroupKind::Dp, global_rank).size());
  MDLM_CHECK(d.rank >= 0 && d.size == layout.data_parallel_size(), "rank ", global_rank,
             " has no data-parallel group in the layout");
  return d;
}

}  // namespace megadlm
