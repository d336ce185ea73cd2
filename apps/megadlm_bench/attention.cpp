// megadlm_bench ops: the attention rows, each timed on both CUDA backends (suffix _cudnn: cuDNN's
// fused attention forced; _flash: megadlm's own kernels), at the 1.7B shape B=4 H=16 S=2048
// D=128 unless the name says otherwise:
//   attention_{fwd,bwd}[_causal]_{cudnn,flash}  dense rows, no mask / causal
//   attention_{fwd,bwd}_gqa4_{cudnn,flash}      4 query groups (Hkv = 4)
//   attention_{fwd,bwd}_s8192_{cudnn,flash}     B=1 S=8192 (the long-sequence shape)
//   attention_bwd_det_{cudnn,flash}             --deterministic-mode backward (the cost of it)
//   attention_{fwd,bwd}[_causal]_dropout_flash  p = 0.1 (own kernels only: global-coordinate mask)
//   attention_{fwd,bwd}_documents_{cudnn,flash} packed documents of ~256 tokens
//   attention_{fwd,bwd}_documents1k_{cudnn,flash} packed documents of ~1024 tokens
//   attention_{fwd,bwd}_documents256x_{cudnn,flash} packed documents of exactly 256 tokens
//   attention_{fwd,bwd}_s256_{cudnn,flash}      B=32 S=256: the same tokens as short dense rows
//   attention_fwd_canvas_b16[_leftpad|_rowlen|_packed]_{cudnn,flash}  the exact sampler's
//                                               batch-16 forward (S=288): dense, its left padding
//                                               as documents, the live tokens first with the
//                                               padding after them (row_lengths: cuDNN's padding
//                                               mask; the own kernels run it as documents), and
//                                               the rows packed without padding
//   attention_fwd_cached_b{1,8}                 Fast-dLLM's cached decoding: 32 query columns
//                                               against a 288-column canvas (kv_seq), the left
//                                               padding its own document (key_document_ids),
//                                               H=16 Hkv=8 D=128 (the context-parallel entry)
//   attention_{fwd,bwd}_bd_{s4096,s8192,s16384}_{flash,bulk}  block diffusion (BD3 mask, blocks
//                                               of 32, one document a row) over the doubled row:
//                                               B=4 S=4096 (L 2048), B=2 S=8192 (L 4096: auto's
//                                               threshold, ops/attention_support.h) and B=1 S=16384
//                                               (L 8192), H=16 D=128; flash:
//                                               the whole mask on the flash kernels; bulk: cuDNN
//                                               causal bulks + flash strips (the composed path,
//                                               called by name); the bulk rows' check is bulk vs
//                                               flash on the device, the flash rows' flash vs CPU
// FLOPs: 4 B H S^2 D forward (causal: half), 2.5x that backward; packed rows count only the
// products inside documents, so their rate compares with the dense rows per useful FLOP; block
// diffusion counts its visible pairs, L B + L^2 per row (docs/kernels/attention.md).
#include <algorithm>
#include <cmath>
#include <utility>
#include "megadlm/core/error.h"
#include "megadlm/ops/attention.h"
#include "megadlm_bench/bench.h"
#include "diffusion/block_rows.h"
#include "ops/attention_block_diffusion_bulk.h"

namespace megadlm::bench {
namespace {

/// Attention (forward, and with `backward` the backward too) on the device with `dev_args` and on
/// the CPU with `host_args` (the same but for the document tensors' device), on random q of
/// [batch, seq, heads, head_dim] and k, v with num_kv_heads. Both backwards start from the CPU
/// forward's out and lse, so that only the backward differs.
Check attention_check(const ops::AttentionArgs& dev_args, const ops::AttentionArgs& host_args,
                      bool backward, const Stream& s) {
  const ops::AttentionArgs& a = dev_args;
  const Shape qs{a.batch, a.seq, a.num_heads, a.head_dim};
  const Shape kvs{a.batch, a.seq, a.num_kv_heads, a.head_dim};
  Pair q = make_pair(qs, DType::BF16, s), k = make_pair(kvs, DType::BF16, s), v = make_pair(kvs, DType::BF16, s);
  Pair o = make_pair(qs, DType::BF16, s), lse = make_pair({a.batch, a.num_heads, a.seq}, DType::F32, s);
  ops::attention_forward(q.dev, k.dev, v.dev, o.dev, lse.dev, dev_args, s);
  ops::attention_forward(q.host, k.host, v.host, o.host, lse.host, host_args, Stream::cpu());
  Check c;
  c.add(rel_err(o.dev, o.host, s), kTolBf16);
  c.add(rel_err(lse.dev, lse.host, s), kTolF32);
  if (backward) {
    Pair dout = make_pair(qs, DType::BF16, s);
    Pair dq = make_pair(qs, DType::BF16, s), dk = make_pair(kvs, DType::BF16, s), dv = make_pair(kvs, DType::BF16, s);
    Tensor o_dev = o.host.to(s.device(), DType::BF16, s), lse_dev = lse.host.to(s.device(), s);
    ops::attention_backward(dout.dev, q.dev, k.dev, v.dev, o_dev, lse_dev, dq.dev, dk.dev, dv.dev, dev_args, s);
    ops::attention_backward(dout.host, q.host, k.host, v.host, o.host, lse.host, dq.host, dk.host, dv.host,
                            host_args, Stream::cpu());
    c.add(rel_err(dq.dev, dq.host, s), kTolBf16);
    c.add(rel_err(dk.dev, dk.host, s), kTolBf16);
    c.add(rel_err(dv.dev, dv.host, s), kTolBf16);
  }
  return c;
}

/// Documents of 180..332 tokens (mean ~256) packed into rows; the ids, the starts of the
/// document_starts contract, and the sum of squared lengths (the visible (query, key) pairs).
struct Packing {
  std::vector<int32_t> ids, starts;
  double pairs = 0;
};

/// How a packed row is cut: documents of ~256 or ~1024 tokens, or a generation canvas (the
/// sampler's left padding: row b's first b % 4 columns a document of their own, the rest one).
/// RightPad: the same rows with the padding at the end (what InferenceModel hands the model,
/// with AttentionArgs::row_lengths). PackedRows: that canvas without its padding, the 16 rows
/// one document each in one row.
enum class Docs { None, Mean256, Exact256, Mean1024, LeftPad, RightPad, PackedRows };

Packing pack_documents(int64_t batch, int64_t seq, Docs kind) {
  const std::vector<int> lengths = {256, 200, 312, 256, 180, 332};
  const int64_t scale = kind == Docs::Mean1024 ? 4 : 1;
  Packing p;
  for (int64_t b = 0; b < batch; ++b) {
    int32_t doc = 0;
    int64_t i = 0;
    while (i < seq) {
      int64_t len = std::min<int64_t>(scale * lengths[static_cast<size_t>(b + doc) % lengths.size()], seq - i);
      if (kind == Docs::Exact256) len = std::min<int64_t>(256, seq - i);
      if (kind == Docs::LeftPad) len = doc == 0 && b % 4 != 0 ? b % 4 : seq - i;
      if (kind == Docs::RightPad) len = doc == 0 ? seq - b % 4 : seq - i;
      if (kind == Docs::PackedRows) len = std::min<int64_t>(288 - doc % 4, seq - i);
      p.starts.push_back(static_cast<int32_t>(b * seq + i));
      for (int64_t j = 0; j < len; ++j) p.ids.push_back(doc);
      p.pairs += static_cast<double>(len) * static_cast<double>(len);
      i += len;
      ++doc;
    }
  }
  p.starts.push_back(static_cast<int32_t>(batch * seq));
  return p;
}

struct Shape4 {
  int64_t batch, seq, heads, kv_heads, dim;
};

struct RowSpec {
  std::string name, shape;
  Shape4 big;  ///< the timed case
  ops::AttentionMask mask = ops::AttentionMask::None;
  ops::AttentionBackend backend = ops::AttentionBackend::Flash;
  float dropout = 0.0f;
  bool deterministic = false;
  Docs documents = Docs::None;
  bool backward = false;
};

ops::AttentionArgs args_for(const Shape4& x, const RowSpec& r) {
  ops::AttentionArgs a{.batch = x.batch, .seq = x.seq, .num_heads = x.heads, .num_kv_heads = x.kv_heads,
                       .head_dim = x.dim, .mask = r.mask,
                       .softmax_scale = 1.0f / std::sqrt(static_cast<float>(x.dim)),
                       .dropout_p = r.dropout, .dropout_seed = 9, .dropout_site = 1};
  a.backend = r.backend;
  a.deterministic = r.deterministic;
  return a;
}

OpBench attention_row(const RowSpec& r) {
  OpBench b;
  b.name = r.name;
  b.shape = r.shape;
  const Shape4 x = r.big;
  const double causal = r.mask == ops::AttentionMask::Causal ? 0.5 : 1.0;
  const double pairs = r.documents != Docs::None ? pack_documents(x.batch, x.seq, r.documents).pairs
                                   : causal * static_cast<double>(x.batch) * x.seq * x.seq;
  const double fwd_flops = 4.0 * x.heads * x.dim * pairs;
  b.flops = r.backward ? 2.5 * fwd_flops : fwd_flops;
  b.check = [r](const Stream& s) {
    // Small case with the row's options: 2 rows of 333 (two documents a row when packed, a
    // ragged end), the row's head grouping scaled down.
    const bool docs = r.documents != Docs::None;
    const Shape4 c{docs ? 4 : 2, docs ? 333 : 128, 4, r.big.kv_heads == r.big.heads ? 4 : 1, r.big.dim};
    ops::AttentionArgs a = args_for(c, r), a_host = a;
    Tensor doc_host, doc_dev, starts_dev;
    if (docs) {
      // RightPad runs its documents here: row_lengths leaves the padding's outputs unspecified
      // (gpu_parity checks the live rows of the hint).
      const bool canvas = r.documents == Docs::LeftPad || r.documents == Docs::RightPad;
      const Packing p = pack_documents(c.batch, c.seq, canvas ? r.documents : Docs::Mean256);
      doc_host = Tensor::from_ints(p.ids, {c.batch, c.seq});
      doc_dev = device_ints(p.ids, s);
      starts_dev = device_ints(p.starts, s);
      a.document_ids = &doc_dev;
      a.document_starts = &starts_dev;
      a_host.document_ids = &doc_host;
    }
    return attention_check(a, a_host, r.backward, s);
  };
  b.setup = [r, x](const Stream& s) -> std::function<void()> {
    const Shape qs{x.batch, x.seq, x.heads, x.dim}, kvs{x.batch, x.seq, x.kv_heads, x.dim};
    ops::AttentionArgs a = args_for(x, r);
    Tensor docs, starts, lengths;
    if (r.documents != Docs::None) {
      const Packing p = pack_documents(x.batch, x.seq, r.documents);
      docs = device_ints(p.ids, s);
      starts = device_ints(p.starts, s);
      a.document_ids = &docs;
      a.document_starts = &starts;
    }
    const bool row_lengths = r.documents == Docs::RightPad;
    if (row_lengths) {
      std::vector<int32_t> live;
      for (int64_t b = 0; b < x.batch; ++b) live.push_back(static_cast<int32_t>(x.seq - b % 4));
      lengths = device_ints(live, s);
      a.row_lengths = &lengths;
    }
    Tensor q = random_device(qs, DType::BF16, s), k = random_device(kvs, DType::BF16, s);
    Tensor v = random_device(kvs, DType::BF16, s), o = Tensor::empty(qs, DType::BF16, s);
    Tensor lse = Tensor::empty({x.batch, x.heads, x.seq}, DType::F32, s);
    ops::attention_forward(q, k, v, o, lse, a, s);  // the saved out/lse backward reads
    Tensor dout = random_device(qs, DType::BF16, s), dq = Tensor::empty(qs, DType::BF16, s);
    Tensor dk = Tensor::empty(kvs, DType::BF16, s), dv = Tensor::empty(kvs, DType::BF16, s);
    const bool documents = r.documents != Docs::None, backward = r.backward;
    // a points at the closure's own copies of docs/starts (locals here would dangle).
    return [=, &s]() mutable {
      if (documents) {
        a.document_ids = &docs;
        a.document_starts = &starts;
      }
      if (row_lengths) a.row_lengths = &lengths;
      if (backward) ops::attention_backward(dout, q, k, v, o, lse, dq, dk, dv, a, s);
      else ops::attention_forward(q, k, v, o, lse, a, s);
    };
  };
  return b;
}

/// Ids of a left-padded canvas: row b's first pads(b) columns are document 0, the rest 1.
std::vector<int32_t> padded_canvas(int64_t batch, int64_t col0, int64_t col1) {
  std::vector<int32_t> ids;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = col0; i < col1; ++i) ids.push_back(i < (b * 37) % 120 ? 0 : 1);
  return ids;
}

/// One cached-decoding step of one layer: q [B, 32, 16, 128] against the canvas k, v
/// [B, 288, 8, 128] (model/attention_cached.cpp's call).
OpBench cached_decoding_row(int64_t batch) {
  constexpr int64_t kWindow = 32, kCanvas = 288, kHeads = 16, kKvHeads = 8, kDim = 128;
  OpBench b;
  b.name = detail::concat("attention_fwd_cached_b", batch);
  b.shape = detail::concat("B=", batch, " H=16 Hkv=8 D=128, 32 queries x 288 keys, padding docs");
  b.flops = 4.0 * kHeads * kDim * static_cast<double>(batch) * kWindow * kCanvas;
  auto args = [](int64_t bt) {
    ops::AttentionArgs a{.batch = bt, .seq = kWindow, .num_heads = kHeads, .num_kv_heads = kKvHeads,
                         .head_dim = kDim,
                         .softmax_scale = 1.0f / std::sqrt(static_cast<float>(kDim))};
    a.kv_seq = kCanvas;
    return a;
  };
  b.check = [args](const Stream& s) {
    const int64_t bt = 3;
    ops::AttentionArgs a = args(bt), a_host = a;
    const std::vector<int32_t> qids = padded_canvas(bt, 128, 128 + kWindow), kids = padded_canvas(bt, 0, kCanvas);
    Tensor qd_host = Tensor::from_ints(qids, {bt, kWindow}), kd_host = Tensor::from_ints(kids, {bt, kCanvas});
    Tensor qd = device_ints(qids, s), kd = device_ints(kids, s);
    a.document_ids = &qd;
    a.key_document_ids = &kd;
    a_host.document_ids = &qd_host;
    a_host.key_document_ids = &kd_host;
    Pair q = make_pair({bt, kWindow, kHeads, kDim}, DType::BF16, s);
    Pair k = make_pair({bt, kCanvas, kKvHeads, kDim}, DType::BF16, s);
    Pair v = make_pair({bt, kCanvas, kKvHeads, kDim}, DType::BF16, s);
    Pair o = make_pair({bt, kWindow, kHeads, kDim}, DType::BF16, s);
    Pair lse = make_pair({bt, kHeads, kWindow}, DType::F32, s);
    ops::attention_forward(q.dev, k.dev, v.dev, o.dev, lse.dev, a, s);
    ops::attention_forward(q.host, k.host, v.host, o.host, lse.host, a_host, Stream::cpu());
    Check c;
    c.add(rel_err(o.dev, o.host, s), kTolBf16);
    c.add(rel_err(lse.dev, lse.host, s), kTolF32);
    return c;
  };
  b.setup = [args, batch](const Stream& s) -> std::function<void()> {
    ops::AttentionArgs a = args(batch);
    Tensor qd = device_ints(padded_canvas(batch, 128, 128 + kWindow), s);
    Tensor kd = device_ints(padded_canvas(batch, 0, kCanvas), s);
    Tensor q = random_device({batch, kWindow, kHeads, kDim}, DType::BF16, s);
    Tensor k = random_device({batch, kCanvas, kKvHeads, kDim}, DType::BF16, s);
    Tensor v = random_device({batch, kCanvas, kKvHeads, kDim}, DType::BF16, s);
    Tensor o = Tensor::empty({batch, kWindow, kHeads, kDim}, DType::BF16, s);
    Tensor lse = Tensor::empty({batch, kHeads, kWindow}, DType::F32, s);
    return [=, &s]() mutable {
      a.document_ids = &qd;  // the closure's own copies (locals here would dangle)
      a.key_document_ids = &kd;
      ops::attention_forward(q, k, v, o, lse, a, s);
    };
  };
  return b;
}

/// block_ranges of rows holding one document each, in blocks of `block` (the library's builder).
std::vector<int32_t> one_document_ranges(int64_t batch, int64_t L, int64_t block) {
  std::vector<int32_t> r(static_cast<size_t>(batch * 4 * L));
  for (int64_t b = 0; b < batch; ++b)
    megadlm::block_rows::set_document(r.data() + b * 4 * L, L, 0, L, block, [](int64_t, int64_t) {});
  return r;
}

ops::AttentionArgs bd_args(const Shape4& x, int64_t block) {
  ops::AttentionArgs a{.batch = x.batch, .seq = x.seq, .num_heads = x.heads, .num_kv_heads = x.kv_heads,
                       .head_dim = x.dim, .mask = ops::AttentionMask::BlockDiffusion,
                       .softmax_scale = 1.0f / std::sqrt(static_cast<float>(x.dim))};
  a.backend = ops::AttentionBackend::Flash;  // the whole mask on the flash kernels
  a.block_diffusion_max_block = block;       // the promise (one document a row), for bulk
  return a;
}

/// The path of a block diffusion row: the public op under --attention-backend flash, or the
/// composed path by name (its pieces under auto: cuDNN causal bulks, flash strips).
void bd_forward(bool bulk, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o, Tensor& lse,
                ops::AttentionArgs a, const Stream& s) {
  if (!bulk) return ops::attention_forward(q, k, v, o, lse, a, s);
  a.backend = ops::AttentionBackend::Auto;
  ops::detail::block_diffusion_bulk_forward(q, k, v, o, lse, a, s);
}

void bd_backward(bool bulk, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& o, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                 ops::AttentionArgs a, const Stream& s) {
  if (!bulk) return ops::attention_backward(dout, q, k, v, o, lse, dq, dk, dv, a, s);
  a.backend = ops::AttentionBackend::Auto;
  ops::detail::block_diffusion_bulk_backward(dout, q, k, v, o, lse, dq, dk, dv, a, s);
}

OpBench block_diffusion_row(const Shape4& x, int64_t block, bool bulk, bool backward) {
  OpBench b;
  b.name = detail::concat("attention_", backward ? "bwd" : "fwd", "_bd_s", x.seq, bulk ? "_bulk" : "_flash");
  b.shape = detail::concat("B=", x.batch, " H=", x.heads, " S=", x.seq, " (L ", x.seq / 2, ") D=", x.dim,
                           ", block ", block, ", one document a row");
  const double L = static_cast<double>(x.seq / 2);
  const double pairs = static_cast<double>(x.batch) * (L * static_cast<double>(block) + L * L);
  b.flops = (backward ? 2.5 : 1.0) * 4.0 * x.heads * x.dim * pairs;
  b.check = [block, bulk, backward](const Stream& s) {
    // L = 256 in blocks of 32, GQA 4/2. Flash vs the CPU; bulk vs flash on the same inputs
    // (both backwards from the flash forward's out and lse).
    const Shape4 c{2, 512, 4, 2, 128};
    const std::vector<int32_t> ranges = one_document_ranges(c.batch, c.seq / 2, block);
    Tensor r_host = Tensor::from_ints(ranges, {c.batch, 4, c.seq / 2}), r_dev = device_ints(ranges, s).view({c.batch, 4, c.seq / 2});
    ops::AttentionArgs a = bd_args(c, block), a_host = a;
    a.block_ranges = &r_dev;
    a_host.block_ranges = &r_host;
    if (!bulk) return attention_check(a, a_host, backward, s);
    const Shape qs{c.batch, c.seq, c.heads, c.dim}, kvs{c.batch, c.seq, c.kv_heads, c.dim};
    const Tensor q = random_device(qs, DType::BF16, s), k = random_device(kvs, DType::BF16, s),
                 v = random_device(kvs, DType::BF16, s), dout = random_device(qs, DType::BF16, s);
    Tensor o = Tensor::empty(qs, DType::BF16, s), lse = Tensor::empty({c.batch, c.heads, c.seq}, DType::F32, s);
    Tensor o2 = Tensor::empty(qs, DType::BF16, s), lse2 = Tensor::empty({c.batch, c.heads, c.seq}, DType::F32, s);
    bd_forward(false, q, k, v, o, lse, a, s);
    bd_forward(true, q, k, v, o2, lse2, a, s);
    auto host = [&](const Tensor& t) { return t.to(Device::cpu(), DType::F32, s); };
    Check ck;
    ck.add(rel_err(o2, host(o), s), kTolBf16);
    ck.add(rel_err(lse2, host(lse), s), kTolF32);
    if (backward) {
      Tensor dq = Tensor::empty(qs, DType::BF16, s), dk = Tensor::empty(kvs, DType::BF16, s),
             dv = Tensor::empty(kvs, DType::BF16, s);
      Tensor dq2 = Tensor::empty(qs, DType::BF16, s), dk2 = Tensor::empty(kvs, DType::BF16, s),
             dv2 = Tensor::empty(kvs, DType::BF16, s);
      bd_backward(false, dout, q, k, v, o, lse, dq, dk, dv, a, s);
      bd_backward(true, dout, q, k, v, o, lse, dq2, dk2, dv2, a, s);
      ck.add(rel_err(dq2, host(dq), s), kTolBf16);
      ck.add(rel_err(dk2, host(dk), s), kTolBf16);
      ck.add(rel_err(dv2, host(dv), s), kTolBf16);
    }
    return ck;
  };
  b.setup = [x, block, bulk, backward](const Stream& s) -> std::function<void()> {
    const Shape qs{x.batch, x.seq, x.heads, x.dim}, kvs{x.batch, x.seq, x.kv_heads, x.dim};
    Tensor ranges = device_ints(one_document_ranges(x.batch, x.seq / 2, block), s).view({x.batch, 4, x.seq / 2});
    ops::AttentionArgs a = bd_args(x, block);
    a.block_ranges = &ranges;
    Tensor q = random_device(qs, DType::BF16, s), k = random_device(kvs, DType::BF16, s);
    Tensor v = random_device(kvs, DType::BF16, s), o = Tensor::empty(qs, DType::BF16, s);
    Tensor lse = Tensor::empty({x.batch, x.heads, x.seq}, DType::F32, s);
    bd_forward(bulk, q, k, v, o, lse, a, s);  // the saved out/lse backward reads
    Tensor dout = random_device(qs, DType::BF16, s), dq = Tensor::empty(qs, DType::BF16, s);
    Tensor dk = Tensor::empty(kvs, DType::BF16, s), dv = Tensor::empty(kvs, DType::BF16, s);
    return [=, &s]() mutable {
      a.block_ranges = &ranges;  // the closure's own copy (a local here would dangle)
      if (backward) bd_backward(bulk, dout, q, k, v, o, lse, dq, dk, dv, a, s);
      else bd_forward(bulk, q, k, v, o, lse, a, s);
    };
  };
  return b;
}

}  // namespace

std::vector<OpBench> attention_benches() {
  std::vector<OpBench> out;
  const Shape4 dense{4, 2048, 16, 16, 128}, gqa{4, 2048, 16, 4, 128}, long_rows{1, 8192, 16, 16, 128};
  const std::pair<ops::AttentionBackend, const char*> backends[] = {
      {ops::AttentionBackend::Cudnn, "_cudnn"}, {ops::AttentionBackend::Flash, "_flash"}};
  auto add = [&](RowSpec r, const char* stem, const char* shape) {
    for (bool backward : {false, true}) {
      r.backward = backward;
      r.name = detail::concat("attention_", backward ? "bwd" : "fwd", stem);
      r.shape = shape;
      out.push_back(attention_row(r));
    }
  };
  for (const auto& [backend, suffix] : backends) {
    RowSpec r;
    r.backend = backend;
    r.big = dense;
    for (ops::AttentionMask mask : {ops::AttentionMask::None, ops::AttentionMask::Causal}) {
      r.mask = mask;
      add(r, detail::concat(mask == ops::AttentionMask::Causal ? "_causal" : "", suffix).c_str(),
          "B=4 H=16 S=2048 D=128 bf16");
    }
    r.mask = ops::AttentionMask::None;
    r.big = gqa;
    add(r, detail::concat("_gqa4", suffix).c_str(), "B=4 H=16 Hkv=4 S=2048 D=128");
    r.big = long_rows;
    add(r, detail::concat("_s8192", suffix).c_str(), "B=1 H=16 S=8192 D=128 bf16");
    r.big = dense;
    r.deterministic = true;
    r.backward = true;
    r.name = detail::concat("attention_bwd_det", suffix);
    r.shape = "B=4 H=16 S=2048 D=128, deterministic";
    out.push_back(attention_row(r));
    r.deterministic = false;
    r.documents = Docs::Mean256;
    add(r, detail::concat("_documents", suffix).c_str(), "B=4 H=16 S=2048 D=128, docs ~256");
    r.documents = Docs::Mean1024;
    add(r, detail::concat("_documents1k", suffix).c_str(), "B=4 H=16 S=2048 D=128, docs ~1024");
    // What short documents cost apart from their ragged ends: documents of exactly 256 (two
    // whole 128-tiles each), and the same tokens as 32 dense rows of 256 (no documents at all).
    r.documents = Docs::Exact256;
    add(r, detail::concat("_documents256x", suffix).c_str(), "B=4 H=16 S=2048 D=128, docs of 256");
    r.documents = Docs::None;
    r.big = Shape4{32, 256, 16, 16, 128};
    add(r, detail::concat("_s256", suffix).c_str(), "B=32 H=16 S=256 D=128 bf16");
    r.big = dense;
  }
  // The exact sampler's forward at batch 16 (prompts of 29-32 tokens + 256 generated): the
  // canvas dense, and with the left padding as documents (what a batch of ragged prompts runs).
  for (const auto& [backend, suffix] : backends) {
    for (Docs docs : {Docs::None, Docs::LeftPad, Docs::RightPad, Docs::PackedRows}) {
      RowSpec r;
      r.backend = backend;
      r.big = docs == Docs::PackedRows ? Shape4{1, 16 * 288 - 24, 16, 16, 128} : Shape4{16, 288, 16, 16, 128};
      r.documents = docs;
      r.name = detail::concat("attention_fwd_canvas_b16",
                              docs == Docs::None      ? ""
                              : docs == Docs::LeftPad  ? "_leftpad"
                              : docs == Docs::RightPad ? "_rowlen"
                                                       : "_packed",
                              suffix);
      r.shape = docs == Docs::None       ? "B=16 H=16 S=288 D=128"
                : docs == Docs::LeftPad  ? "B=16 H=16 S=288 D=128, pads 0-3 as documents"
                : docs == Docs::RightPad ? "B=16 H=16 S=288 D=128, pads 0-3 at the end, row_lengths"
                                         : "B=1 H=16 S=4584 D=128, the 16 rows as documents, no pads";
      out.push_back(attention_row(r));
    }
  }
  // Attention dropout (Megatron's default p = 0.1): same flops; the difference in time is the
  // cost of drawing the mask (forward) and redrawing it (backward). Own kernels only.
  for (ops::AttentionMask mask : {ops::AttentionMask::None, ops::AttentionMask::Causal}) {
    RowSpec r;
    r.big = dense;
    r.mask = mask;
    r.dropout = 0.1f;
    add(r, mask == ops::AttentionMask::Causal ? "_causal_dropout_flash" : "_dropout_flash",
        "B=4 H=16 S=2048 D=128 bf16 p=0.1");
  }
  for (int64_t batch : {1, 8}) out.push_back(cached_decoding_row(batch));
  // Block diffusion at the 1.7B shape: the whole mask on the flash kernels vs the composed path.
  for (const Shape4 x : {Shape4{4, 4096, 16, 16, 128}, Shape4{2, 8192, 16, 16, 128}, Shape4{1, 16384, 16, 16, 128}})
    for (bool backward : {false, true})
      for (bool bulk : {false, true}) out.push_back(block_diffusion_row(x, 32, bulk, backward));
  return out;
}

}  // namespace megadlm::bench
