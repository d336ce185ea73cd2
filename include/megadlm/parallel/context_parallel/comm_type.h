// How a layer's attention talks over the context-parallel group (--cp-comm-type, one value for
// every layer or one per layer; docs/parallelism/context_parallel.md). The algorithms are in
// attention.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace megadlm::cp {

enum class CommType : uint8_t {
  P2P,        ///< "p2p": K/V travel around a ring, partial outputs merged by log-sum-exp
  AllGather,  ///< "all_gather" (or "allgather"): gather K/V, reduce-scatter dK/dV
  A2A,        ///< "a2a" (Ulysses): all-to-all from sequence shards to head shards and back
  A2AP2P,     ///< "a2a+p2p": a2a inside hierarchical level 1, p2p ring across level 2
};

/// The flag spelling (as Megatron / Transformer Engine name it).
const char* comm_type_name(CommType t);
/// Parses one --cp-comm-type value (both all_gather spellings); throws naming the valid ones.
CommType comm_type_from_name(const std::string& name);
/// The type of global layer `layer` from the flag's list (one value: every layer; empty: p2p).
CommType comm_type_of_layer(const std::vector<CommType>& types, int layer);

}  // namespace megadlm::cp
