// Names of DiffusionConfig's enums, as their flags spell them.
#include "megadlm/diffusion/diffusion_config.h"
#include <cctype>

namespace megadlm {

const char* running_mode_name(RunningMode m) {
  switch (m) {
    case RunningMode::DiffLMNoShift: return "difflm-noshift";
    case RunningMode::Vanilla: return "vanilla";
  }
  return "?";
}

const char* dlm_loss_weight_name(DlmLossWeight w) {
  switch (w) {
    case DlmLossWeight::ExactRatio: return "exact_ratio";
    case DlmLossWeight::InvT: return "inv_t";
    case DlmLossWeight::InvTEps: return "inv_t_eps";
  }
  return "?";
}

const char* block_time_granularity_name(BlockTimeGranularity g) {
  switch (g) {
    case BlockTimeGranularity::Block: return "block";
    case BlockTimeGranularity::Sequence: return "sequence";
  }
  return "?";
}

int64_t DiffusionConfig::block_size_at(int64_t iteration) const {
  for (const auto& [size, until] : block_size_schedule)
    if (iteration < until) return size;
  return block_size;
}

namespace {

bool parse_positive(const std::string& s, int64_t& v) {
  if (s.empty() || s.size() > 18) return false;
  for (char ch : s)
    if (!std::isdigit(static_cast<unsigned char>(ch))) return false;
  v = std::stoll(s);
  return v > 0;
}

}  // namespace

std::string parse_block_size_schedule(const std::vector<std::string>& values,
                                      std::vector<std::pair<int64_t, int64_t>>& out) {
  out.clear();
  for (const std::string& v : values) {
    const size_t colon = v.find(':');
    int64_t size = 0, until = 0;
    if (colon == std::string::npos || !parse_positive(v.substr(0, colon), size) ||
        !parse_positive(v.substr(colon + 1), until))
      return "entry '" + v + "' is not SIZE:ITER (a block size and the iteration it lasts until, "
             "both positive integers, e.g. 4:500)";
    out.emplace_back(size, until);
  }
  return std::string();
}

}  // namespace megadlm
