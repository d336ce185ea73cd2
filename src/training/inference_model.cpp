// Opening a model for inference (include/megadlm/training/inference_model.h): the checkpoint's
// run configuration gives the architecture; every parameter is read whole (the reader assembles
// it from the pieces of whatever layout saved it) and converted to the device's model dtype.
// Logits cover the real vocabulary; with the key/value cache a forward runs only the columns it
// is asked for (window_batch) and the model's attention reads the rest from cache_.
#include "megadlm/training/inference_model.h"
#include <filesystem>
#include "megadlm/core/error.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/checkpoint/config_json.h"
#include "megadlm/training/checkpoint/file_io.h"
#include "megadlm/training/checkpoint/huggingface.h"

namespace megadlm::training {

namespace fs = std::filesystem;

InferenceModel::InferenceModel(const InferenceSource& src, Device device) {
  MDLM_CHECK(src.load.empty() != src.hf_dir.empty(), "give exactly one of --load (a megadlm checkpoint) and "
             "--hf-dir (a Hugging Face folder)");
  rt_.stream = Stream::for_device(device);
  rt_.dtype = device.is_cuda() ? DType::BF16 : DType::F32;
  rt_.training = false;  // no dropout
  std::unique_ptr<checkpoint::CheckpointReader> reader;
  std::unique_ptr<checkpoint::HfWeights> hf;
  checkpoint::HfFormat hf_format = checkpoint::HfFormat::Qwen;  // the folder's names
  if (!src.load.empty()) {
    const std::optional<std::string> dir = checkpoint::find_checkpoint(src.load, src.ckpt_step);
    if (!dir) MDLM_FAIL("--load ", src.load, ": no checkpoint there (no latest_checkpointed_iteration.txt)");
    reader = std::make_unique<checkpoint::CheckpointReader>(*dir);
    const checkpoint::CheckpointState& st = reader->index().state;
    if (st.run_config_json.empty())
      MDLM_FAIL("checkpoint ", *dir, " records no run configuration: megadlm cannot tell its architecture");
    cfg_ = checkpoint::run_config_from_json(st.run_config_json, *dir + "/metadata.json");
    reader->verify_files(reader->files_with({checkpoint::kModelPrefix}), nullptr, rt_.stream);
    description_ = "checkpoint " + *dir + (st.saved_under.empty() ? "" : " (saved under " + st.saved_under + ")");
  } else {
    const std::string config_path = (fs::path(src.hf_dir) / "config.json").string();
    if (checkpoint::file_size_or_missing(config_path) < 0)
      MDLM_FAIL("--hf-dir ", src.hf_dir, " has no config.json: not a Hugging Face model folder");
    const std::string config_text = checkpoint::read_text_file(config_path);
    hf_format = checkpoint::hf_format_of_config(config_text, config_path);
    cfg_ = checkpoint::run_config_from_hf(config_text, config_path);
    hf = std::make_unique<checkpoint::HfWeights>(src.hf_dir);
    description_ = "Hugging Face folder " + src.hf_dir;
  }
  // Inference runs the model as one piece: no tensor or pipeline split, no recomputation.
  cfg_.model.recompute_granularity = RecomputeGranularity::None;
  model_ = std::make_unique<GptModel>(cfg_.model, store_);
  store_.materialize(rt_.dtype, 0, rt_.stream);
  std::vector<std::string> missing;
  for (size_t h = 0; h < store_.descs().size(); ++h) {
    const ParamDesc& d = store_.descs()[h];
    Tensor host;
    if (reader) {
      host = Tensor::empty(d.shape, DType::F32, Stream::cpu());
      reader->read(checkpoint::kModelPrefix + d.name, d.shape, checkpoint::Region::whole(d.shape), host);
    } else {
      const std::string name = checkpoint::hf_tensor_name(d.name, hf_format);
      if (!hf->contains(name)) {
        missing.push_back(name);
        continue;
      }
      host = hf->read(name);
      MDLM_CHECK(host.shape() == d.shape, src.hf_dir, ": tensor ", name, " has shape ", shape_str(host.shape()),
                 ", its config.json implies ", shape_str(d.shape));
    }
    Tensor p = store_.param(static_cast<int>(h));
    copy_tensor(host, p, rt_.stream);
  }
  if (!missing.empty()) {
    std::string msg = "--hf-dir " + src.hf_dir + " lacks tensors its config.json implies:";
    for (const std::string& m : missing) msg += " " + m;
    MDLM_FAIL(msg);
  }
  rt_.stream.synchronize();
}

InferenceModel::~InferenceModel() = default;

int64_t InferenceModel::vocab_size() const {
  const int64_t real = cfg_.model.vocab_size;
  return real > 0 && real <= cfg_.model.padded_vocab_size ? real : cfg_.model.padded_vocab_size;
}

namespace {

// The micro-batch of columns [col0, col1) of every canvas row, on the host.
HostMicroBatch window_host(const CanvasBatch& c, int64_t col0, int64_t col1) {
  HostMicroBatch h;
  h.batch = c.batch;
  h.seq = col1 - col0;
  for (int64_t b = 0; b < c.batch; ++b) {
    const auto first = static_cast<ptrdiff_t>(b * c.seq + col0), last = static_cast<ptrdiff_t>(b * c.seq + col1);
    h.input_ids.insert(h.input_ids.end(), c.tokens.begin() + first, c.tokens.begin() + last);
    h.positions.insert(h.positions.end(), c.positions.begin() + first, c.positions.begin() + last);
    if (!c.document_ids.empty())
      h.document_ids.insert(h.document_ids.end(), c.document_ids.begin() + first, c.document_ids.begin() + last);
  }
  if (!c.block_ranges.empty()) {  // block diffusion's doubled rows: whole rows only
    MDLM_CHECK(col0 == 0 && col1 == c.seq && c.seq % 2 == 0 &&
                   c.block_ranges.size() == static_cast<size_t>(c.batch * 2 * c.seq),
               "block ranges of ", c.block_ranges.size(), " entries for ", c.batch, " doubled rows of ", c.seq,
               " columns [", col0, ", ", col1, ")");
    h.block_ranges = c.block_ranges;
  }
  h.labels = h.input_ids;  // unused: no loss
  h.loss_weights.assign(h.input_ids.size(), 0.0f);
  return h;
}

MicroBatch window_batch(const CanvasBatch& c, int64_t col0, int64_t col1, const Stream& stream) {
  return MicroBatch::upload(window_host(c, col0, col1), stream);
}

// A block-diffusion model (--attention-mask-type block_causal) given plain rows rather than its
// doubled [x_t | x_0] rows with block ranges: the full-sequence sampler on a block-diffusion
// checkpoint (generate_difflm --decode full), bidirectional over the canvas. The layers read the
// mask type from the model's configuration at each call, so it is switched for the call.
class FullSequenceAttention {
 public:
  FullSequenceAttention(const GptModel& model, bool on)
      : cfg_(const_cast<TransformerConfig&>(model.config())), saved_(cfg_.attention_mask) {
    if (on && saved_ == AttentionMaskType::BlockCausal) cfg_.attention_mask = AttentionMaskType::NoMask;
  }
  ~FullSequenceAttention() { cfg_.attention_mask = saved_; }
  FullSequenceAttention(const FullSequenceAttention&) = delete;
  FullSequenceAttention& operator=(const FullSequenceAttention&) = delete;

 private:
  TransformerConfig& cfg_;
  AttentionMaskType saved_;
};

Tensor device_ints(const std::vector<int32_t>& v, const Stream& stream) {
  Tensor t = Tensor::from_ints(v, {static_cast<int64_t>(v.size())});
  return stream.device().is_cpu() ? t : t.to(stream.device(), stream);
}

}  // namespace

Tensor InferenceModel::logits(const CanvasBatch& canvas, const std::vector<int32_t>& rows) {
  // Block diffusion on CUDA: a half length that is not a multiple of 128 would put the whole
  // mask on the simple kernels (an evaluation's context + answer rows: minutes instead of
  // seconds); padded with a document of its own it runs on the flash kernels, same logits.
  const int64_t head_dim = cfg_.model.kv_channels;
  if (!canvas.block_ranges.empty() && rt_.stream.device().is_cuda() && (head_dim == 64 || head_dim == 128) &&
      (canvas.seq / 2) % 128 != 0) {
    std::vector<int32_t> padded_rows = rows;
    const CanvasBatch padded = pad_block_canvas(canvas, 128, padded_rows);
    return logits(padded, padded_rows);
  }
  // Left-padded rows run dense with the live tokens first: cuDNN's padding mask instead of its
  // ragged batch of documents (batch-16 canvas on the H200: ~47 vs 68 us a layer).
  const std::optional<CompactCanvas> compact =
      canvas.block_ranges.empty() ? compact_rows(canvas, rows) : std::nullopt;
  const CanvasBatch& c = compact ? compact->canvas : canvas;
  MicroBatch mb = window_batch(c, 0, c.seq, rt_.stream);
  if (compact) mb.row_lengths = device_ints(compact->lengths, rt_.stream);
  const FullSequenceAttention plain(*model_, canvas.block_ranges.empty());
  return model_->logits_at(mb, device_ints(compact ? compact->rows : rows, rt_.stream), rt_, vocab_size());
}

Tensor InferenceModel::cached_logits(const CanvasBatch& canvas, const std::vector<int32_t>& rows, int64_t col0,
                                     int64_t col1, bool refresh) {
  if (refresh) {
    cache_ = KvCache{};
    cache_.batch = canvas.batch;
    cache_.seq = canvas.seq;
    if (!canvas.document_ids.empty()) cache_.document_ids = device_ints(canvas.document_ids, rt_.stream);
    col0 = 0;
    col1 = canvas.seq;
  }
  MDLM_CHECK(cache_.batch == canvas.batch && cache_.seq == canvas.seq && 0 <= col0 && col0 < col1 &&
                 col1 <= canvas.seq,
             "a cached forward of columns [", col0, ", ", col1, ") of ", canvas.batch, " x ", canvas.seq,
             " canvases, but the cache holds ", cache_.batch, " x ", cache_.seq);
  std::vector<int32_t> local;  // the rows as flat indices of the window
  local.reserve(rows.size());
  for (const int32_t r : rows) {
    const int64_t b = r / canvas.seq, i = r % canvas.seq;
    MDLM_CHECK(i >= col0 && i < col1, "cached logits of column ", i, " outside the computed columns [", col0, ", ",
               col1, ")");
    local.push_back(static_cast<int32_t>(b * (col1 - col0) + i - col0));
  }
  cache_.column0 = col0;
  cache_.refresh = refresh;
  ModelRuntime rt = rt_;
  rt.kv_cache = &cache_;
  const FullSequenceAttention plain(*model_, true);  // Fast-dLLM's cache runs plain rows
  const MicroBatch mb = window_batch(canvas, col0, col1, rt_.stream);
  return model_->logits_at(mb, device_ints(local, rt_.stream), rt, vocab_size());
}

void InferenceModel::exact_cache_reset(int64_t batch, int64_t seq) {
  MDLM_CHECK(batch > 0 && seq > 0, "an exact cache of ", batch, " x ", seq, " columns");
  cache_ = KvCache{};
  cache_.batch = batch;
  cache_.seq = seq;
  cache_.exact = true;
  graphs_.reset();  // the graph wrote into the old cache's storage
}

std::string InferenceModel::exact_cache_graphs_unsupported() const {
  return ExactCacheGraphs::unsupported(*model_, rt_.stream.device());
}

void InferenceModel::set_exact_cache_graphs(bool on) {
  if (on) {
    const std::string why = exact_cache_graphs_unsupported();
    MDLM_CHECK(why.empty(), why);
  }
  if (on != use_graphs_) graphs_.reset();
  use_graphs_ = on;
}

Tensor InferenceModel::exact_cache_logits(const CanvasBatch& window, int64_t col0,
                                          const std::vector<int32_t>& key_documents, bool causal,
                                          const std::vector<int32_t>& rows) {
  MDLM_CHECK(cache_.exact && cache_.batch == window.batch && 0 <= col0 && col0 + window.seq <= cache_.seq &&
                 key_documents.size() == static_cast<size_t>(cache_.batch * cache_.seq) &&
                 window.document_ids.size() == window.tokens.size(),
             "an exact cached forward of ", window.batch, " x ", window.seq, " columns from ", col0,
             " does not fit the exact cache ", cache_.batch, " x ", cache_.seq, cache_.exact ? "" : " (not reset)");
  for (const int32_t r : rows)
    MDLM_CHECK(r >= 0 && r < window.batch * window.seq, "exact cached logits of row ", r, " outside the window");
  cache_.column0 = col0;
  cache_.causal = causal;
  ModelRuntime rt = rt_;
  rt.kv_cache = &cache_;
  if (use_graphs_)
    return graphs_.logits(*model_, cache_, rt, window_host(window, 0, window.seq), key_documents,
                          device_ints(rows, rt_.stream), vocab_size());
  cache_.key_document_ids = device_ints(key_documents, rt_.stream);
  const MicroBatch mb = window_batch(window, 0, window.seq, rt_.stream);
  return model_->logits_at(mb, device_ints(rows, rt_.stream), rt, vocab_size());
}

}  // namespace megadlm::training
