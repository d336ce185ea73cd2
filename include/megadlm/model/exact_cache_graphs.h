// Block decoding's steps through CUDA graphs (generate_difflm --cuda-graphs; docs/generation.md,
// "CUDA graphs"). A step runs the model on the current block's columns against the exact cache
// (model/kv_cache.h): within a block every step has the same shapes and the same cache column,
// so the forward is captured once and replayed, one launch instead of a few hundred.
//
// What is captured: GptModel::inference_trunk with split_last: the embedding, every layer but
// the last, and the last layer's attention (the block's keys and values written into the cache,
// its queries against it). Its inputs are buffers allocated before the capture (tokens,
// positions, documents, the cache's key documents), refilled from the host before each replay;
// its outputs are copied at the end of the graph into buffers allocated before it. What stays
// outside: the copies of the inputs, and GptModel::inference_head (the last layer's projection
// and MLP, the final norm and the output layer on the rows asked for, whose count changes every
// step), a handful of kernels. Logits are bit for bit the eager ones: the same ops run on the
// same shapes with the same algorithms (the eager first run of a shape chose them).
//
// Memory: the trunk's temporaries are allocated inside the graph (graph allocation nodes of
// the stream-ordered pool, freed inside it), so the graph owns them while it lives and no other
// tensor can take them; one graph lives at a time (GraphSchedule).
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "megadlm/core/cuda_graph.h"
#include "megadlm/model/gpt_model.h"
#include "megadlm/model/kv_cache.h"
#include "megadlm/model/micro_batch.h"

namespace megadlm {

class ExactCacheGraphs {
 public:
  /// Why block decoding's steps of `model` on `device` cannot run through CUDA graphs, naming
  /// what (empty when they can): the CPU, an MoE layer (its dispatch reads expert counts on the
  /// host), a model split over tensor-parallel ranks.
  static std::string unsupported(const GptModel& model, Device device);

  /// The logits GptModel::logits_at gives for `window` (columns [cache.column0, + window.seq) of
  /// every cached canvas; tokens, positions, document_ids) and the window's flat `rows` (i32,
  /// on the device) through `cache` (exact; column0 and causal set for this call), with
  /// `key_documents` ([cache.batch * cache.seq], host) as the cache's key documents, bit for
  /// bit: run eagerly, captured, or replayed as GraphSchedule decides (key: the window's and the
  /// cache's shapes, causal, the batch-invariant mode; site: column0). Leaves
  /// cache.key_document_ids set to the call's, as the eager path does.
  Tensor logits(const GptModel& model, KvCache& cache, const ModelRuntime& rt, const HostMicroBatch& window,
                const std::vector<int32_t>& key_documents, const Tensor& rows, int64_t vocab);

  /// Drops the graph and every shape's warm-up (with each reset of the exact cache: the graph
  /// wrote into the old cache's storage).
  void reset();
  const GraphSchedule& schedule() const { return schedule_; }
  /// Nodes of the live graph (0: none).
  size_t graph_nodes() const { return graph_.nodes(); }

 private:
  GraphSchedule schedule_;
  CudaGraph graph_;
  MicroBatch inputs_;           // the graph's inputs: input_ids, positions, document_ids
  Tensor key_documents_;        // the graph's cache key documents
  GptModel::Trunk outputs_;     // the graph's outputs: residual and context
};

}  // namespace megadlm
