// Vocab-parallel embedding lookup and cross-entropy (Megatron's VocabParallelEmbedding and
// vocab_parallel_cross_entropy): the word embedding and the output layer are split over the
// padded vocabulary; TP rank t holds rows [vocab_start, vocab_start + V/tp).
//
// Embedding: each rank looks up the ids of its rows (other ids give zero rows); the sum over TP
// is the embedding (reduce-scattered to this rank's rows under sequence parallelism).
// Cross-entropy: from the logit shards, with three small all-reduces (row max, sum of
// exponentials, target logit: one number per token each) instead of gathering the logits. Every
// TP rank ends with the same per-token losses.
#pragma once
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/parallel/model_parallel.h"

namespace megadlm::tp {

/// ids [rows] -> x [local rows, H] (dtype of weight). `weight`: this rank's rows of the vocabulary.
Tensor vocab_parallel_embedding(const Tensor& weight, const Tensor& ids, int64_t vocab_start,
                                const ModelParallel& mp, const Stream& stream);
/// dx [local rows, H] -> dweight (this rank's rows) += the rows' gradients (gathered under SP).
void vocab_parallel_embedding_backward(const Tensor& ids, const Tensor& dx, Tensor& dweight,
                                       int64_t vocab_start, const ModelParallel& mp,
                                       const Stream& stream);

/// losses[t] (written) = CE of the logit shards [rows, V/tp] against targets; with grad_scale > 0
/// the shards are overwritten with d(grad_scale · Σ_t weights[t] · losses[t]) / dlogits, as
/// ops::cross_entropy_shard_finish describes. Collective over mp.tp (size > 1).
void vocab_parallel_cross_entropy(Tensor& logits, const Tensor& targets, const Tensor& weights,
                                  Tensor& losses, float grad_scale, int64_t vocab_start,
                                  const ModelParallel& mp, const Stream& stream);

}  // namespace megadlm::tp
