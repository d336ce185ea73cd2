// The exact collective checks of comm_checks.h. Expected values come from closed forms or from
// looping over the ranks' (locally recomputed) inputs; nothing is compared with another run.
#include "support/comm_checks.h"
#include <gtest/gtest.h>
#include <algorithm>
#include "megadlm/parallel/process_groups.h"
#include "megadlm/parallel/rank_layout.h"

namespace megadlm::test {

using comm::Communicator;
using comm::P2POp;
using comm::ReduceOp;

namespace {

std::string where(const Communicator& c, DType d) {
  return "group '" + c.name() + "' rank " + std::to_string(c.rank()) + " of " +
         std::to_string(c.size()) + " (global " + std::to_string(c.global_rank(c.rank())) +
         "), dtype " + dtype_name(d);
}

float reduce(ReduceOp op, const std::vector<float>& xs) {
  double acc = xs[0];
  for (size_t i = 1; i < xs.size(); ++i) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += xs[i]; break;
      case ReduceOp::Max: acc = std::max<double>(acc, xs[i]); break;
      case ReduceOp::Min: acc = std::min<double>(acc, xs[i]); break;
    }
  }
  if (op == ReduceOp::Avg) acc /= static_cast<double>(xs.size());
  return static_cast<float>(acc);
}

/// Input of rank r for reductions: sum and avg need positive tags (r+1)·(1 + i % 7), whose sum
/// over 8 ranks stays below 256; max/min use values that put each rank on top somewhere.
float reduction_input(ReduceOp op, int r, int size, int64_t i) {
  if (op == ReduceOp::Sum || op == ReduceOp::Avg) return static_cast<float>((r + 1) * (1 + i % 7));
  return static_cast<float>((i * 3 + r * 5) % (size + 4)) - 2.0f;
}

}  // namespace

Tensor make_tensor(const std::vector<float>& values, DType dtype, const Stream& s) {
  Tensor host = Tensor::from_floats(values, {static_cast<int64_t>(values.size())}, dtype);
  return s.is_cuda() ? host.to(s.device(), s) : host;
}

std::vector<float> read_tensor(const Tensor& t, const Stream& s) { return t.to_floats(s); }

void check_all_reduce(Communicator& c, const Stream& s, DType dtype, ReduceOp op) {
  SCOPED_TRACE(where(c, dtype) + ", all_reduce " + comm::reduce_op_name(op));
  const int64_t n = 37;
  std::vector<float> mine(n), expected(n);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> over_ranks;
    for (int r = 0; r < c.size(); ++r) over_ranks.push_back(reduction_input(op, r, c.size(), i));
    mine[static_cast<size_t>(i)] = over_ranks[static_cast<size_t>(c.rank())];
    expected[static_cast<size_t>(i)] = reduce(op, over_ranks);
  }
  Tensor t = make_tensor(mine, dtype, s);
  c.all_reduce(t, op, s);
  c.synchronize(s);
  EXPECT_EQ(read_tensor(t, s), expected);
}

void check_reduce_scatter(Communicator& c, const Stream& s, DType dtype, ReduceOp op, bool in_place) {
  SCOPED_TRACE(where(c, dtype) + ", reduce_scatter " + comm::reduce_op_name(op) +
               (in_place ? " in place" : ""));
  const int64_t n = 13, total = n * c.size();
  std::vector<float> mine(static_cast<size_t>(total)), expected(n);
  for (int64_t j = 0; j < total; ++j)
    mine[static_cast<size_t>(j)] = reduction_input(op, c.rank(), c.size(), j);
  for (int64_t k = 0; k < n; ++k) {
    std::vector<float> over_ranks;
    for (int r = 0; r < c.size(); ++r)
      over_ranks.push_back(reduction_input(op, r, c.size(), c.rank() * n + k));
    expected[static_cast<size_t>(k)] = reduce(op, over_ranks);
  }
  Tensor in = make_tensor(mine, dtype, s);
  Tensor out = in_place ? in.slice_flat(c.rank() * n, {n}) : Tensor::empty({n}, dtype, s);
  c.reduce_scatter(in, out, op, s);
  c.synchronize(s);
  EXPECT_EQ(read_tensor(out, s), expected);
}

void check_all_gather(Communicator& c, const Stream& s, DType dtype, bool in_place) {
  SCOPED_TRACE(where(c, dtype) + ", all_gather" + (in_place ? " in place" : ""));
  const int64_t n = 11;
  auto value = [](int r, int64_t k) { return static_cast<float>(r * 16 + k % 16); };
  std::vector<float> mine(n), expected;
  for (int64_t k = 0; k < n; ++k) mine[static_cast<size_t>(k)] = value(c.rank(), k);
  for (int r = 0; r < c.size(); ++r)
    for (int64_t k = 0; k < n; ++k) expected.push_back(value(r, k));
  Tensor out, in;
  if (in_place) {
    std::vector<float> init(static_cast<size_t>(n * c.size()), -1.0f);
    std::copy(mine.begin(), mine.end(), init.begin() + c.rank() * n);
    out = make_tensor(init, dtype, s);
    in = out.slice_flat(c.rank() * n, {n});
  } else {
    in = make_tensor(mine, dtype, s);
    out = make_tensor(std::vector<float>(static_cast<size_t>(n * c.size()), -1.0f), dtype, s);
  }
  c.all_gather(in, out, s);
  c.synchronize(s);
  EXPECT_EQ(read_tensor(out, s), expected);
}

void check_broadcast_from_every_root(Communicator& c, const Stream& s, DType dtype) {
  const int64_t n = 9;
  for (int root = 0; root < c.size(); ++root) {
    SCOPED_TRACE(where(c, dtype) + ", broadcast from root " + std::to_string(root));
    std::vector<float> theirs(n);
    for (int64_t i = 0; i < n; ++i) theirs[static_cast<size_t>(i)] = static_cast<float>(root * 10 + i + 1);
    Tensor t = make_tensor(c.rank() == root ? theirs : std::vector<float>(n, -1.0f), dtype, s);
    c.broadcast(t, root, s);
    c.synchronize(s);
    EXPECT_EQ(read_tensor(t, s), theirs);
  }
}

void check_uneven_all_to_all(Communicator& c, const Stream& s, DType dtype) {
  SCOPED_TRACE(where(c, dtype) + ", uneven all_to_all");
  auto count = [](int from, int to) -> int64_t { return (2 * from + to) % 4; };
  auto value = [](int from, int to, int64_t k) { return static_cast<float>(from * 32 + to * 4 + k); };
  const int me = c.rank();
  std::vector<int64_t> send_counts, recv_counts;
  std::vector<float> in, expected;
  for (int p = 0; p < c.size(); ++p) {
    send_counts.push_back(count(me, p));
    recv_counts.push_back(count(p, me));
    for (int64_t k = 0; k < count(me, p); ++k) in.push_back(value(me, p, k));
    for (int64_t k = 0; k < count(p, me); ++k) expected.push_back(value(p, me, k));
  }
  // A rank may send or receive nothing at all; a zero-element tensor is still a valid buffer.
  Tensor tin = make_tensor(in, dtype, s);
  Tensor tout = make_tensor(std::vector<float>(expected.size(), -1.0f), dtype, s);
  c.all_to_all(tin, send_counts, tout, recv_counts, s);
  c.synchronize(s);
  EXPECT_EQ(read_tensor(tout, s), expected);
}

void check_send_recv_pairs(Communicator& c, const Stream& s, DType dtype) {
  SCOPED_TRACE(where(c, dtype) + ", send/recv pairs");
  const int me = c.rank();
  const int peer = me % 2 == 0 ? me + 1 : me - 1;
  if (peer >= c.size()) return;  // odd group size: the last rank has no partner
  const int64_t n = 21;
  auto payload = [n](int from) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(from * 8 + i % 8);
    return v;
  };
  Tensor out = make_tensor(payload(me), dtype, s);
  Tensor in = make_tensor(std::vector<float>(n, -1.0f), dtype, s);
  if (me % 2 == 0) {
    c.send(out, peer, s);
    c.recv(in, peer, s);
  } else {
    c.recv(in, peer, s);
    c.send(out, peer, s);
  }
  c.synchronize(s);
  EXPECT_EQ(read_tensor(in, s), payload(peer));
}

void check_batch_p2p_ring(Communicator& c, const Stream& s, DType dtype) {
  SCOPED_TRACE(where(c, dtype) + ", batch_p2p ring");
  const int me = c.rank(), size = c.size();
  const int64_t n = 19;
  auto payload = [n](int from, int tag) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i)
      v[static_cast<size_t>(i)] = static_cast<float>(from * 16 + tag * 4 + i % 4);
    return v;
  };
  // Every rank's list, as (send?, peer, tag of a send); 1F1B's order, then a second transfer to
  // the next rank and one to itself. With 1 or 2 ranks several entries name the same peer, which
  // pins that transfers between one pair match in list order.
  struct Entry {
    bool send;
    int peer;
    int tag;
  };
  auto ops_of = [size](int r) {
    const int next = (r + 1) % size, prev = (r + size - 1) % size;
    return std::vector<Entry>{{true, prev, 1}, {false, prev, -1}, {true, next, 0},
                              {false, next, -1}, {true, next, 2}, {false, prev, -1},
                              {true, r, 3},    {false, r, -1}};
  };
  // What the k-th receive from p holds: the k-th send from p to this rank in p's list.
  auto expected_for = [&](size_t index) {
    const std::vector<Entry> mine = ops_of(me);
    const int p = mine[index].peer;
    int k = 0;
    for (size_t i = 0; i < index; ++i) k += !mine[i].send && mine[i].peer == p;
    for (const Entry& e : ops_of(p))
      if (e.send && e.peer == me && k-- == 0) return payload(p, e.tag);
    return std::vector<float>();
  };
  std::vector<P2POp> ops;
  std::vector<std::pair<size_t, Tensor>> receives;
  const std::vector<Entry> mine = ops_of(me);
  for (size_t i = 0; i < mine.size(); ++i) {
    if (mine[i].send) {
      ops.push_back({P2POp::Kind::Send, make_tensor(payload(me, mine[i].tag), dtype, s), mine[i].peer});
    } else {
      Tensor t = make_tensor(std::vector<float>(n, -1.0f), dtype, s);
      ops.push_back({P2POp::Kind::Recv, t, mine[i].peer});
      receives.emplace_back(i, t);
    }
  }
  c.batch_p2p(ops, s);
  c.synchronize(s);
  for (const auto& [index, t] : receives)
    EXPECT_EQ(read_tensor(t, s), expected_for(index)) << "receive #" << index << " of the list, from peer "
                                                      << mine[index].peer;
}

void check_split_even_odd(Communicator& c, const Stream& s) {
  SCOPED_TRACE(where(c, DType::F32) + ", split by parity");
  const int me = c.rank(), size = c.size();
  std::unique_ptr<Communicator> half = c.split(me % 2, -me, c.name() + "-parity");
  ASSERT_NE(half, nullptr);
  // Members of my half, in key order (-rank ascending = rank descending).
  std::vector<int> members;
  for (int r = size - 1; r >= 0; --r)
    if (r % 2 == me % 2) members.push_back(r);
  EXPECT_EQ(half->size(), static_cast<int>(members.size()));
  EXPECT_EQ(half->name(), c.name() + "-parity");
  EXPECT_EQ(half->device(), c.device());
  EXPECT_EQ(half->timeout(), c.timeout());
  for (size_t i = 0; i < members.size(); ++i) {
    EXPECT_EQ(half->global_rank(static_cast<int>(i)), c.global_rank(members[i]));
    if (members[i] == me) {
      EXPECT_EQ(half->rank(), static_cast<int>(i));
    }
  }
  // Sum of the members' ranks in the parent, through the new group.
  Tensor t = make_tensor({static_cast<float>(me), 1.0f}, DType::F32, s);
  half->all_reduce(t, ReduceOp::Sum, s);
  half->synchronize(s);
  float sum = 0;
  for (int r : members) sum += static_cast<float>(r);
  EXPECT_EQ(read_tensor(t, s), (std::vector<float>{sum, static_cast<float>(members.size())}));

  // Odd ranks opt out; the even ranks' group keeps working.
  std::unique_ptr<Communicator> evens = c.split(me % 2 == 0 ? 0 : -1, me, c.name() + "-evens");
  EXPECT_EQ(evens == nullptr, me % 2 == 1);
  if (evens) {
    Tensor one = make_tensor({1.0f}, DType::F32, s);
    evens->all_reduce(one, ReduceOp::Sum, s);
    evens->synchronize(s);
    EXPECT_EQ(read_tensor(one, s), std::vector<float>{static_cast<float>((size + 1) / 2)});
  }
}

void check_process_groups(const std::shared_ptr<Communicator>& world, const Stream& s,
                          const ParallelConfig& config) {
  using parallel::GroupKind;
  const parallel::ProcessGroups pg = parallel::ProcessGroups::build(world, config);
  const parallel::RankLayout layout = parallel::RankLayout::build(config);
  const int me = world->rank();
  EXPECT_EQ(pg.world, world);
  struct Kind {
    GroupKind kind;
    std::shared_ptr<Communicator> parallel::ProcessGroups::*slot;
    const char* name;  ///< ProcessGroups' name for it (shared groups list several, '='-joined)
  };
  const Kind kinds[] = {
      {GroupKind::Tp, &parallel::ProcessGroups::tp, "tp"},
      {GroupKind::Cp, &parallel::ProcessGroups::cp, "cp"},
      {GroupKind::Dp, &parallel::ProcessGroups::dp, "dp"},
      {GroupKind::DpCp, &parallel::ProcessGroups::dp_cp, "dp-cp"},
      {GroupKind::Pp, &parallel::ProcessGroups::pp, "pp"},
      {GroupKind::TpPp, &parallel::ProcessGroups::model_parallel, "tp-pp"},
      {GroupKind::TpCp, &parallel::ProcessGroups::tp_cp, "tp-cp"},
      {GroupKind::Embedding, &parallel::ProcessGroups::embedding, "embedding"},
      {GroupKind::DistOptIntra, &parallel::ProcessGroups::dist_opt_intra, "dist-opt-intra"},
      {GroupKind::DistOptInter, &parallel::ProcessGroups::dist_opt_inter, "dist-opt-inter"},
      {GroupKind::ExpertEp, &parallel::ProcessGroups::ep, "ep"},
      {GroupKind::ExpertTp, &parallel::ProcessGroups::expert_tp, "expert-tp"},
      {GroupKind::ExpertDp, &parallel::ProcessGroups::expert_dp, "expert-dp"},
  };
  for (const auto& [kind, slot, kname] : kinds) {
    const std::shared_ptr<Communicator>& g = pg.*slot;
    SCOPED_TRACE(std::string("group kind ") + kname + ", world rank " + std::to_string(me));
    const std::vector<int>& members = layout.group_of(kind, me);
    if (kind == GroupKind::DistOptInter && config.num_distributed_optimizer_instances == 1) {
      EXPECT_EQ(g, nullptr) << "one distributed-optimizer instance has no inter group";
      continue;
    }
    // Every rank takes part in the collectives below the same number of times.
    if (members.empty()) {
      EXPECT_EQ(g, nullptr) << "this rank belongs to no group of this kind";
      continue;
    }
    ASSERT_NE(g, nullptr);
    EXPECT_NE(g->name().find(kname), std::string::npos) << "name '" << g->name() << "'";
    EXPECT_EQ(g->size(), static_cast<int>(members.size()));
    EXPECT_EQ(g->rank(), layout.rank_in_group(kind, me));
    std::vector<float> want;
    for (int i = 0; i < g->size(); ++i) {
      EXPECT_EQ(g->global_rank(i), members[static_cast<size_t>(i)]) << "member " << i;
      want.push_back(static_cast<float>(members[static_cast<size_t>(i)]));
    }
    Tensor mine = make_tensor({static_cast<float>(me)}, DType::F32, s);
    Tensor all = Tensor::empty({g->size()}, DType::F32, s);
    g->all_gather(mine, all, s);
    g->synchronize(s);
    EXPECT_EQ(read_tensor(all, s), want) << "all_gather of global ranks over '" << g->name() << "'";
  }
  // Hierarchical context parallelism: one group per level.
  ASSERT_EQ(static_cast<int>(pg.hierarchical_cp.size()), layout.num_hierarchical_cp_levels());
  for (int l = 0; l < layout.num_hierarchical_cp_levels(); ++l) {
    const std::shared_ptr<Communicator>& g = pg.hierarchical_cp[static_cast<size_t>(l)];
    const std::vector<int>& members = layout.hierarchical_cp_group_of(l, me);
    ASSERT_NE(g, nullptr) << "hierarchical cp level " << l;
    EXPECT_EQ(g->size(), static_cast<int>(members.size())) << "hierarchical cp level " << l;
    for (int i = 0; i < g->size(); ++i)
      EXPECT_EQ(g->global_rank(i), members[static_cast<size_t>(i)]) << "level " << l << " member " << i;
  }
}

}  // namespace megadlm::test
