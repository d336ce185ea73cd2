#include "megadlm/model/micro_batch.h"
#include <vector>

namespace megadlm {

MicroBatch MicroBatch::upload(const HostMicroBatch& h, const Stream& stream) {
  const int64_t t = h.batch * h.seq;
  MDLM_CHECK(static_cast<int64_t>(h.input_ids.size()) == t &&
                 static_cast<int64_t>(h.labels.size()) == t &&
                 static_cast<int64_t>(h.loss_weights.size()) == t &&
                 static_cast<int64_t>(h.positions.size()) == t,
             "micro-batch arrays must have batch*seq = ", t, " entries");
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
    MDLM_CHECK(static_cast<int64_t>(h.document_ids.size()) == t,
               "micro-batch document_ids must have batch*seq = ", t, " entries");
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
  std::vector<int32_t> rows;
  for (int64_t i = 0; i < t; ++i)
    if (h.loss_weights[static_cast<size_t>(i)] != 0.0f) rows.push_back(static_cast<int32_t>(i));
  mb.loss_rows = Tensor::from_ints(rows, {static_cast<int64_t>(rows.size())}).to(dev, stream);
  return mb;
}

}  // namespace megadlm
