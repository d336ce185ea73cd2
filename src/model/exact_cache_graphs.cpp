// model/exact_cache_graphs.h: block decoding's cached steps through CUDA graphs of the model's
// trunk. The eager path is exactly InferenceModel's (upload, logits_at); the graph path runs the
// same trunk and head around a capture.
#include "megadlm/model/exact_cache_graphs.h"
#include "megadlm/core/error.h"
#include "megadlm/ops/gemm.h"

namespace megadlm {

namespace {

constexpr const char* kWhat = "--cuda-graphs (block decoding's step)";

Tensor device_ints(const std::vector<int32_t>& v, const Stream& s) {
  return Tensor::from_ints(v, {static_cast<int64_t>(v.size())}).to(s.device(), s);
}

// Host -> an existing device buffer of the same length (stream-ordered: after the last replay
// that read it, before the next).
void refill(const std::vector<int32_t>& v, Tensor& buffer, const Stream& s) {
  MDLM_CHECK(buffer.numel() == static_cast<int64_t>(v.size()), kWhat, ": ", v.size(), " values for a buffer of ",
             buffer.numel());
  copy_tensor(Tensor::from_ints(v, {static_cast<int64_t>(v.size())}), buffer, s);
}

// Every layer's cache storage exists (allocated by the first eager call): a capture must not
// allocate it, or each replay would allocate (and zero) it afresh.
bool storage_ready(const KvCache& cache, int layers) {
  if (static_cast<int>(cache.k.size()) < layers) return false;
  for (int l = 0; l < layers; ++l)
    if (!cache.k[static_cast<size_t>(l)].defined() || !cache.v[static_cast<size_t>(l)].defined()) return false;
  return true;
}

}  // namespace

std::string ExactCacheGraphs::unsupported(const GptModel& model, Device device) {
  if (!device.is_cuda())
    return "`--cuda-graphs` captures CUDA work; the model runs on " + device.str() + " (use --device cuda)";
  if (model.model_parallel().tp.enabled())
    return "`--cuda-graphs`: the model is split over tensor-parallel ranks; block decoding runs it whole";
  if (model.has_moe())
    return "`--cuda-graphs`: an MoE layer's token dispatch reads expert counts on the host, which a CUDA graph "
           "cannot hold; run this model without --cuda-graphs";
  if (!model.splits_last_layer())
    return "`--cuda-graphs`: the model's last layer does not split at its attention";
  return "";
}

void ExactCacheGraphs::reset() {
  schedule_.reset();
  graph_.reset();
  inputs_ = MicroBatch{};
  key_documents_ = Tensor();
  outputs_ = GptModel::Trunk{};
}

Tensor ExactCacheGraphs::logits(const GptModel& model, KvCache& cache, const ModelRuntime& rt,
                                const HostMicroBatch& window, const std::vector<int32_t>& key_documents,
                                const Tensor& rows, int64_t vocab) {
  const Stream& s = rt.stream;
  MDLM_CHECK(cache.exact && rt.kv_cache == &cache, kWhat, ": needs the exact cache in the runtime");
  const std::string why = unsupported(model, s.device());
  MDLM_CHECK(why.empty(), why);
  MDLM_CHECK(!window.document_ids.empty() && key_documents.size() == static_cast<size_t>(cache.batch * cache.seq),
             kWhat, ": the window's documents and the cache's key documents are needed");
  const int64_t t = window.batch * window.seq;
  const int layers = model.config().num_layers;
  GraphSchedule::Key key{{window.batch, window.seq, cache.batch, cache.seq, cache.causal ? 1 : 0,
                          ops::batch_invariant() ? 1 : 0, static_cast<int64_t>(rt.dtype)},
                         cache.column0};
  // No rows asked for: logits_at runs the last layer whole; not worth a graph.
  GraphAction action = rows.numel() == 0 ? GraphAction::Eager : schedule_.next(key);
  if (action != GraphAction::Eager && !storage_ready(cache, layers)) {
    schedule_.reset();  // a new cache since the shapes were warmed
    action = schedule_.next(key);
  }
  if (action == GraphAction::Eager) {
    cache.key_document_ids = device_ints(key_documents, s);
    return model.logits_at(MicroBatch::upload(window, s), rows, rt, vocab);
  }
  if (action == GraphAction::Capture) {
    // Fresh buffers for the new graph, allocated (and filled) before the capture.
    graph_.reset();
    inputs_ = MicroBatch{};
    inputs_.batch = window.batch;
    inputs_.seq = window.seq;
    inputs_.input_ids = Tensor::empty({t}, DType::I32, s);
    inputs_.positions = Tensor::empty({t}, DType::I32, s);
    inputs_.document_ids = Tensor::empty({t}, DType::I32, s);
    key_documents_ = Tensor::empty({cache.batch * cache.seq}, DType::I32, s);
    const TransformerConfig& c = model.config();
    outputs_ = GptModel::Trunk{};
    outputs_.residual = Tensor::empty({t, c.hidden_size}, rt.dtype, s);
    outputs_.context = Tensor::empty({t, c.query_projection_size()}, rt.dtype, s);
  }
  refill(window.input_ids, inputs_.input_ids, s);
  refill(window.positions, inputs_.positions, s);
  refill(window.document_ids, inputs_.document_ids, s);
  refill(key_documents, key_documents_, s);
  cache.key_document_ids = key_documents_;
  if (action == GraphAction::Capture) {
    try {
      graph_.capture(
          s,
          [&] {
            // Every tensor the trunk allocates is released inside the capture (this scope);
            // its results leave through the copies.
            GptModel::Trunk trunk = model.inference_trunk(inputs_, rt, true);
            MDLM_CHECK(trunk.residual.shape() == outputs_.residual.shape() &&
                           trunk.context.shape() == outputs_.context.shape() && !trunk.branch.defined(),
                       kWhat, ": the trunk returned ", trunk.residual.str(), " and ", trunk.context.str(),
                       ", expected ", outputs_.residual.str(), " and ", outputs_.context.str());
            copy_tensor(trunk.residual, outputs_.residual, s);
            copy_tensor(trunk.context, outputs_.context, s);
          },
          kWhat);
    } catch (...) {
      reset();
      throw;
    }
  }
  graph_.replay(s);
  // The head reads the outputs (gathering the rows: the buffers stay as the graph left them).
  return model.inference_head(GptModel::Trunk{outputs_.residual, Tensor(), outputs_.context}, inputs_, rows, rt,
                              vocab);
}

}  // namespace megadlm
