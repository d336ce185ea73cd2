// Opening a model for inference (include/megadlm/training/inference_model.h): the checkpoint's
// run configuration gives the architecture; every parameter is read whole (the reader assembles
// it from the pieces of whatever layout saved it) and converted to the device's model dtype.
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
    cfg_ = checkpoint::run_config_from_hf(checkpoint::read_text_file(config_path), config_path);
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
      const std::string name = checkpoint::hf_tensor_name(d.name);
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

Tensor InferenceModel::logits(const CanvasBatch& canvas, const std::vector<int32_t>& rows) {
  HostMicroBatch h;
  h.batch = canvas.batch;
  h.seq = canvas.seq;
  h.input_ids = canvas.tokens;
  h.labels = canvas.tokens;  // unused: no loss
  h.loss_weights.assign(canvas.tokens.size(), 0.0f);
  h.positions = canvas.positions;
  h.document_ids = canvas.document_ids;
  const MicroBatch mb = MicroBatch::upload(h, rt_.stream);
  Tensor idx = Tensor::from_ints(rows, {static_cast<int64_t>(rows.size())});
  if (!rt_.stream.device().is_cpu()) idx = idx.to(rt_.stream.device(), rt_.stream);
  return model_->logits_at(mb, idx, rt_);
}

}  // namespace megadlm::training
