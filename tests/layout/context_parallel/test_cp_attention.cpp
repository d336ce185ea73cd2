// Context-parallel attention on its own (parallel/context_parallel/attention.h), as an SPMD
// program: every rank holds its shard of the same f64 q, k, v (sequences split over the world as
// the CP group), runs the layer's CP attention forward and backward, and compares with the
// single-process attention op on the whole sequences, row by row (1e-12: f64, only the merge
// order differs). The gradients are also checked against central finite differences of the
// distributed loss L = sum over ranks of <dout, out> (every rank perturbs the element if it holds
// it, all run the forward). Causal and packed documents, attention dropout at global coordinates,
// every comm type.
#include <gtest/gtest.h>
#include <cmath>
#include <vector>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/ops/attention.h"
#include "megadlm/parallel/context_parallel/attention.h"
#include "megadlm/parallel/context_parallel/sequence_split.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/parallel/process_groups.h"
#include "support/op_testing.h"
#include "support/spmd.h"
#include "support/tolerances.h"

using namespace megadlm;

namespace {

constexpr int64_t kB = 2, kHq = 8, kHkv = 4, kD = 3;  // GQA groups of 2; a2a up to cp 4

struct Setup {
  std::string comm;
  bool causal = false, documents = false;
  float dropout = 0.0f;
};

int world_size() { return test::spmd::mpi_runtime().world().size(); }

/// Rows of the whole [B, S, width] tensor at the shard's positions: [B, S/cp, width].
Tensor shard_of(const Tensor& full, const cp::Split& s, int64_t width) {
  std::vector<double> all = test::to_doubles(full), rows;
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t i = 0; i < s.local_len(); ++i)
      for (int64_t e = 0; e < width; ++e)
        rows.push_back(all[static_cast<size_t>((b * s.seq + s.global(i)) * width + e)]);
  Tensor t = Tensor::zeros({kB * s.local_len(), width}, DType::F64, Stream::cpu());
  std::copy(rows.begin(), rows.end(), t.data<double>());
  return t;
}

struct Problem {
  Setup setup;
  int64_t seq;
  cp::Split split;
  std::vector<int32_t> docs;  // [B, S] natural order
  Tensor q, k, v, dout;       // whole sequences [B·S, width], identical on every rank
  ops::AttentionArgs args;    // local arguments (seq = S / cp)
  std::shared_ptr<cp::SequenceLayout> layout;
  std::unique_ptr<cp::ContextParallelAttention> attention;
  parallel::ProcessGroups groups;
  Tensor docs_full;

  explicit Problem(const Setup& s) : setup(s) {
    comm::DistributedRuntime& rt = test::spmd::mpi_runtime();
    const int cp = rt.world().size();
    seq = 4 * cp;  // chunks of 2
    split = cp::Split{cp, rt.world().rank(), seq};
    for (int64_t b = 0; b < kB; ++b)
      for (int64_t i = 0; i < seq; ++i) docs.push_back(static_cast<int32_t>((i + 2 * b) / 3));  // 3-token documents
    q = test::random_tensor({kB * seq, kHq * kD}, 21, DType::F64, -1.5f, 1.5f);
    k = test::random_tensor({kB * seq, kHkv * kD}, 22, DType::F64, -1.5f, 1.5f);
    v = test::random_tensor({kB * seq, kHkv * kD}, 23, DType::F64);
    dout = test::random_tensor({kB * seq, kHq * kD}, 24, DType::F64);
    args = ops::AttentionArgs{.batch = kB, .seq = split.local_len(), .num_heads = kHq,
                              .num_kv_heads = kHkv, .head_dim = kD,
                              .mask = s.causal ? ops::AttentionMask::Causal : ops::AttentionMask::None,
                              .softmax_scale = 0.6f, .dropout_p = s.dropout, .dropout_seed = 5,
                              .dropout_site = 1, .sample_offset = 7, .head_offset = 4};
    ParallelConfig pc;
    pc.world_size = cp;
    pc.context_parallel_size = cp;
    pc.cp_comm_type = {cp::comm_type_from_name(s.comm)};
    if (s.comm == "a2a+p2p") pc.hierarchical_context_parallel_sizes = {2, cp / 2};
    groups = parallel::ProcessGroups::build(rt.world_shared(), pc);
    const ModelParallel mp = ModelParallel::from(groups, pc);
    attention = std::make_unique<cp::ContextParallelAttention>(cp::comm_type_from_name(s.comm), mp);
    layout = std::make_shared<cp::SequenceLayout>(kB, seq, cp, split.rank,
                                                  s.documents ? docs : std::vector<int32_t>{});
    docs_full = Tensor::from_ints(docs, {kB, seq});
  }

  /// CP forward on the shards of (q, k, v) -> this rank's out rows.
  Tensor forward(const Tensor& qf, const Tensor& kf, const Tensor& vf) const {
    cp::AttentionSaved saved;
    return attention->forward(shard_of(qf, split, kHq * kD), shard_of(kf, split, kHkv * kD),
                              shard_of(vf, split, kHkv * kD), args, *layout, saved, Stream::cpu());
  }

  /// The single-process attention over the whole sequences (identity maps, global dropout).
  ops::AttentionArgs whole_args() const {
    ops::AttentionArgs a = args;
    a.seq = seq;
    if (setup.documents) a.document_ids = &docs_full;
    return a;
  }

  double distributed_loss(const Tensor& qf, const Tensor& kf, const Tensor& vf) const {
    const Tensor out = forward(qf, kf, vf);
    Tensor sum = Tensor::from_floats({0.0f}, {1}, DType::F64);
    sum.data<double>()[0] = test::inner(shard_of(dout, split, kHq * kD), out);
    test::spmd::mpi_runtime().world().all_reduce(sum, comm::ReduceOp::Sum, Stream::cpu());
    return sum.data<double>()[0];
  }
};

/// The whole-tensor gradient from every rank's shard gradient (each row has one owner).
std::vector<double> gathered(const Tensor& local, const cp::Split& s, int64_t width) {
  std::vector<double> full(static_cast<size_t>(kB * s.seq * width), 0.0);
  const std::vector<double> l = test::to_doubles(local);
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t i = 0; i < s.local_len(); ++i)
      for (int64_t e = 0; e < width; ++e)
        full[static_cast<size_t>((b * s.seq + s.global(i)) * width + e)] =
            l[static_cast<size_t>((b * s.local_len() + i) * width + e)];
  Tensor t = Tensor::zeros({static_cast<int64_t>(full.size())}, DType::F64, Stream::cpu());
  std::copy(full.begin(), full.end(), t.data<double>());
  test::spmd::mpi_runtime().world().all_reduce(t, comm::ReduceOp::Sum, Stream::cpu());
  return test::to_doubles(t);
}

void check(const Setup& s) {
  const int cp = world_size();
  if (s.comm == "a2a" && (kHq % cp != 0 || kHkv % cp != 0)) GTEST_SKIP() << "a2a needs heads % cp";
  if (s.comm == "a2a+p2p" && cp % 2 != 0) GTEST_SKIP() << "a2a+p2p splits cp by 2";
  SCOPED_TRACE(s.comm + (s.causal ? " causal" : "") + (s.documents ? " documents" : "") +
               (s.dropout > 0 ? " dropout" : ""));
  Problem p(s);
  const Stream cpu = Stream::cpu();
  // Reference: the op on whole sequences, one process.
  const ops::AttentionArgs whole = p.whole_args();
  Tensor out = Tensor::zeros(p.q.shape(), DType::F64, cpu);
  Tensor lse = Tensor::zeros({kB, kHq, p.seq}, DType::F64, cpu);
  ops::attention_forward(p.q, p.k, p.v, out, lse, whole, cpu);
  Tensor dq = Tensor::zeros(p.q.shape(), DType::F64, cpu), dk = Tensor::zeros(p.k.shape(), DType::F64, cpu),
         dv = Tensor::zeros(p.v.shape(), DType::F64, cpu);
  ops::attention_backward(p.dout, p.q, p.k, p.v, out, lse, dq, dk, dv, whole, cpu);

  // Context parallel.
  cp::AttentionSaved saved;
  const Tensor out_cp = p.attention->forward(shard_of(p.q, p.split, kHq * kD), shard_of(p.k, p.split, kHkv * kD),
                                             shard_of(p.v, p.split, kHkv * kD), p.args, *p.layout, saved, cpu);
  EXPECT_LT(test::max_abs_diff(test::to_doubles(out_cp), test::to_doubles(shard_of(out, p.split, kHq * kD))), 1e-12);
  const cp::AttentionGrads g = p.attention->backward(shard_of(p.dout, p.split, kHq * kD), out_cp, saved,
                                                     p.args, *p.layout, cpu);
  EXPECT_FALSE(saved.q.defined());  // backward clears the record
  EXPECT_LT(test::max_abs_diff(test::to_doubles(g.dq), test::to_doubles(shard_of(dq, p.split, kHq * kD))), 1e-12);
  EXPECT_LT(test::max_abs_diff(test::to_doubles(g.dk), test::to_doubles(shard_of(dk, p.split, kHkv * kD))), 1e-12);
  EXPECT_LT(test::max_abs_diff(test::to_doubles(g.dv), test::to_doubles(shard_of(dv, p.split, kHkv * kD))), 1e-12);

  // Finite differences of the distributed loss for a few elements of each input.
  const std::vector<double> gq = gathered(g.dq, p.split, kHq * kD);
  const std::vector<double> gk = gathered(g.dk, p.split, kHkv * kD);
  const std::vector<double> gv = gathered(g.dv, p.split, kHkv * kD);
  struct Input {
    Tensor* t;
    const std::vector<double>* grad;
  };
  for (Input in : {Input{&p.q, &gq}, Input{&p.k, &gk}, Input{&p.v, &gv}}) {
    const int64_t n = in.t->numel();
    for (int64_t e : {int64_t{0}, n / 2 + 1, n - 1}) {
      double* x = in.t->data<double>() + e;
      const double orig = *x, h = 1e-6;
      *x = orig + h;
      const double up = p.distributed_loss(p.q, p.k, p.v);
      *x = orig - h;
      const double down = p.distributed_loss(p.q, p.k, p.v);
      *x = orig;
      const double fd = (up - down) / (2 * h), analytic = (*in.grad)[static_cast<size_t>(e)];
      EXPECT_NEAR(analytic, fd, test::kFiniteDiffRelTolF64 * std::max(1.0, std::fabs(fd)) * 10)
          << "element " << e;
    }
  }
}

void every_setup(const std::string& comm) {
  check({comm, false, false, 0.0f});
  check({comm, true, false, 0.2f});
  check({comm, false, true, 0.2f});
  check({comm, true, true, 0.0f});
}

}  // namespace

TEST(ContextParallelAttention, P2pRingMatchesOneProcessAndFiniteDifferences) { every_setup("p2p"); }
TEST(ContextParallelAttention, AllGatherMatchesOneProcessAndFiniteDifferences) { every_setup("all_gather"); }
TEST(ContextParallelAttention, A2aMatchesOneProcessAndFiniteDifferences) { every_setup("a2a"); }
TEST(ContextParallelAttention, A2aP2pMatchesOneProcessAndFiniteDifferences) { every_setup("a2a+p2p"); }
