// Generation from a masked-diffusion LM: LLaDA's reference sampler (LLaDA's
// `generate.py`), exactly, plus optional faster decoding (off by default). docs/generation.md
// has the algorithm with the choices made where the reference leaves one open.
//
// The canvas of request b is [pads ; prompt_b ; M^G]: prompts of different lengths are left
// padded to the longest one, so the generated region (and its blocks) start at the same column
// in every row. Pad tokens form document 0 and the row's own tokens document 1
// (MicroBatch::document_ids), so neither attends to the other, and the row's positions count from
// its first prompt token: every row computes what it computes alone (bit for bit on the CPU).
//
// One step (block q, step i of s = S / (G / K) per block, global step t = q * s + i):
//   the model's logits at every masked position before the end of block q (with classifier-free
//   guidance also at the same positions of the canvas whose prompt tokens are all M),
//   ops::sample_proposals -> proposed token and confidence per position, then per row the
//   c_i most confident positions take their proposal (c = LLaDA's get_num_transfer_tokens: K // s
//   per step and one more for the first K % s steps; ties go to the lower position). Steps with
//   c_i = 0 change nothing in the reference and are not run. Decoded tokens are never remasked.
// Randomness (Gumbel noise, random remasking) is keyed by (seed, request's sample_index,
// position in the generated region, t): a request gives the same tokens alone or in any batch.
//
// Stopping at EOS (stop_at_eos): after each block, a row whose generated tokens so far contain
// eos_token is finished and leaves the batch. Decoded tokens never change, so its tokens up to
// and including the first EOS are exactly the reference's; the reference would go on to fill the
// blocks after it, which this skips (GenerationResult::tokens ends at the EOS).
//
// Confidence-threshold decoding (confidence_threshold > 0; Fast-dLLM's parallel decoding, not
// the reference): each step unmasks every masked position of the current block whose confidence
// is >= the threshold, and at least the most confident one; a block ends when it has no mask
// left, so a block takes 1..K steps. Global step t = q * K + i then.
//
// Approximate block-wise key/value cache (kv_cache != None; Fast-dLLM, not the reference): the
// first step of each block runs the whole canvas and keeps every layer's keys and values
// (LogitsModel::cached_logits with refresh); the block's later steps recompute only the columns
// of the block (Dual) or of the block and everything after it (Prefix) and take the other
// columns' keys and values from that refresh, stale by the tokens decoded since. The refresh
// step's candidates are those of the exact sampler; later steps' are the block's masked
// positions. A block's rows stay in the batch until its last step (the cache holds them).
// Combines with the threshold (Fast-dLLM's fastest setting).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm {

enum class Remasking { LowConfidence, Random };

const char* remasking_name(Remasking r);

/// --kv-cache: which columns a cached step recomputes (see the top of this file).
enum class KvCacheMode { None, Prefix, Dual };

const char* kv_cache_mode_name(KvCacheMode m);

struct SamplerConfig {
  int64_t gen_length = 128;    ///< G (--gen-length)
  int64_t steps = 128;         ///< S (--steps)
  int64_t block_length = 128;  ///< K (--block-length)
  Remasking remasking = Remasking::LowConfidence;
  double temperature = 0.0;    ///< tau (--temperature): 0 = greedy
  double cfg_scale = 0.0;      ///< w (--cfg-scale): 0 = no guidance
  int64_t mask_token = -1;     ///< M
  int64_t eos_token = -1;      ///< EOS id for stop_at_eos and logits_eos_inf (-1: none)
  bool stop_at_eos = false;
  bool logits_eos_inf = false; ///< LLaDA's logits_eos_inf: EOS is never proposed
  uint64_t seed = 0;
  double confidence_threshold = 0.0;  ///< > 0: parallel decoding (not the reference)
  KvCacheMode kv_cache = KvCacheMode::None;  ///< approximate key/value cache (not the reference)
};

/// Every problem with `config` for a model accepting `vocab` input ids
/// (LogitsModel::input_vocab_size: the mask and EOS ids must be among them), naming the flag
/// (`--gen-length 100` is not a multiple of `--block-length 32`, ...). Empty = valid. With
/// vocab <= 0 (model not loaded yet) only the checks that need no vocabulary.
std::vector<std::string> sampler_config_problems(const SamplerConfig& config, int64_t vocab);

struct GenerationRequest {
  std::vector<int32_t> prompt;  ///< token ids (may be empty)
  int64_t sample_index = 0;     ///< keys this request's random numbers (its index in the input)
};

struct GenerationResult {
  std::vector<int32_t> tokens;  ///< the G generated tokens, or up to the first EOS when stopped
  int64_t steps = 0;            ///< model evaluations (forward passes) this request took part in
  /// Block decoding (block_sampler.h): every forward it took part in, the cache's prefill and
  /// updates included (steps counts those that proposed its tokens); 0 for the full sampler.
  int64_t forwards = 0;
  bool stopped_at_eos = false;
};

/// A batch of canvases as the model is asked to evaluate it (bidirectional attention).
struct CanvasBatch {
  int64_t batch = 0, seq = 0;
  std::vector<int32_t> tokens;        ///< [batch * seq]
  std::vector<int32_t> positions;     ///< [batch * seq]
  std::vector<int32_t> document_ids;  ///< [batch * seq], or empty when no row is padded
  /// Block diffusion's training-time forward (block decoding without a cache,
  /// diffusion/block_sampler.h): each row is the doubled [x_t | x_0] (seq = 2L) and this holds
  /// its [batch, 4, L] document and block ranges (ops::AttentionArgs::block_ranges; no
  /// document_ids then). Empty otherwise.
  std::vector<int32_t> block_ranges;
};

/// What the sampler (and the likelihood estimator) needs of a model: logits at chosen tokens.
/// A small interface so that tests can drive the sampler with a deterministic fake model.
class LogitsModel {
 public:
  virtual ~LogitsModel() = default;
  /// Columns of the logits: the tokens a sampler may propose.
  virtual int64_t vocab_size() const = 0;
  /// Token ids the model accepts as input (the mask token and prompts may use any of them):
  /// the embedding's rows, which can be more than vocab_size() (a padded vocabulary).
  virtual int64_t input_vocab_size() const { return vocab_size(); }
  /// Positions the model has (learned position embeddings, or the length it was trained for
  /// with RoPE: --max-position-embeddings); a canvas must not be longer. 0: no limit.
  virtual int64_t max_positions() const { return 0; }
  /// The stream the returned logits live on.
  virtual const Stream& stream() const = 0;
  /// Logits [rows.size(), vocab_size()] of the flat token indices `rows` (b * seq + i) of
  /// `canvas`, on stream()'s device (CPU f32/f64, CUDA bf16/f32).
  virtual Tensor logits(const CanvasBatch& canvas, const std::vector<int32_t>& rows) = 0;

  /// Whether cached_logits is implemented (SamplerConfig::kv_cache needs it).
  virtual bool supports_kv_cache() const { return false; }
  /// Fast-dLLM's approximate key/value cache. refresh: as logits(), and every layer's keys and
  /// values of every position of `canvas` are kept (replacing the cache). Otherwise only the
  /// columns [col0, col1) of each row are recomputed: their keys and values replace the cached
  /// ones and every other column's come from the last refresh, which was of a canvas of the
  /// same shape; `rows` (flat indices b * seq + i, as for logits()) lie in those columns.
  /// The default throws: a model without a cache.
  virtual Tensor cached_logits(const CanvasBatch& canvas, const std::vector<int32_t>& rows, int64_t col0,
                               int64_t col1, bool refresh);

  /// Whether the exact key/value cache of block decoding is implemented (below).
  virtual bool supports_exact_cache() const { return false; }
  /// Block decoding's exact cache (diffusion/block_sampler.h): empties it and sizes it for
  /// `batch` canvases of `seq` columns. The default throws.
  virtual void exact_cache_reset(int64_t batch, int64_t seq);
  /// Runs the columns [col0, col0 + window.seq) of the cached canvases, given as `window`
  /// (tokens, positions and document_ids of those columns, every row): their keys and values are
  /// written into the cache at those columns, and each query attends to the cache's columns
  /// whose `key_documents` entry ([batch * seq], the cache's layout) equals its document, with
  /// `causal` only to columns <= its own (col0 = 0, or one column whose later columns
  /// key_documents hides, or an even width whose half divides col0). Logits
  /// [rows.size(), vocab_size()] of the window's flat indices `rows` (b * window.seq + i).
  virtual Tensor exact_cache_logits(const CanvasBatch& window, int64_t col0, const std::vector<int32_t>& key_documents,
                                    bool causal, const std::vector<int32_t>& rows);
  /// Block decoding's steps through CUDA graphs (--cuda-graphs, model/exact_cache_graphs.h): why
  /// this model cannot run them, naming the flag and the reason (empty: it can). Default: a
  /// model without them.
  virtual std::string exact_cache_graphs_unsupported() const;
  /// Turns the CUDA graphs of exact_cache_logits on or off for the calls that follow (the same
  /// logits, bit for bit). The default accepts off and throws for on.
  virtual void set_exact_cache_graphs(bool on);
};

/// Every problem of `requests` for `config` and a model with `vocab` input ids and
/// `max_positions` positions (0: no limit), each naming the prompt by its sample_index. Empty =
/// valid. A prompt token outside [0, vocab); the mask token in a prompt (the sampler would
/// take the position for one to fill, and the block's transfer counts, made for the generated
/// positions, would leave one of those masked); a prompt plus `--gen-length` longer than the
/// model (the limit named, and what would fit). Every prompt of a batch is checked, so a program
/// can refuse its input before it generates anything.
std::vector<std::string> request_problems(const std::vector<GenerationRequest>& requests, const SamplerConfig& config,
                                          int64_t vocab, int64_t max_positions);

/// Called by generate() once for each request as it is finished (stopped at EOS after a block,
/// or at the end): its position in `requests` and its result (the one generate() returns).
using GenerationFinished = std::function<void(size_t request, const GenerationResult& result)>;

/// Runs the sampler on `requests` as one batch (the caller chooses the batch size). Throws
/// megadlm::Error on an invalid configuration (sampler_config_problems) or request
/// (request_problems, with the model's input vocabulary and max_positions()). `on_finished`,
/// when given, sees each result as soon as it is final, so a program can write it then.
std::vector<GenerationResult> generate(LogitsModel& model, const std::vector<GenerationRequest>& requests,
                                       const SamplerConfig& config, const GenerationFinished& on_finished = {});

/// LLaDA's get_num_transfer_tokens for one block: `masked` tokens over `steps` steps.
std::vector<int64_t> transfer_schedule(int64_t masked, int64_t steps);

/// The canvas rows of `prompts` with `gen_length` mask tokens after each (the layout above):
/// left padding with `pad_token`, positions from each row's first prompt token, document ids
/// when any row is padded. `prompt_start[b]` receives the column of row b's first prompt token.
CanvasBatch build_canvas(const std::vector<std::vector<int32_t>>& prompts, int64_t gen_length,
                         int32_t mask_token, int32_t pad_token, std::vector<int64_t>& prompt_start);

/// A block-diffusion canvas (doubled rows [x_t | x_0] with block_ranges) whose half length L is
/// made a multiple of `multiple`: each half gets columns [L, Lp) appended, a document of its own
/// (tokens 0 at position 0, one block) that no real token sees, so the real rows' logits
/// are those of `c`. `rows` (flat indices into `c`) are renumbered into the result. The CUDA
/// flash kernels take whole 128-row query tiles in one half; other lengths would fall to the
/// simple kernels (InferenceModel pads for them). Returns `c` when L already is a multiple.
CanvasBatch pad_block_canvas(const CanvasBatch& c, int64_t multiple, std::vector<int32_t>& rows);

/// A canvas whose rows each hold one live document first, then padding (see compact_rows).
struct CompactCanvas {
  CanvasBatch canvas;            ///< the same tokens, each row's live document moved to its front
  std::vector<int32_t> rows;     ///< the requested rows' flat indices in `canvas`, same order
  std::vector<int32_t> lengths;  ///< [batch]: each row's live length (the rest is padding)
};

/// The left-padded canvas as dense rows with their live tokens first, for attention's padding
/// mask (ops::AttentionArgs::row_lengths), when that is exact for the requested `rows`: every
/// row is at most two documents and no requested row lies in the first of two (the padding).
/// Attention sees where a token is only through its position id, so moving a row's live
/// document to the front changes nothing any live token computes. The padding keeps its own
/// document (id 1, after the live document's 0) for the backends that run documents. nullopt
/// when the canvas has no documents or the condition fails.
std::optional<CompactCanvas> compact_rows(const CanvasBatch& canvas, const std::vector<int32_t>& rows);

}  // namespace megadlm
