#include "megadlm/model/micro_batch.h"
#include <algorithm>
#include <vector>
#include "megadlm/ops/attention.h"
#include "megadlm/parallel/context_parallel/sequence_split.h"

namespace megadlm {

namespace {

void check_sizes(const HostMicroBatch& h) {
  const int64_t t = h.batch * h.seq;
  MDLM_CHECK(static_cast<int64_t>(h.input_ids.size()) == t &&
                 static_cast<int64_t>(h.labels.size()) == t &&
                 static_cast<int64_t>(h.loss_weights.size()) == t &&
                 static_cast<int64_t>(h.positions.size()) == t,
             "micro-batch arrays must have batch*seq = ", t, " entries");
  MDLM_CHECK(h.document_ids.empty() || static_cast<int64_t>(h.document_ids.size()) == t,
             "micro-batch document_ids must have batch*seq = ", t, " entries");
  MDLM_CHECK(h.block_ranges.empty() || (h.seq % 2 == 0 && static_cast<int64_t>(h.block_ranges.size()) == 2 * t),
             "micro-batch block_ranges must have batch*4*(seq/2) = ", 2 * t, " entries");
}

/// Each row of `v` ([batch, seq]) extended to `len` values, new ones from fill(b, i).
template <typename T, typename F>
std::vector<T> pad_rows(const std::vector<T>& v, int64_t batch, int64_t seq, int64_t len, F fill) {
  std::vector<T> out(static_cast<size_t>(batch * len));
  for (int64_t b = 0; b < batch; ++b) {
    std::copy(v.begin() + b * seq, v.begin() + (b + 1) * seq, out.begin() + b * len);
    for (int64_t i = seq; i < len; ++i) out[static_cast<size_t>(b * len + i)] = fill(b, i);
  }
  return out;
}

/// The device tensors of the rows `h` holds (all of them, or one CP rank's shard).
MicroBatch upload_rows(const HostMicroBatch& h, const Stream& stream) {
  const int64_t t = h.batch * h.seq;
  MicroBatch mb;
  mb.batch = h.batch;
  mb.seq = h.seq;
  mb.first_sample = h.first_sample;
  mb.loss_tokens = h.loss_tokens;
  const Device dev = stream.device();
  mb.input_ids = Tensor::from_ints(h.input_ids, {t}).to(dev, stream);
  mb.labels = Tensor::from_ints(h.labels, {t}).to(dev, stream);
  mb.positions = Tensor::from_ints(h.positions, {t}).to(dev, stream);
  mb.loss_weights = Tensor::from_floats(h.loss_weights, {t}).to(dev, stream);
  if (!h.document_ids.empty()) {
    mb.document_ids = Tensor::from_ints(h.document_ids, {t}).to(dev, stream);
    std::vector<int32_t> starts;
    for (int64_t b = 0; b < h.batch; ++b)
      for (int64_t i = 0; i < h.seq; ++i) {
        const size_t k = static_cast<size_t>(b * h.seq + i);
        if (i == 0 || h.document_ids[k] != h.document_ids[k - 1]) starts.push_back(static_cast<int32_t>(k));
      }
    starts.push_back(static_cast<int32_t>(t));
    mb.document_starts = Tensor::from_ints(starts, {static_cast<int64_t>(starts.size())}).to(dev, stream);
  }
  if (!h.block_ranges.empty()) {
    mb.block_ranges = Tensor::from_ints(h.block_ranges, {h.batch, 4, h.seq / 2}).to(dev, stream);
    mb.block_diffusion_max_block =
        ops::block_diffusion_one_document_max_block(h.block_ranges.data(), h.batch, h.seq / 2);
  }
  std::vector<int32_t> rows;
  for (int64_t i = 0; i < t; ++i)
    if (h.loss_weights[static_cast<size_t>(i)] != 0.0f) rows.push_back(static_cast<int32_t>(i));
  mb.loss_rows = Tensor::from_ints(rows, {static_cast<int64_t>(rows.size())}).to(dev, stream);
  return mb;
}

/// Block diffusion under CP (docs/parallelism/context_parallel.md): the ORIGINAL positions
/// 0..L-1 are split into 2·cp chunks, and this rank keeps both copies of its chunks: local row
/// [x_t of its positions | x_0 of its positions]. The doubled rows [B, 2L] are [2B, L] rows of
/// one copy each, so that is shard_rows over 2B rows of L, and the layout describes them so.
MicroBatch upload_block_diffusion(const HostMicroBatch& h, const Stream& stream, int cp_rank,
                                  int cp_size) {
  const int64_t L = h.seq / 2;
  MDLM_CHECK(h.document_ids.empty(), "block diffusion micro-batches hold their documents in "
             "block_ranges, not document_ids");
  MDLM_CHECK(L % (2 * cp_size) == 0, "block diffusion under context parallelism: the sequence "
             "length ", L, " does not split into 2 x ", cp_size, " chunks (--seq-length a multiple "
             "of 2 x --context-parallel-size x --dlm-block-size)");
  const cp::Split split{cp_size, cp_rank, L};
  HostMicroBatch local;
  local.batch = h.batch;
  local.seq = 2 * split.local_len();
  local.first_sample = h.first_sample;
  local.loss_tokens = h.loss_tokens;  // the normaliser counts the whole micro-batch
  local.input_ids = cp::shard_rows(h.input_ids, 2 * h.batch, split);
  local.labels = cp::shard_rows(h.labels, 2 * h.batch, split);
  local.positions = cp::shard_rows(h.positions, 2 * h.batch, split);
  local.loss_weights = cp::shard_rows(h.loss_weights, 2 * h.batch, split);
  MicroBatch mb = upload_rows(local, stream);
  // The ranges stay whole: the attention maps each shard's rows to their global positions.
  mb.block_ranges = Tensor::from_ints(h.block_ranges, {h.batch, 4, L}).to(stream.device(), stream);
  auto layout = std::make_shared<cp::SequenceLayout>(2 * h.batch, L, cp_size, cp_rank, std::vector<int32_t>{});
  layout->set_block_diffusion(h.block_ranges);
  mb.cp = std::move(layout);
  mb.doubled_rows = true;
  return mb;
}

}  // namespace

HostMicroBatch pad_for_context_parallel(const HostMicroBatch& h, int cp) {
  check_sizes(h);
  const int64_t len = cp::padded_length(h.seq, cp);
  if (len == h.seq) return h;
  HostMicroBatch p = h;
  p.seq = len;
  const int64_t B = h.batch, S = h.seq;
  const auto zero_i = [](int64_t, int64_t) { return int32_t{0}; };
  p.input_ids = pad_rows(h.input_ids, B, S, len, zero_i);
  p.labels = pad_rows(h.labels, B, S, len, zero_i);
  p.loss_weights = pad_rows(h.loss_weights, B, S, len, [](int64_t, int64_t) { return 0.0f; });
  p.noise_mask = h.noise_mask.empty()
                     ? h.noise_mask
                     : pad_rows(h.noise_mask, B, S, len, [](int64_t, int64_t) { return uint8_t{0}; });
  // Positions continue the row (they stay below the unpadded length S of the run, which
  // splits already: varilen only ever shortens).
  p.positions = pad_rows(h.positions, B, S, len, [&](int64_t b, int64_t i) {
    return static_cast<int32_t>(h.positions[static_cast<size_t>(b * S + S - 1)] + (i - S + 1));
  });
  const std::vector<int32_t> docs =
      h.document_ids.empty() ? std::vector<int32_t>(static_cast<size_t>(B * S), 0) : h.document_ids;
  p.document_ids = pad_rows(docs, B, S, len, [&](int64_t b, int64_t) {
    return docs[static_cast<size_t>(b * S + S - 1)] + 1;  // a document of its own
  });
  return p;
}

MicroBatch MicroBatch::upload(const HostMicroBatch& full, const Stream& stream, int cp_rank,
                              int cp_size) {
  check_sizes(full);
  if (cp_size <= 1) return upload_rows(full, stream);
  if (!full.block_ranges.empty()) return upload_block_diffusion(full, stream, cp_rank, cp_size);
  const HostMicroBatch h = pad_for_context_parallel(full, cp_size);
  const cp::Split split{cp_size, cp_rank, h.seq};
  split.check();
  HostMicroBatch local;
  local.batch = h.batch;
  local.seq = split.local_len();
  local.first_sample = h.first_sample;
  local.loss_tokens = h.loss_tokens;  // the normaliser counts the whole micro-batch
  local.input_ids = cp::shard_rows(h.input_ids, h.batch, split);
  local.labels = cp::shard_rows(h.labels, h.batch, split);
  local.positions = cp::shard_rows(h.positions, h.batch, split);
  local.loss_weights = cp::shard_rows(h.loss_weights, h.batch, split);
  if (!h.document_ids.empty()) local.document_ids = cp::shard_rows(h.document_ids, h.batch, split);
  MicroBatch mb = upload_rows(local, stream);
  mb.cp = std::make_shared<const cp::SequenceLayout>(h.batch, h.seq, cp_size, cp_rank,
                                                     h.document_ids);
  mb.unpadded_seq = full.seq;
  return mb;
}

}  // namespace megadlm
