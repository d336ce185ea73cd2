// Internal to training/arguments/: every flag with `choices` whose value the typed configs hold
// as an enum, and the one mapping from each choice word to its enum value. The rules and the
// conversion into RunConfig (run_config.cpp) read these flags as enums (enum_flag below), never
// by comparing the strings. Every choice of the flag, not-yet values included (a dry run builds
// a RunConfig from them too), has a row; check_enum_flags() and a unit test keep the rows and the
// flag table's `choices` equal.
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include "megadlm/core/error.h"
#include "megadlm/diffusion/diffusion_config.h"
#include "megadlm/model/moe_config.h"
#include "megadlm/model/transformer_config.h"
#include "megadlm/ops/attention.h"
#include "megadlm/parallel/parallel_config.h"
#include "megadlm/training/training_config.h"
#include "training/arguments/argument_state.h"

namespace megadlm::training::detail {

template <class E>
struct EnumChoice {
  std::string_view word;  ///< as typed after the flag
  E value;
};

// One table per enum type; a flag's choices map into the table of its destination's type.
// Words that Megatron accepts as aliases, and not-yet values, name the value megadlm runs (or
// would report in a dry run).
inline constexpr EnumChoice<RecomputeGranularity> kRecomputeGranularity[] = {
    {"full", RecomputeGranularity::Full}, {"selective", RecomputeGranularity::Selective}};
inline constexpr EnumChoice<RecomputeMethod> kRecomputeMethod[] = {
    {"uniform", RecomputeMethod::Uniform}, {"block", RecomputeMethod::Block}};
inline constexpr EnumChoice<PositionEmbeddingType> kPositionEmbedding[] = {
    {"learned_absolute", PositionEmbeddingType::LearnedAbsolute},
    {"rope", PositionEmbeddingType::Rope},
    {"none", PositionEmbeddingType::None},
    {"rope_2d_position_step", PositionEmbeddingType::LearnedAbsolute},  // not yet
    {"rope_position_learned_step", PositionEmbeddingType::LearnedAbsolute},  // not yet
    {"rope_position_sinusoid_step", PositionEmbeddingType::LearnedAbsolute}};  // not yet
inline constexpr EnumChoice<NormType> kNormalization[] = {
    {"LayerNorm", NormType::LayerNorm}, {"RMSNorm", NormType::RMSNorm}};
inline constexpr EnumChoice<ops::AttentionBackend> kAttentionBackend[] = {
    {"auto", ops::AttentionBackend::Auto},   {"fused", ops::AttentionBackend::Cudnn},
    {"cudnn", ops::AttentionBackend::Cudnn}, {"flash", ops::AttentionBackend::Flash},
    {"unfused", ops::AttentionBackend::Flash}, {"local", ops::AttentionBackend::Flash},
    {"custom", ops::AttentionBackend::Flash}};  // not yet
/// The mask as typed; vanilla mode trains causally whatever it says (run_config.cpp).
inline constexpr EnumChoice<AttentionMaskType> kAttentionMask[] = {
    {"no_mask", AttentionMaskType::NoMask},
    {"causal", AttentionMaskType::Causal},
    {"causal_bottom_right", AttentionMaskType::Causal},  // equal query and key lengths
    {"block_causal", AttentionMaskType::BlockCausal}};
inline constexpr EnumChoice<RunningMode> kRunningMode[] = {
    {"difflm-noshift", RunningMode::DiffLMNoShift},
    {"vanilla", RunningMode::Vanilla},
    {"test-forward", RunningMode::DiffLMNoShift}};  // not yet
inline constexpr EnumChoice<DlmLossWeight> kDlmLossWeight[] = {
    {"exact_ratio", DlmLossWeight::ExactRatio}, {"inv_t", DlmLossWeight::InvT},
    {"inv_t_eps", DlmLossWeight::InvTEps}};
/// `allgather` is the help text's spelling of TE's `all_gather`.
inline constexpr EnumChoice<cp::CommType> kCpCommType[] = {
    {"p2p", cp::CommType::P2P}, {"all_gather", cp::CommType::AllGather},
    {"allgather", cp::CommType::AllGather}, {"a2a", cp::CommType::A2A}, {"a2a+p2p", cp::CommType::A2AP2P}};
inline constexpr EnumChoice<BlockTimeGranularity> kBlockTimeGranularity[] = {
    {"block", BlockTimeGranularity::Block}, {"sequence", BlockTimeGranularity::Sequence}};
inline constexpr EnumChoice<SftLossNorm> kSftLossNorm[] = {
    {"answer_len", SftLossNorm::AnswerLength}, {"token", SftLossNorm::Token}};
inline constexpr EnumChoice<LrDecayStyle> kLrDecayStyle[] = {
    {"constant", LrDecayStyle::Constant}, {"linear", LrDecayStyle::Linear},
    {"cosine", LrDecayStyle::Cosine}, {"inverse-square-root", LrDecayStyle::InverseSquareRoot},
    {"WSD", LrDecayStyle::WSD}};
inline constexpr EnumChoice<WsdDecayStyle> kWsdDecayStyle[] = {
    {"exponential", WsdDecayStyle::Exponential}, {"linear", WsdDecayStyle::Linear},
    {"cosine", WsdDecayStyle::Cosine}};
inline constexpr EnumChoice<DeviceKind> kDevice[] = {{"cpu", DeviceKind::Cpu},
                                                     {"cuda", DeviceKind::Cuda}};
inline constexpr EnumChoice<RerunMode> kRerunMode[] = {
    {"disabled", RerunMode::Disabled}, {"validate_results", RerunMode::ValidateResults},
    {"report_stats", RerunMode::ReportStats}};
inline constexpr EnumChoice<ErrorInjectionType> kErrorInjection[] = {
    {"correct_result", ErrorInjectionType::CorrectResult},
    {"transient_error", ErrorInjectionType::TransientError},
    {"persistent_error", ErrorInjectionType::PersistentError}};
inline constexpr EnumChoice<MoeScoreFunction> kMoeScore[] = {
    {"softmax", MoeScoreFunction::Softmax}, {"sigmoid", MoeScoreFunction::Sigmoid}};
inline constexpr EnumChoice<MoeLoadBalancing> kMoeLoadBalancing[] = {
    {"aux_loss", MoeLoadBalancing::AuxLoss},
    {"seq_aux_loss", MoeLoadBalancing::SeqAuxLoss},
    {"sinkhorn", MoeLoadBalancing::Sinkhorn},
    {"none", MoeLoadBalancing::None},
    {"softmax_expert_choice", MoeLoadBalancing::ExpertChoice},
    {"sinkhorn_expert_choice", MoeLoadBalancing::AuxLoss}};  // not yet
inline constexpr EnumChoice<MoeDropPolicy> kMoeDropPolicy[] = {
    {"probs", MoeDropPolicy::Probs}, {"position", MoeDropPolicy::Position}};
inline constexpr EnumChoice<MoeDispatcher> kMoeDispatcher[] = {
    {"allgather", MoeDispatcher::AllGather}, {"alltoall", MoeDispatcher::AllToAll},
    {"alltoall_seq", MoeDispatcher::AllGather},  // not yet
    {"flex", MoeDispatcher::AllGather}};         // not yet
inline constexpr EnumChoice<ShardingStrategy> kShardingStrategy[] = {
    {"no_shard", ShardingStrategy::NoShard}, {"optim", ShardingStrategy::Optim},
    {"optim_grads", ShardingStrategy::OptimGrads},
    {"optim_grads_params", ShardingStrategy::OptimGradsParams}};

inline constexpr EnumChoice<Fp8Format> kFp8Format[] = {{"e4m3", Fp8Format::E4M3},
                                                       {"hybrid", Fp8Format::Hybrid}};
inline constexpr EnumChoice<Fp8Recipe> kFp8Recipe[] = {
    {"tensorwise", Fp8Recipe::Tensorwise}, {"delayed", Fp8Recipe::Delayed},
    {"mxfp8", Fp8Recipe::Mxfp8},  // refused (FP8-1)
    {"blockwise", Fp8Recipe::Blockwise},
    {"custom", Fp8Recipe::Custom}};  // refused (FP8-2)
inline constexpr EnumChoice<Fp8AmaxComputeAlgo> kFp8AmaxComputeAlgo[] = {
    {"most_recent", Fp8AmaxComputeAlgo::MostRecent}, {"max", Fp8AmaxComputeAlgo::Max}};

inline std::span<const EnumChoice<RecomputeGranularity>> enum_choices(RecomputeGranularity*) { return kRecomputeGranularity; }
inline std::span<const EnumChoice<RecomputeMethod>> enum_choices(RecomputeMethod*) { return kRecomputeMethod; }
inline std::span<const EnumChoice<PositionEmbeddingType>> enum_choices(PositionEmbeddingType*) { return kPositionEmbedding; }
inline std::span<const EnumChoice<NormType>> enum_choices(NormType*) { return kNormalization; }
inline std::span<const EnumChoice<ops::AttentionBackend>> enum_choices(ops::AttentionBackend*) { return kAttentionBackend; }
inline std::span<const EnumChoice<AttentionMaskType>> enum_choices(AttentionMaskType*) { return kAttentionMask; }
inline std::span<const EnumChoice<RunningMode>> enum_choices(RunningMode*) { return kRunningMode; }
inline std::span<const EnumChoice<DlmLossWeight>> enum_choices(DlmLossWeight*) { return kDlmLossWeight; }
inline std::span<const EnumChoice<SftLossNorm>> enum_choices(SftLossNorm*) { return kSftLossNorm; }
inline std::span<const EnumChoice<BlockTimeGranularity>> enum_choices(BlockTimeGranularity*) { return kBlockTimeGranularity; }
inline std::span<const EnumChoice<LrDecayStyle>> enum_choices(LrDecayStyle*) { return kLrDecayStyle; }
inline std::span<const EnumChoice<WsdDecayStyle>> enum_choices(WsdDecayStyle*) { return kWsdDecayStyle; }
inline std::span<const EnumChoice<DeviceKind>> enum_choices(DeviceKind*) { return kDevice; }
inline std::span<const EnumChoice<RerunMode>> enum_choices(RerunMode*) { return kRerunMode; }
inline std::span<const EnumChoice<ErrorInjectionType>> enum_choices(ErrorInjectionType*) { return kErrorInjection; }
inline std::span<const EnumChoice<MoeScoreFunction>> enum_choices(MoeScoreFunction*) { return kMoeScore; }
inline std::span<const EnumChoice<MoeLoadBalancing>> enum_choices(MoeLoadBalancing*) { return kMoeLoadBalancing; }
inline std::span<const EnumChoice<MoeDropPolicy>> enum_choices(MoeDropPolicy*) { return kMoeDropPolicy; }
inline std::span<const EnumChoice<MoeDispatcher>> enum_choices(MoeDispatcher*) { return kMoeDispatcher; }
inline std::span<const EnumChoice<ShardingStrategy>> enum_choices(ShardingStrategy*) { return kShardingStrategy; }
inline std::span<const EnumChoice<cp::CommType>> enum_choices(cp::CommType*) { return kCpCommType; }
inline std::span<const EnumChoice<Fp8Format>> enum_choices(Fp8Format*) { return kFp8Format; }
inline std::span<const EnumChoice<Fp8Recipe>> enum_choices(Fp8Recipe*) { return kFp8Recipe; }
inline std::span<const EnumChoice<Fp8AmaxComputeAlgo>> enum_choices(Fp8AmaxComputeAlgo*) { return kFp8AmaxComputeAlgo; }

/// The enum a choice word stands for. The parser has already checked the word against the
/// flag's choices, so a word without a row is a programming error (check_enum_flags finds it).
template <class E>
E enum_of_word(std::string_view word) {
  for (const EnumChoice<E>& c : enum_choices(static_cast<E*>(nullptr)))
    if (c.word == word) return c.value;
  MDLM_CHECK(false, "no enum value for the choice '", std::string(word), "'");
  return E{};
}

/// The flag `dest` (a String flag with choices) as an enum; `fallback` when it is None.
template <class E>
E enum_flag(const ArgState& a, const std::string& dest, E fallback) {
  return a.is_set(dest) ? enum_of_word<E>(a.s(dest)) : fallback;
}

/// Every enum-typed flag whose `choices` and table rows differ, one message each ("" = none):
/// run by the unit tests so that a new choice cannot reach a RunConfig unmapped.
std::vector<std::string> check_enum_flags();

}  // namespace megadlm::training::detail
