// Exact collective checks shared by the MPI (tests/layout/comm) and NCCL (tests/gpu_multi)
// suites, for any communicator, device and dtype. Inputs are small rank-tagged integers, so
// every partial sum is an integer below 256: exactly representable in bf16, f32 and beyond, and
// therefore the same whatever order a transport sums in (nccl-tests' verifiable inputs). Each
// check compares with EXPECT_EQ against a formula, never against another transport.
// Exception: ReduceOp::Avg over a group whose size is not a power of two; NCCL premultiplies by
// 1/size, which is inexact then (the MPI backend sums and divides once), so only power-of-two
// groups check Avg exactly.
#pragma once
#include <vector>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/parallel/parallel_config.h"

namespace megadlm::test {

/// Host values -> a tensor of `dtype` on the stream's device.
Tensor make_tensor(const std::vector<float>& values, DType dtype, const Stream& s);
/// Any tensor -> host floats (synchronises the stream).
std::vector<float> read_tensor(const Tensor& t, const Stream& s);

// Every rank of `c` calls each check with the same arguments. Element counts are odd on purpose.
void check_all_reduce(comm::Communicator& c, const Stream& s, DType dtype, comm::ReduceOp op);
void check_reduce_scatter(comm::Communicator& c, const Stream& s, DType dtype, comm::ReduceOp op,
                          bool in_place);
void check_all_gather(comm::Communicator& c, const Stream& s, DType dtype, bool in_place);
void check_broadcast_from_every_root(comm::Communicator& c, const Stream& s, DType dtype);
/// Rank r sends (2r + p) % 4 elements to peer p: uneven, with zero-length blocks.
void check_uneven_all_to_all(comm::Communicator& c, const Stream& s, DType dtype);
/// Pairs (0,1), (2,3), ...: the even rank sends first, the odd one receives first.
void check_send_recv_pairs(comm::Communicator& c, const Stream& s, DType dtype);
/// batch_p2p ring in both directions, in 1F1B's order (send-prev, recv-prev, send-next,
/// recv-next), two transfers per neighbour to pin the matching order, plus one to itself.
void check_batch_p2p_ring(comm::Communicator& c, const Stream& s, DType dtype);
/// split by rank parity (color = rank % 2, key = -rank: reversed order), then a collective in
/// each half; a third split leaves the odd ranks out (color < 0 → nullptr).
void check_split_even_odd(comm::Communicator& c, const Stream& s);
/// ProcessGroups::build for `config`: every group's members and order against RankLayout, and
/// an all_gather of global ranks over each group returns exactly those members.
void check_process_groups(const std::shared_ptr<comm::Communicator>& world, const Stream& s,
                          const ParallelConfig& config);

}  // namespace megadlm::test
