#include "megadlm/model/micro_batch.h"
#include <algorithm>
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
  MicroBatch mb;
  mb.batch = full.batch;
  mb.first_sample = full.first_sample;
  mb.loss_tokens = full.loss_tokens;
  const Device dev = stream.device();
  if (cp_size <= 1) {
    const int64_t t = full.batch * full.seq;
    mb.seq = full.seq;
    mb.input_ids = Tensor::from_ints(full.input_ids, {t}).to(dev, stream);
    mb.labels = Tensor::from_ints(full.labels, {t}).to(dev, stream);
    mb.positions = Tensor::from_ints(full.positions, {t}).to(dev, stream);
    mb.loss_weights = Tensor::from_floats(full.loss_weights, {t}).to(dev, stream);
    if (!full.document_ids.empty())
      mb.document_ids = Tensor::from_ints(full.document_ids, {t}).to(dev, stream);
    return mb;
  }
  const HostMicroBatch h = pad_for_context_parallel(full, cp_size);
  const cp::Split split{cp_size, cp_rank, h.seq};
  split.check();
  mb.seq = split.local_len();
  const int64_t t = mb.batch * mb.seq;
  mb.input_ids = Tensor::from_ints(cp::shard_rows(h.input_ids, h.batch, split), {t}).to(dev, stream);
  mb.labels = Tensor::from_ints(cp::shard_rows(h.labels, h.batch, split), {t}).to(dev, stream);
  mb.positions = Tensor::from_ints(cp::shard_rows(h.positions, h.batch, split), {t}).to(dev, stream);
  mb.loss_weights =
      Tensor::from_floats(cp::shard_rows(h.loss_weights, h.batch, split), {t}).to(dev, stream);
  if (!h.document_ids.empty())
    mb.document_ids =
        Tensor::from_ints(cp::shard_rows(h.document_ids, h.batch, split), {t}).to(dev, stream);
  mb.cp = std::make_shared<const cp::SequenceLayout>(h.batch, h.seq, cp_size, cp_rank,
                                                     h.document_ids);
  return mb;
}

}  // namespace megadlm
