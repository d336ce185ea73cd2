// comm/process_groups.h: one split of the world per group kind, with the member lists of
// parallel/rank_layout (color = index of the rank's group, key = its position in the member
// list, so the new group's rank order is the spec's member order).
//
// Two economies, both decided from the whole partition so that every rank decides alike:
//  - a partition made only of one-rank groups (tp = 1 gives [0] [1] ...) needs no split: each
//    rank gets a SelfCommunicator;
//  - any other partition equal to one already built (dp and dp-cp when cp = 1, dp-cp and the
//    distributed-optimizer intra group with one instance, ...) reuses that communicator, whose
//    name then lists every group it serves ("dp=dp-cp"). Operations on coinciding groups are then
//    ordered by the one communicator, as issue order already orders them on every rank.
// NCCL communicators cost GPU memory and start-up time each; Megatron builds all of them.
#include "megadlm/comm/process_groups.h"
#include <utility>
#include "comm/self_communicator.h"
#include "megadlm/parallel/rank_layout.h"

namespace megadlm::comm {

using ::megadlm::detail::concat;
using parallel::GroupKind;

namespace {

struct Wanted {
  GroupKind kind;
  const char* name;
  std::shared_ptr<Communicator> ProcessGroups::*slot;
};

bool all_singletons(const std::vector<std::vector<int>>& groups) {
  for (const auto& g : groups)
    if (g.size() != 1) return false;
  return true;
}

}  // namespace

ProcessGroups ProcessGroups::build(std::shared_ptr<Communicator> world, const ParallelConfig& config) {
  MDLM_CHECK(world != nullptr, "ProcessGroups::build needs the world communicator");
  MDLM_CHECK(world->size() == config.world_size, "the parallel layout is for ", config.world_size,
             " ranks but the world communicator '", world->name(), "' has ", world->size(),
             " (the launcher's world size must match ParallelConfig::world_size)");
  const parallel::RankLayout layout = parallel::RankLayout::build(config);
  const int me = world->rank();  // the world's ranks are the global ranks

  ProcessGroups pg;
  pg.world = world;
  std::vector<Wanted> wanted = {
      {GroupKind::Tp, "tp", &ProcessGroups::tp},
      {GroupKind::Cp, "cp", &ProcessGroups::cp},
      {GroupKind::Dp, "dp", &ProcessGroups::dp},
      {GroupKind::DpCp, "dp-cp", &ProcessGroups::dp_cp},
      {GroupKind::Pp, "pp", &ProcessGroups::pp},
      {GroupKind::TpPp, "tp-pp", &ProcessGroups::model_parallel},
      {GroupKind::TpCp, "tp-cp", &ProcessGroups::tp_cp},
      {GroupKind::Embedding, "embedding", &ProcessGroups::embedding},
      {GroupKind::DistOptIntra, "dist-opt-intra", &ProcessGroups::dist_opt_intra},
  };
  // With one distributed-optimizer instance there is nothing to reduce across instances.
  if (config.num_distributed_optimizer_instances > 1)
    wanted.push_back({GroupKind::DistOptInter, "dist-opt-inter", &ProcessGroups::dist_opt_inter});

  // Partitions that coincide share one communicator; its name lists them all. (One-rank groups
  // cost nothing and keep their own names.)
  std::vector<size_t> first_equal(wanted.size());
  std::vector<std::string> names(wanted.size());
  for (size_t i = 0; i < wanted.size(); ++i) {
    first_equal[i] = i;
    const auto& groups = layout.groups(wanted[i].kind);
    for (size_t j = 0; j < i && !all_singletons(groups); ++j) {
      if (first_equal[j] == j && layout.groups(wanted[j].kind) == groups) {
        first_equal[i] = j;
        break;
      }
    }
    const size_t owner = first_equal[i];
    names[owner] = names[owner].empty() ? wanted[i].name : concat(names[owner], "=", wanted[i].name);
  }

  for (size_t i = 0; i < wanted.size(); ++i) {
    const Wanted& w = wanted[i];
    if (first_equal[i] != i) {
      pg.*w.slot = pg.*wanted[first_equal[i]].slot;
      continue;
    }
    const auto& groups = layout.groups(w.kind);
    const std::vector<int>& mine = layout.group_of(w.kind, me);
    if (all_singletons(groups)) {
      if (!mine.empty())
        pg.*w.slot = std::make_shared<detail::SelfCommunicator>(
            names[i], world->device(), world->global_rank(me), world->timeout(),
            /*registry=*/nullptr);  // nothing to abort in a one-rank group
      continue;
    }
    int color = -1, key = 0;
    if (!mine.empty()) {
      for (size_t g = 0; g < groups.size(); ++g)
        if (groups[g] == mine) color = static_cast<int>(g);
      key = layout.rank_in_group(w.kind, me);
    }
    std::unique_ptr<Communicator> c = world->split(color, key, names[i]);
    MDLM_CHECK((c != nullptr) == !mine.empty(), "splitting '", names[i], "': rank ", me,
               mine.empty() ? " belongs to no group but received one" : " received no group");
    if (c) {
      MDLM_CHECK(c->size() == static_cast<int>(mine.size()) && c->rank() == key, "group '",
                 names[i], "' came out with rank ", c->rank(), " of ", c->size(),
                 " on world rank ", me, "; the layout says ", key, " of ", mine.size());
      pg.*w.slot = std::move(c);
    }
  }
  return pg;
}

}  // namespace megadlm::comm
