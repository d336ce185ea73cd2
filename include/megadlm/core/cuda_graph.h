// CUDA graphs: the work one call queues on a stream, captured once and replayed with one launch
// (block decoding's steps, model/exact_cache_graphs.h; docs/generation.md, "CUDA graphs"). Also
// GraphSchedule, the host-side rule that decides when a repeated call runs eagerly, is captured
// or replays (CPU-testable). The API compiles without CUDA; capturing then throws.
//
// What a capture may queue: kernels, cuBLASLt products, device-to-device copies and memsets, and
// stream-ordered allocations (cudaMallocAsync becomes a graph allocation node, cudaFreeAsync a
// free node), on the captured stream only. Not: host synchronisation, host <-> device copies of
// pageable memory, or freeing memory allocated before the capture (a graph frees only its own
// allocations). Every tensor the captured work allocates must be released inside the capture;
// results are copied into buffers allocated before it. A capture that breaks these rules fails
// with CUDA's error, never a silently wrong graph.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "megadlm/core/stream.h"

namespace megadlm {

namespace detail {
struct CudaGraphHandle;  // a cudaGraph_t and its instantiation (src/core/cuda/cuda_utils.h)
}

/// One captured, instantiated CUDA graph (RAII: destroyed with the last copy of the handle).
class CudaGraph {
 public:
  /// Captures everything `work` queues on `stream` (a CUDA stream; nothing runs while
  /// capturing) into a new graph that replaces this one. Throws megadlm::Error naming `what`
  /// when the stream is the CPU's, or when the capture fails (an operation a graph cannot hold:
  /// CUDA's error is in the message); the stream is usable again afterwards.
  void capture(const Stream& stream, const std::function<void()>& work, const std::string& what);
  /// Queues the captured work on `stream` (the captured one) once more.
  void replay(const Stream& stream) const;
  bool empty() const { return handle_ == nullptr; }
  void reset() { handle_.reset(); }
  /// Nodes of the captured graph (kernels, copies, allocations...); 0 when empty.
  size_t nodes() const;

 private:
  std::shared_ptr<detail::CudaGraphHandle> handle_;
};

/// What to do with one call of a repeated computation (GraphSchedule::next).
enum class GraphAction {
  Eager,    ///< run it as usual (the first run of a shape: its lazy choices and allocations)
  Capture,  ///< capture it into a new graph (replacing the previous one), then replay that
  Replay,   ///< replay the graph captured for this very call
};
const char* graph_action_name(GraphAction a);

/// When a call that repeats with the same shapes (block decoding's steps) runs eagerly, is
/// captured, or replays. A call is described by its `shape` (what decides which kernels run,
/// their launch shapes and the allocations: batch, columns, ...) and `site` (what else a graph
/// bakes in: the cache column the step writes). The rule, for each call:
///   - the shape and site of the graph captured last: Replay;
///   - a shape never run eagerly since the last reset: Eager. Its first run makes every lazy
///     choice (cuBLASLt algorithms, the cache's storage, a kernel's attributes), which must not
///     happen inside a capture;
///   - otherwise: Capture (the previous graph is dropped: one graph lives at a time).
/// Worked example, block decoding of 2 blocks of 3 steps after one prefill block (site = first
/// column): prefill (s, 0) Eager; block 1 (s, 4) Capture, Replay, Replay, and its cache update
/// (s, 4) Replay; block 2 (s, 8) Capture, Replay, Replay.
class GraphSchedule {
 public:
  struct Key {
    std::vector<int64_t> shape;
    int64_t site = 0;
    bool operator==(const Key& o) const { return shape == o.shape && site == o.site; }
  };
  GraphAction next(const Key& key);
  /// Forgets every shape and the graph (the buffers it captured are gone, e.g. a new cache).
  void reset();
  /// How often each action was returned since construction (reset keeps the counts). A
  /// captured call also runs, by one launch of its new graph, not counted as a replay.
  int64_t eager() const { return eager_; }
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

 private:
  std::vector<std::vector<int64_t>> warm_;  // shapes run eagerly since the last reset
  bool have_graph_ = false;
  Key graph_;  // the call the live graph was captured for
  int64_t eager_ = 0, captures_ = 0, replays_ = 0;
};

}  // namespace megadlm
