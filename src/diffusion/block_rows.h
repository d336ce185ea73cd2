// The doubled rows of block diffusion, shared by pre-training (forward_process.cpp) and
// fine-tuning (sft_process.cpp): each row of L clean tokens becomes [x_t | x_0] (2L tokens), and
// every token of the noisy half carries its document's and its block's column ranges
// (HostMicroBatch::block_ranges: [doc start | doc end | block start | block end], L each).
#pragma once
#include <algorithm>
#include <cstdint>
#include "megadlm/core/error.h"
#include "megadlm/diffusion/forward_process.h"

namespace megadlm::block_rows {

/// A micro-batch of `batch` doubled rows with every per-token field sized (weights and noise
/// marks zero); `what` names the caller in the block-size error.
inline HostMicroBatch allocate(int64_t batch, int64_t L, int64_t block_size, int64_t first_sample,
                               const char* what) {
  MDLM_CHECK(block_size > 0 && L % block_size == 0, what, ": --dlm-block-size ", block_size,
             " must divide the sequence length ", L);
  HostMicroBatch mb;
  mb.batch = batch;
  mb.first_sample = first_sample;
  mb.seq = 2 * L;
  const size_t n = static_cast<size_t>(batch * 2 * L);
  mb.input_ids.resize(n);
  mb.labels.resize(n);
  mb.loss_weights.assign(n, 0.0f);
  mb.positions.resize(n);
  mb.noise_mask.assign(n, 0);
  mb.block_ranges.resize(static_cast<size_t>(batch * 4 * L));
  return mb;
}

/// The ranges of the document [doc_start, doc_end) of one row (`ranges`: that row's 4L entries):
/// blocks of B from the document's first token, the last one cut at its end. Calls
/// `on_token(j, block)` with each position and its block's index within the document.
template <typename OnToken>
void set_document(int32_t* ranges, int64_t L, int64_t doc_start, int64_t doc_end, int64_t B, OnToken&& on_token) {
  for (int64_t j = doc_start; j < doc_end; ++j) {
    const int64_t block = (j - doc_start) / B, block_start = doc_start + block * B;
    ranges[j] = static_cast<int32_t>(doc_start);
    ranges[L + j] = static_cast<int32_t>(doc_end);
    ranges[2 * L + j] = static_cast<int32_t>(block_start);
    ranges[3 * L + j] = static_cast<int32_t>(std::min(block_start + B, doc_end));
    on_token(j, block);
  }
}

}  // namespace megadlm::block_rows
