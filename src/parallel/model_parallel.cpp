#include "megadlm/parallel/model_parallel.h"
#include "megadlm/core/error.h"

namespace megadlm {

ParallelGroup ParallelGroup::of(std::shared_ptr<comm::Communicator> c) {
  ParallelGroup g;
  if (c) {
    g.rank = c->rank();
    g.size = c->size();
  }
  g.comm = std::move(c);
  return g;
}

int64_t ModelParallel::local_rows(int64_t rows) const {
  return sequence_parallel ? shard_rows(rows, tp.size) : rows;
}

int64_t ModelParallel::local_row_offset(int64_t rows) const {
  return sequence_parallel ? shard_rows(rows, tp.size) * tp.rank : 0;
}

ModelParallel ModelParallel::from(const parallel::ProcessGroups& groups, const ParallelConfig& config) {
  ModelParallel mp;
  mp.tp = ParallelGroup::of(groups.tp);
  mp.cp = ParallelGroup::of(groups.cp);
  mp.ep = ParallelGroup::of(groups.ep);
  mp.expert_tp = ParallelGroup::of(groups.expert_tp);
  for (const auto& level : groups.hierarchical_cp) mp.hierarchical_cp.push_back(ParallelGroup::of(level));
  auto check = [](const ParallelGroup& g, int want, const char* what, const char* flag) {
    MDLM_CHECK(g.size == want, "the ", what, " group has ", g.size, " ranks but ", flag, " is ", want);
  };
  check(mp.tp, config.tensor_model_parallel_size, "tensor-parallel", "--tensor-model-parallel-size");
  check(mp.cp, config.context_parallel_size, "context-parallel", "--context-parallel-size");
  check(mp.ep, config.expert_model_parallel_size, "expert-parallel", "--expert-model-parallel-size");
  check(mp.expert_tp, config.expert_tensor_parallel_size, "expert-tensor-parallel",
        "--expert-tensor-parallel-size");
  mp.sequence_parallel = config.sequence_parallel && mp.tp.size > 1;
  mp.tp_comm_overlap = config.tp_comm_overlap && mp.sequence_parallel;
  if (mp.tp_comm_overlap) mp.tp_side_stream = std::make_shared<SideStream>();
  mp.cp_comm_types = config.cp_comm_type;
  if (mp.cp.size > 1) mp.cp_side_stream = std::make_shared<SideStream>();
  return mp;
}

}  // namespace megadlm
