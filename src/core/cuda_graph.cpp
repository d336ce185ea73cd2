// core/cuda_graph.h: CudaGraph through the CUDA bridge (core/cuda_bridge.h), and GraphSchedule,
// plain host logic.
#include "megadlm/core/cuda_graph.h"
#include <algorithm>
#include "core/cuda_bridge.h"
#include "megadlm/core/error.h"

namespace megadlm {

void CudaGraph::capture(const Stream& stream, const std::function<void()>& work, const std::string& what) {
  MDLM_CHECK(stream.is_cuda(), what, ": CUDA graphs capture a CUDA stream; this runs on ", stream.device().str());
  handle_.reset();  // the previous graph goes first: one graph's allocations live at a time
  try {
    handle_ = detail::cuda_graph_capture(stream.cuda_resources().get(), work);
  } catch (const std::exception& e) {
    MDLM_FAIL(what, ": capturing a CUDA graph failed: ", e.what());
  }
}

void CudaGraph::replay(const Stream& stream) const {
  MDLM_CHECK(handle_ != nullptr, "CudaGraph::replay: nothing was captured");
  MDLM_CHECK(stream.is_cuda(), "CudaGraph::replay on ", stream.device().str());
  detail::cuda_graph_launch(handle_.get(), stream.cuda_resources().get());
}

size_t CudaGraph::nodes() const { return handle_ ? detail::cuda_graph_nodes(handle_.get()) : 0; }

const char* graph_action_name(GraphAction a) {
  switch (a) {
    case GraphAction::Eager: return "eager";
    case GraphAction::Capture: return "capture";
    case GraphAction::Replay: return "replay";
  }
  return "?";
}

GraphAction GraphSchedule::next(const Key& key) {
  if (have_graph_ && key == graph_) {
    ++replays_;
    return GraphAction::Replay;
  }
  if (std::find(warm_.begin(), warm_.end(), key.shape) == warm_.end()) {
    warm_.push_back(key.shape);
    ++eager_;
    return GraphAction::Eager;
  }
  have_graph_ = true;
  graph_ = key;
  ++captures_;
  return GraphAction::Capture;
}

void GraphSchedule::reset() {
  warm_.clear();
  have_graph_ = false;
  graph_ = Key{};
}

}  // namespace megadlm
