// Block-diffusion likelihood estimators (diffusion/likelihood.h) on CUDA against the CPU: the same
// bf16-representable weights in a bf16 CUDA model and an f32 CPU model with the block-diffusion
// attention (block-causal clean half, and causal), the doubled [x_t | x_0] rows with block size
// 8: the block ELBO of three 24-token samples (and the causal clean half's AR NLL), and log p(answer | context) of requests whose
// answers lie inside one block, across three and in a ragged last block. The Monte-Carlo draws are
// the same on both sides (host Philox), so only the forward differs: bf16 activations and logits.
// Bound (stated, per number): |gpu - cpu| <= 0.02 * |cpu| + 0.01 * (scored tokens per row) for
// the log-likelihood, <= 0.02 * cpu for the ELBO per token — bf16's relative rounding (2^-8) on
// two layers, summed over the masked tokens; a wrong mask or block range moves these numbers by
// whole nats.
#include <gtest/gtest.h>
#include <cmath>
#include <cstdio>
#include <string>
#include "megadlm/diffusion/likelihood.h"
#include "megadlm/model/gpt_model.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

TransformerConfig config(bool causal_clean) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 128;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 32;
  c.ffn_hidden_size = 256;
  c.seq_length = 24;
  c.max_position_embeddings = 32;
  c.position_embedding_type = PositionEmbeddingType::Rope;
  c.normalization = NormType::RMSNorm;
  c.qk_layernorm = true;
  c.activation = MlpActivation::SwiGLU;
  c.vocab_size = c.padded_vocab_size = 64;
  c.init_method_std = 0.1f;
  c.attention_dropout = c.hidden_dropout = 0;
  c.attention_mask = AttentionMaskType::BlockCausal;
  c.block_diffusion_causal_clean = causal_clean;
  return c;
}

// One side: the model behind LogitsModel with its block ranges (what InferenceModel does).
class Side : public LogitsModel {
 public:
  Side(const TransformerConfig& cfg, Stream s, DType dt) : model(cfg, store) {
    rt.stream = s;
    rt.dtype = dt;
    rt.training = false;
    store.materialize(dt, 11, s);
  }
  int64_t vocab_size() const override { return 64; }
  const Stream& stream() const override { return rt.stream; }
  Tensor logits(const CanvasBatch& c, const std::vector<int32_t>& rows) override {
    HostMicroBatch h;
    h.batch = c.batch;
    h.seq = c.seq;
    h.input_ids = h.labels = c.tokens;
    h.positions = c.positions;
    h.block_ranges = c.block_ranges;
    h.loss_weights.assign(c.tokens.size(), 0.0f);
    Tensor idx = Tensor::from_ints(rows, {static_cast<int64_t>(rows.size())});
    if (rt.stream.is_cuda()) idx = idx.to(rt.stream.device(), rt.stream);
    return model.logits_at(MicroBatch::upload(h, rt.stream), idx, rt, 64);
  }
  ParameterStore store;
  GptModel model;
  ModelRuntime rt;
};

}  // namespace

TEST(BlockLikelihoodParity, ElboAndLoglikelihoodMatchTheCpu) {
  MDLM_REQUIRE_GPU();
  for (const bool causal : {false, true}) {
    const TransformerConfig cfg = config(causal);
    Side cpu(cfg, Stream::cpu(), DType::F32);
    Side gpu(cfg, gpu_stream(), DType::BF16);
    for (size_t h = 0; h < cpu.store.descs().size(); ++h) {  // the CPU weights rounded to bf16, on both
      Tensor p = cpu.store.param(static_cast<int>(h));
      std::vector<float> v = p.to_floats(Stream::cpu());
      for (float& x : v) x = round_to_bf16(x);
      Tensor rounded = Tensor::from_floats(v, p.shape());
      copy_tensor(rounded, p, Stream::cpu());
      Tensor g = gpu.store.param(static_cast<int>(h));
      copy_tensor(rounded, g, gpu.rt.stream);
    }
    gpu.rt.stream.synchronize();
    const std::string tag = causal ? "causal clean half" : "block-causal clean half";
    // ELBO: 3 samples of 24 tokens (+1), 3 blocks each, one noise draw per block.
    std::vector<std::vector<int32_t>> samples;
    for (int b = 0; b < 3; ++b) {
      std::vector<int32_t> s;
      for (int i = 0; i <= 24; ++i) s.push_back(static_cast<int32_t>(1 + (b * 19 + i * 7) % 62));
      samples.push_back(s);
    }
    DiffusionConfig dc;
    dc.mask_token = 63;
    dc.varilen_prob = 0;
    dc.block_size = 8;
    dc.loss_weight = DlmLossWeight::InvTEps;
    if (causal) dc.ar_loss_weight = 1.0f;  // a causal clean half: its exact AR NLL too
    const ElboResult ec = monte_carlo_elbo(cpu, samples, 0, dc, 17, 2);
    const ElboResult eg = monte_carlo_elbo(gpu, samples, 0, dc, 17, 2);
    std::printf("[parity] BlockLikelihoodParity %s: ELBO cpu %.6f gpu %.6f (diff %.2e)\n", tag.c_str(),
                ec.per_token(), eg.per_token(), eg.per_token() - ec.per_token());
    EXPECT_EQ(eg.tokens, ec.tokens);
    EXPECT_LE(std::abs(eg.per_token() - ec.per_token()), 0.02 * ec.per_token()) << tag;
    EXPECT_EQ(eg.ar_tokens, ec.ar_tokens);
    if (causal) {
      ASSERT_EQ(ec.ar_tokens, 3.0 * 23);
      const double ac = ec.ar_nll_sum / ec.ar_tokens, ag = eg.ar_nll_sum / eg.ar_tokens;
      std::printf("[parity] BlockLikelihoodParity %s: AR NLL cpu %.6f gpu %.6f (diff %.2e)\n", tag.c_str(), ac, ag,
                  ag - ac);
      EXPECT_LE(std::abs(ag - ac), 0.02 * ac) << tag;
    }
    // log p(answer | context).
    const std::vector<LikelihoodRequest> reqs = {
        {{5, 17, 33, 2, 9}, {14, 61, 7}, 0},                                   // inside block 0
        {{10, 3, 4, 5, 6, 7, 8, 9, 11}, {44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58}, 1},  // 3 blocks
        {{}, {8, 8, 9, 10, 11, 12, 13, 14, 15, 16, 30, 31, 32}, 2},             // ragged last block
    };
    LikelihoodConfig lc;
    lc.mc_num = 8;
    lc.mc_batch = 4;
    lc.mask_token = 63;
    lc.seed = 23;
    lc.block_size = 8;
    for (const LikelihoodRequest& r : reqs) {
      const double c = conditional_loglikelihood(cpu, r, lc).loglikelihood;
      const double g = conditional_loglikelihood(gpu, r, lc).loglikelihood;
      const double bound = 0.02 * std::abs(c) + 0.01 * static_cast<double>(r.continuation.size());
      std::printf("[parity] BlockLikelihoodParity %s: request %lld loglik cpu %.5f gpu %.5f (diff %.2e, bound %.2e)\n",
                  tag.c_str(), static_cast<long long>(r.index), c, g, g - c, bound);
      EXPECT_LE(std::abs(g - c), bound) << tag << ", request " << r.index;
    }
  }
}
