// The tensor-parallel linear layers (Megatron's ColumnParallelLinear and RowParallelLinear) with
// their sequence-parallel regions, explicit forward and backward. Communication at the region
// borders is in tensor_parallel/mappings.h; docs/parallelism/tensor_parallel.md derives it.
//
// Activations are [rows, features], rows = tokens. Without sequence parallelism every TP rank
// holds all rows of the region's input and output; with it, each rank holds its row shard
// (mappings.h) and the column-parallel input is gathered, the row-parallel output reduce-scattered.
//
//   column-parallel: x ── gather_input (SP: all-gather) ── x W^T + b ── y [rows, out/tp]
//     backward: dy ── dW += dy^T x, db += Σ dy ── dx = dy W ── reduced over TP (SP: reduce-scatter)
//   row-parallel:    x [rows, in/tp] ── x W^T (+ b on TP rank 0) ── reduced (SP: reduce-scatter)
//     backward: dy (SP: all-gathered) ── dW += dy^T x, db += Σ dy ── dx = dy W
//
// With --tp-comm-overlap (ModelParallel::tp_comm_overlap, SP only) the four SP collectives run
// as rings chunked with the GEMMs next to them (tensor_parallel/comm_overlap.h).
//
// Accumulation contract: weight and bias gradients are ADDED into the store's fp32 main grads;
// input gradients are written (returned).
#pragma once
#include <functional>
#include <string>
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/ops/fp8_gemm.h"
#include "megadlm/parallel/parameter_store.h"

namespace megadlm::tp {

/// What a column-parallel linear keeps of its input for backward, where the weight gradient is
/// the input's only use: the input rows themselves, or, when that gradient's GEMM runs in FP8,
/// only the column-wise codes it reads. The forward's quantize pass writes them next to the
/// row-wise codes its own GEMM reads, with the same scale, so they are the codes backward would
/// make from x: the gradients do not change, one byte an element is kept instead of two (CUDA),
/// and backward skips a quantize pass over x.
struct LinearInput {
  Tensor x;
  ops::Fp8Tensor codes;
  static LinearInput rows(Tensor x) {
    LinearInput in;
    in.x = std::move(x);
    return in;
  }
  static LinearInput fp8(ops::Fp8Tensor codes) {
    LinearInput in;
    in.codes = std::move(codes);
    return in;
  }
  bool defined() const { return x.defined() || codes.defined(); }
};

/// The FP8 side of one linear (docs/fp8.md, "Training"): its three scaled tensors in the rank's
/// Fp8State and the weight cast of the current generation (one per optimizer step, reused by
/// every micro-batch). Inactive (the high-precision GEMMs run) when built without a state.
/// A micro-batch's tokens are split over CP, so tensorwise activation amaxes are reduced over CP
/// as well as TP.
class Fp8Linear {
 public:
  Fp8Linear() = default;
  /// `weight_elements`: this rank's part of the weight (the memory plan's count of casts).
  Fp8Linear(std::shared_ptr<Fp8State> state, const std::string& name, const ModelParallel& mp,
            int64_t weight_elements = 0);
  bool active() const { return state_ != nullptr; }
  /// --fp8-param-gather: the weight (store handles first..last) is gathered as FP8 codes by the
  /// distributed optimizer; once a gather has run, the GEMMs use those codes (no cast here).
  void gather_weight(int first, int last) const;

  /// y = x W^T (+ bias): x and W quantized (e4m3), fp32 accumulation, y in x's dtype; or, with
  /// beta/addend, the GemmArgs epilogue (residual add). With `keep`, what backward needs of x
  /// (LinearInput: its column-wise codes when the weight gradient runs in FP8, else x).
  void forward(const Tensor& x, const Tensor& w, Tensor& y, const ops::GemmArgs& args, const Stream& s,
               LinearInput* keep = nullptr) const;
  /// dx = dy W (dy quantized to the gradient type), written; dW += dy^T x into the fp32 main grad
  /// (FP8 unless --no-fp8-wgrad). Returns dx [rows, in].
  Tensor backward(const Tensor& dy, const LinearInput& x, const Tensor& w, Tensor& dw, const Stream& s) const;
  /// The weight-gradient half alone (for layers that need dx before x exists).
  void backward_weight(const ops::Fp8Tensor& dy_q, const Tensor& dy, const LinearInput& x, Tensor& dw,
                       const Stream& s) const;
  ops::Fp8Tensor quantize_grad(const Tensor& dy, const Stream& s) const;
  /// Delayed scaling with an FP8 weight gradient: the scale of a cast is known before the values,
  /// so the kernel that makes a tensor can write its codes (ops::fp8_swiglu_backward): then
  /// input_target() / grad_target() say where the input's / output gradient's cast goes.
  bool takes_codes_from_producers() const {
    return active() && state_->delayed() && state_->settings().wgrad;
  }
  ops::Fp8CastTarget input_target(const Stream& s) const { return target(x_, s); }
  ops::Fp8CastTarget grad_target(const Stream& s) const { return target(dy_, s); }
  /// dx = dy W; `rows` >= 0: dx's first `rows` rows (blockwise pads dy's token rows to 128).
  Tensor backward_data(const ops::Fp8Tensor& dy_q, const Tensor& w, const Stream& s, int64_t rows = -1) const;

 private:
  const ops::Fp8Tensor& weight(const Tensor& w, const Stream& s) const;
  ops::Fp8CastTarget target(int slot, const Stream& s) const;
  /// `rowwise` false: the column-wise codes alone (the weight gradient's x; the CPU keeps both).
  ops::Fp8Tensor cast(int slot, const Tensor& x, bool activation, bool columnwise, const Stream& s,
                      bool rowwise = true) const;

  std::shared_ptr<Fp8State> state_;
  comm::Communicator* tp_ = nullptr;  ///< null: a group of one
  comm::Communicator* cp_ = nullptr;
  int x_ = -1, w_ = -1, dy_ = -1;
  mutable ops::Fp8Tensor w_cache_;
  mutable uint64_t w_generation_ = ~uint64_t{0};
};

/// One parameter of a (possibly fused) column-parallel weight: `name` + ".weight"/".bias",
/// `out_features` global output rows. Each part is split over TP on its own; the local parts sit
/// adjacent in the store so the whole layer is one GEMM (q, k, v -> QKV; gate, up -> fc1).
struct LinearPart {
  std::string name;
  int64_t out_features = 0;
};

/// y[rows, out/tp] = x[rows, in] W^T (+ b): the output features are split over TP.
class ColumnParallelLinear {
 public:
  ColumnParallelLinear() = default;
  /// Registers each part's weight [out, in] (init `init`) and, with `bias`, its bias (zeros).
  ColumnParallelLinear(ParameterStore& store, const std::vector<LinearPart>& parts,
                       int64_t in_features, bool bias, ParamInit init, const ModelParallel& mp);

  int64_t local_out_features() const { return local_out_; }
  /// The rows the GEMMs read: x [local rows, in] gathered to [rows, in] under SP (else x).
  Tensor gather_input(const Tensor& x, int64_t rows, const Stream& stream) const;
  /// y [rows, out/tp] = x_full W^T + b; with `keep`, what backward needs of x_full (LinearInput).
  Tensor forward(const Tensor& x_full, const Stream& stream, LinearInput* keep = nullptr) const;
  /// gather_input then forward: y [rows, out/tp] from this rank's x [local rows, in]; `keep`
  /// (null: forward only) gets what backward needs of the gathered rows. Under
  /// --tp-comm-overlap the gather is a ring whose shards feed the GEMM as they arrive
  /// (comm_overlap.h); else the two calls.
  Tensor gather_and_forward(const Tensor& x, int64_t rows, LinearInput* keep, const Stream& stream) const;
  /// dy [rows, out/tp] -> dx [local rows, in] summed over TP (all-reduce, or reduce-scatter to
  /// this rank's rows under SP). Adds dW and db. `input`: what forward kept.
  Tensor backward(const Tensor& dy, const LinearInput& input, const Stream& stream) const;
  /// Whether backward can start from dy's FP8 codes made by the kernel that produced dy
  /// (Fp8Linear::takes_codes_from_producers, no bias: its gradient reads dy itself), where they
  /// go (fp8().grad_target), and that backward.
  bool takes_grad_codes() const;
  const Fp8Linear& fp8() const { return fp8_; }
  Tensor backward(const ops::Fp8Tensor& dy_q, const LinearInput& input, const Stream& stream) const;

 private:
  ParameterStore* store_ = nullptr;
  ModelParallel mp_;
  ParameterStore::Handle w_first_ = -1, w_last_ = -1, b_first_ = -1, b_last_ = -1;
  int64_t local_out_ = 0;
  Fp8Linear fp8_;
};

/// y[rows, out] = x[rows, in/tp] W^T + b, partial products summed over TP: the input features
/// are split over TP; the bias is replicated and added once, before the reduction.
class RowParallelLinear {
 public:
  RowParallelLinear() = default;
  RowParallelLinear(ParameterStore& store, const std::string& name, int64_t out_features,
                    int64_t in_features, bool bias, ParamInit init, const ModelParallel& mp);

  /// x [rows, in/tp] -> y [local rows, out] (reduced over TP; reduce-scattered under SP).
  Tensor forward(const Tensor& x, const Stream& stream) const;
  /// y [rows, out] = residual + x W^T + b in the GEMM itself (beta = 1: one rounding of the sum,
  /// no separate add pass); y may be residual (in place). One tensor-parallel rank only (the
  /// residual stream around a branch).
  void forward_add(const Tensor& x, const Tensor& residual, Tensor& y, const Stream& stream) const;
  /// dy [local rows, out] -> dx [rows, in/tp]; adds dW and db (db is the same on every TP rank).
  /// `rows`: the region's full row count (for the SP gather).
  Tensor backward(const Tensor& dy, const Tensor& x, int64_t rows, const Stream& stream) const;
  /// The same, for an input formed after the data gradient: `input(dx)` runs once dx is there
  /// and returns what the weight gradient reads of x (the MLP recomputes its activation output
  /// in the pass of the activation's own backward, which reads dx; in FP8 that pass may write
  /// the column-wise codes instead, LinearInput::fp8).
  Tensor backward(const Tensor& dy, const std::function<LinearInput(const Tensor& dx)>& input, int64_t rows,
                  const Stream& stream) const;
  const Fp8Linear& fp8() const { return fp8_; }

 private:
  ParameterStore* store_ = nullptr;
  ModelParallel mp_;
  ParameterStore::Handle weight_ = -1, bias_ = -1;
  Fp8Linear fp8_;
};

}  // namespace megadlm::tp
