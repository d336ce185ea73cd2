// The communication of expert parallelism (the EP room's second door, next to
// token_dispatcher.h): row blocks of uneven sizes moved over the EP and expert-TP groups, and the
// small host-side count exchanges that size them. Every function is a collective over `group`
// (null or one rank: a local identity); all ranks call it in the same order with consistent
// sizes. Rows are [rows, cols] blocks of any dtype the communicator moves.
//
//   forward                            backward (the conjugate)
//   all_to_all_rows(send, recv)        all_to_all_rows(recv, send)
//   all_gather_rows_uneven             reduce_scatter_rows_uneven
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ep {

/// x [sum(send_rows), C]: rows [sum_{q<p} send_rows[q], +send_rows[p]) go to member p;
/// returns [sum(recv_rows), C], member p's rows at sum_{q<p} recv_rows[q]. send_rows[p] here
/// equals recv_rows[me] on member p.
Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send_rows,
                       const std::vector<int64_t>& recv_rows, comm::Communicator* group,
                       const Stream& stream);

/// x [rows_of[me], C] on every member -> [sum(rows_of), C] in member order (rows_of known to
/// all). Equal sizes use one all-gather; uneven ones pad to the largest.
Tensor all_gather_rows_uneven(const Tensor& x, const std::vector<int64_t>& rows_of,
                              comm::Communicator* group, const Stream& stream);

/// full [sum(rows_of), C] partial sums on every member -> this member's block [rows_of[me], C]
/// of the sum over the group.
Tensor reduce_scatter_rows_uneven(const Tensor& full, const std::vector<int64_t>& rows_of,
                                  comm::Communicator* group, const Stream& stream);

/// Host integers: every member's `mine` (equal lengths), concatenated in member order.
std::vector<int64_t> all_gather_counts(const std::vector<int64_t>& mine, comm::Communicator* group,
                                       const Stream& stream);

/// Host integers: `send` holds size() blocks of n; block p goes to member p. Returns the blocks
/// received, in member order (size() * n values).
std::vector<int64_t> all_to_all_counts(const std::vector<int64_t>& send, int64_t n,
                                       comm::Communicator* group, const Stream& stream);

/// Host integers summed over the group (element-wise), e.g. token counts.
std::vector<int64_t> all_reduce_counts(const std::vector<int64_t>& mine, comm::Communicator* group,
                                       const Stream& stream);

}  // namespace megadlm::ep
