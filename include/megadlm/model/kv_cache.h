// Fast-dLLM's approximate key/value cache for inference (docs/generation.md, "Faster decoding";
// diffusion/sampler.h --kv-cache): per layer, the keys and values (after QK-norm and RoPE) of
// every column of a batch of canvases, kept by a full forward (a refresh) and reused by later
// forwards that compute only some columns. Block decoding's exact cache (exact = true,
// diffusion/block_sampler.h) uses the same storage differently: allocated once (zeros), every
// call writes its columns' keys and values and its queries attend to the columns the call's
// key_document_ids put in their document (causal: only up to their own column). The model reads it through ModelRuntime::kv_cache:
// SelfAttention::context_cached writes the computed columns' keys and values into it and lets
// their queries attend to every column. Inference only (TP 1, no CP, no sequence parallelism).
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/core/tensor.h"

namespace megadlm {

struct KvCache {
  int64_t batch = 0, seq = 0;  ///< the cached canvases: rows and columns
  /// The call in progress: its micro-batch holds columns [column0, column0 + mb.seq) of each
  /// canvas. refresh: every column (column0 = 0, mb.seq = seq), and the cache is rewritten.
  int64_t column0 = 0;
  bool refresh = false;
  std::vector<Tensor> k, v;  ///< per global layer: [batch * seq, kv groups * head dim]
  Tensor document_ids;       ///< int32 [batch * seq] of the canvases (undefined: one document a row)
  /// Block decoding's exact cache: k, v are allocated once ([batch * seq], zeros) and never
  /// replaced; the call's columns [column0, column0 + mb.seq) are written, then its queries (of
  /// document mb.document_ids) attend to every column whose key_document_ids entry is theirs,
  /// and with `causal` only to columns <= their own: from column 0 any width; a window of one
  /// column relies on the key documents to hide the columns after it; otherwise an even width
  /// whose half divides column0.
  bool exact = false;
  bool causal = false;
  Tensor key_document_ids;  ///< exact: int32 [batch * seq], set for each call
};

}  // namespace megadlm
