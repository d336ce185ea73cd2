// parallel/context_parallel/comm_type.h
#include "megadlm/parallel/context_parallel/comm_type.h"
#include "megadlm/core/error.h"

namespace megadlm::cp {

const char* comm_type_name(CommType t) {
  switch (t) {
    case CommType::P2P: return "p2p";
    case CommType::AllGather: return "all_gather";
    case CommType::A2A: return "a2a";
    case CommType::A2AP2P: return "a2a+p2p";
  }
  return "?";
}

CommType comm_type_from_name(const std::string& name) {
  if (name == "p2p") return CommType::P2P;
  if (name == "all_gather" || name == "allgather") return CommType::AllGather;
  if (name == "a2a") return CommType::A2A;
  if (name == "a2a+p2p") return CommType::A2AP2P;
  MDLM_FAIL("`--cp-comm-type ", name, "` is not a context-parallel communication type; valid: "
            "p2p, all_gather (allgather), a2a, a2a+p2p");
}

CommType comm_type_of_layer(const std::vector<CommType>& types, int layer) {
  if (types.empty()) return CommType::P2P;
  if (types.size() == 1) return types[0];
  MDLM_CHECK(layer >= 0 && static_cast<size_t>(layer) < types.size(), "layer ", layer,
             " has no entry in the ", types.size(), " values of --cp-comm-type");
  return types[static_cast<size_t>(layer)];
}

}  // namespace megadlm::cp
