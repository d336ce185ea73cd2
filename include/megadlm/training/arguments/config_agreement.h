// Every rank of a job must run the same configuration with the same build. A flag that differs
// on one node (an edited launch script, a stale binary on one host) otherwise surfaces hours
// later as replicas that drift apart or a collective that hangs (docs/launching.md, "Every rank
// runs the same configuration").
// pretrain_difflm checks it right after the communicators start, before the process groups are
// split; a custom trainer calls check_same_configuration() itself.
#pragma once
#include <map>
#include <string>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/stream.h"

namespace megadlm::training {

/// This library's build: "megadlm 0.1.0 (git 1a2b3c4d5e6f)", the commit at configure time
/// ("git unknown" outside a checkout).
const char* build_id();

/// The text ranks compare: one "name = value" line per resolved argument (ParsedArguments::
/// values), except the per-process ones (rank, local_rank), then the build id.
std::string configuration_text(const std::map<std::string, std::string>& values);

/// Collective over `world`: rank 0's text is broadcast and every rank compares its own with it.
/// When any rank differs, every rank throws the same Error naming the lowest differing rank and
/// up to 8 of its differing lines (its value and rank 0's).
void check_same_configuration(comm::Communicator& world, const std::string& text, const Stream& stream);

}  // namespace megadlm::training
