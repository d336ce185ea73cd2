// comm/communicator.h split_by_members: the generic cut of a group by member lists that
// parallel/process_groups uses for every kind of group (color = index of the rank's list, key =
// its position in that list, so the new group's rank order is the list's order).
#include <memory>
#include "comm/self_communicator.h"
#include "megadlm/comm/communicator.h"

namespace megadlm::comm {

using ::megadlm::detail::concat;

std::shared_ptr<Communicator> split_by_members(Communicator& parent,
                                               const std::vector<std::vector<int>>& partition,
                                               const std::string& name) {
  const int me = parent.rank();
  int color = -1, key = 0;
  bool all_singletons = true;
  for (size_t g = 0; g < partition.size(); ++g) {
    all_singletons = all_singletons && partition[g].size() == 1;
    for (size_t j = 0; j < partition[g].size(); ++j) {
      const int r = partition[g][j];
      MDLM_CHECK(r >= 0 && r < parent.size(), "splitting '", parent.name(), "' into '", name,
                 "': member ", r, " is not a rank of the ", parent.size(), "-rank group");
      if (r != me) continue;
      MDLM_CHECK(color < 0, "splitting '", parent.name(), "' into '", name, "': rank ", me,
                 " is listed in two groups");
      color = static_cast<int>(g);
      key = static_cast<int>(j);
    }
  }
  if (all_singletons) {
    // One-rank groups cost nothing: no collective (every rank decides alike from the partition).
    if (color < 0) return nullptr;
    return std::make_shared<detail::SelfCommunicator>(name, parent.device(),
                                                      parent.global_rank(me), parent.timeout(),
                                                      /*registry=*/nullptr);
  }
  std::unique_ptr<Communicator> c = parent.split(color, key, name);
  MDLM_CHECK((c != nullptr) == (color >= 0), "splitting '", name, "': rank ", me,
             color < 0 ? " belongs to no group but received one" : " received no group");
  if (!c) return nullptr;
  const size_t expected = partition[static_cast<size_t>(color)].size();
  MDLM_CHECK(c->size() == static_cast<int>(expected) && c->rank() == key, "group '", name,
             "' came out with rank ", c->rank(), " of ", c->size(), " on rank ", me, " of '",
             parent.name(), "'; the member list says ", key, " of ", expected);
  return std::shared_ptr<Communicator>(std::move(c));
}

}  // namespace megadlm::comm
