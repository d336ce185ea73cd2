// parallel/process_groups.h: one cut of the world per group kind, with the member lists of
// parallel/rank_layout (comm::split_by_members).
//
// Two economies, both decided from the whole partition so that every rank decides alike:
//  - a partition made only of one-rank groups (tp = 1 gives [0] [1] ...) needs no split: each
//    rank gets a local one-rank communicator (split_by_members does that);
//  - any other partition equal to one already built (dp and dp-cp when cp = 1, dp-cp and the
//    distributed-optimizer intra group with one instance, expert-dp and dp-cp without experts,
//    ...) reuses that communicator, whose name then lists every group it serves ("dp=dp-cp").
//    Operations on coinciding groups are then ordered by the one communicator, as issue order
//    already orders them on every rank.
// NCCL communicators cost GPU memory and start-up time each; Megatron builds all of them.
#include "megadlm/parallel/process_groups.h"
#include <utility>
#include "megadlm/parallel/rank_layout.h"

namespace megadlm::parallel {

using ::megadlm::detail::concat;
using comm::Communicator;

namespace {

struct Wanted {
  std::string name;
  const std::vector<std::vector<int>>* partition;
  std::shared_ptr<Communicator>* slot;
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
  const RankLayout layout = RankLayout::build(config);

  ProcessGroups pg;
  pg.world = world;
  std::vector<Wanted> wanted;
  auto want = [&](GroupKind kind, const char* name, std::shared_ptr<Communicator>& slot) {
    wanted.push_back({name, &layout.groups(kind), &slot});
  };
  want(GroupKind::Tp, "tp", pg.tp);
  want(GroupKind::Cp, "cp", pg.cp);
  want(GroupKind::Dp, "dp", pg.dp);
  want(GroupKind::DpCp, "dp-cp", pg.dp_cp);
  want(GroupKind::Pp, "pp", pg.pp);
  want(GroupKind::TpPp, "tp-pp", pg.model_parallel);
  want(GroupKind::TpCp, "tp-cp", pg.tp_cp);
  want(GroupKind::Embedding, "embedding", pg.embedding);
  want(GroupKind::DistOptIntra, "dist-opt-intra", pg.dist_opt_intra);
  // With one distributed-optimizer instance there is nothing to reduce across instances.
  if (config.num_distributed_optimizer_instances > 1)
    want(GroupKind::DistOptInter, "dist-opt-inter", pg.dist_opt_inter);
  want(GroupKind::ExpertEp, "ep", pg.ep);
  want(GroupKind::ExpertTp, "expert-tp", pg.expert_tp);
  want(GroupKind::ExpertDp, "expert-dp", pg.expert_dp);
  // Hierarchical CP levels, listed cp group by cp group.
  pg.hierarchical_cp.resize(static_cast<size_t>(layout.num_hierarchical_cp_levels()));
  std::vector<std::string> level_names;
  for (int l = 0; l < layout.num_hierarchical_cp_levels(); ++l)
    level_names.push_back(concat("hierarchical-cp-", l));
  for (int l = 0; l < layout.num_hierarchical_cp_levels(); ++l)
    wanted.push_back({level_names[static_cast<size_t>(l)], &layout.hierarchical_cp_groups(l),
                      &pg.hierarchical_cp[static_cast<size_t>(l)]});

  // Partitions that coincide share one communicator; its name lists them all. (One-rank groups
  // cost nothing and keep their own names.)
  std::vector<size_t> first_equal(wanted.size());
  std::vector<std::string> names(wanted.size());
  for (size_t i = 0; i < wanted.size(); ++i) {
    first_equal[i] = i;
    const auto& groups = *wanted[i].partition;
    for (size_t j = 0; j < i && !all_singletons(groups); ++j) {
      if (first_equal[j] == j && *wanted[j].partition == groups) {
        first_equal[i] = j;
        break;
      }
    }
    const size_t owner = first_equal[i];
    names[owner] = names[owner].empty() ? wanted[i].name : concat(names[owner], "=", wanted[i].name);
  }

  for (size_t i = 0; i < wanted.size(); ++i) {
    if (first_equal[i] != i) continue;
    *wanted[i].slot = comm::split_by_members(*world, *wanted[i].partition, names[i]);
  }
  for (size_t i = 0; i < wanted.size(); ++i)
    if (first_equal[i] != i) *wanted[i].slot = *wanted[first_equal[i]].slot;
  return pg;
}

}  // namespace megadlm::parallel
