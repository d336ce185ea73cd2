// RankGenerator (the masked mixed-radix rule; see the header for the derivation and a worked
// example) and the process groups of Megatron's initialize_model_parallel (hierarchical CP and
// distributed-optimizer instances included).
#include "megadlm/parallel/rank_layout.h"
#include <algorithm>
#include <sstream>
#include "megadlm/core/error.h"

namespace megadlm::parallel {

namespace {

std::vector<std::string> split_dash(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find('-', start);
    if (end == std::string_view::npos) end = s.size();
    out.emplace_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::string join(const std::vector<int>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

// Long groups (thousands of ranks) stay one short line: "[0..63] (64 ranks)",
// "[0, 8, ..., 4088] (512 ranks)", or the first and last members.
std::string compact(const std::vector<int>& v) {
  if (v.size() <= 16) return join(v);
  const int stride = v[1] - v[0];
  bool progression = true;
  for (size_t i = 1; i < v.size() && progression; ++i) progression = v[i] - v[i - 1] == stride;
  const std::string count = std::string(" (").append(std::to_string(v.size())).append(" ranks)");
  std::string out(1, '[');
  if (progression && stride == 1)
    return out.append(std::to_string(v.front())).append("..").append(std::to_string(v.back()))
        .append("]").append(count);
  if (progression)
    return out.append(std::to_string(v[0])).append(", ").append(std::to_string(v[1]))
        .append(", ..., ").append(std::to_string(v.back())).append("]").append(count);
  for (size_t i = 0; i < 6; ++i) out.append(std::to_string(v[i])).append(", ");
  return out.append("..., ").append(std::to_string(v[v.size() - 2])).append(", ")
      .append(std::to_string(v.back())).append("]").append(count);
}

const std::vector<int>& empty_group() {
  static const std::vector<int> kEmpty;
  return kEmpty;
}

}  // namespace

// ------------------------------------------------------------------------------- RankGenerator

RankGenerator::RankGenerator(const GeneratorSizes& sizes, std::string_view order) {
  const std::pair<const char*, int> known[] = {
      {"tp", sizes.tp}, {"cp", sizes.cp}, {"ep", sizes.ep}, {"dp", sizes.dp}, {"pp", sizes.pp}};
  auto size_for = [&](const std::string& name) {
    for (const auto& [n, s] : known)
      if (name == n) return s;
    MDLM_FAIL("rank generator order '", order, "' names an unknown dimension '", name,
              "'; known: tp, cp, ep, dp, pp");
  };
  for (const auto& [n, s] : known)
    MDLM_CHECK(s >= 1, "size of ", n, " must be at least 1, got ", s);
  MDLM_CHECK(sizes.ep == 1 || sizes.cp == 1, "a rank generator cannot have both ep (", sizes.ep,
             ") and cp (", sizes.cp, ") larger than 1");
  for (const std::string& name : split_dash(order)) {
    MDLM_CHECK(std::find(dims_.begin(), dims_.end(), name) == dims_.end(),
               "rank generator order '", order, "' repeats '", name, "'");
    sizes_.push_back(size_for(name));
    dims_.push_back(name);
  }
  // Missing dimensions are appended in Megatron's fixed order; they must have size 1.
  for (const char* name : {"tp", "pp", "dp", "ep", "cp"}) {
    if (std::find(dims_.begin(), dims_.end(), name) != dims_.end()) continue;
    const int s = size_for(name);
    MDLM_CHECK(s == 1, "size of ", name, " is ", s, " but the order '", order,
               "' does not name it");
    dims_.push_back(name);
    sizes_.push_back(1);
  }
  strides_.resize(sizes_.size());
  long long stride = 1;
  for (size_t i = 0; i < sizes_.size(); ++i) {
    strides_[i] = static_cast<int>(stride);
    stride *= sizes_[i];
    MDLM_CHECK(stride <= (1LL << 30), "world size of the generator is too large");
  }
  world_size_ = static_cast<int>(stride);
}

int RankGenerator::index_of(std::string_view dim) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i] == dim) return static_cast<int>(i);
  MDLM_FAIL("unknown parallel dimension '", dim, "'; known: tp, cp, ep, dp, pp");
}

int RankGenerator::size_of(std::string_view dim) const { return sizes_[index_of(dim)]; }
int RankGenerator::stride_of(std::string_view dim) const { return strides_[index_of(dim)]; }

std::vector<std::vector<int>> RankGenerator::get_ranks(std::string_view token) const {
  std::vector<bool> masked(dims_.size(), false);
  for (const std::string& name : split_dash(token)) masked[index_of(name)] = true;
  std::vector<int> m_sizes, m_strides, u_sizes, u_strides;
  for (size_t i = 0; i < dims_.size(); ++i) {
    (masked[i] ? m_sizes : u_sizes).push_back(sizes_[i]);
    (masked[i] ? m_strides : u_strides).push_back(strides_[i]);
  }
  int group_size = 1;
  for (int s : m_sizes) group_size *= s;
  const int num_groups = world_size_ / group_size;
  // Offsets of the members (mixed radix over the masked dimensions, first fastest); the same
  // for every group, so computed once.
  std::vector<int> member_offset(static_cast<size_t>(group_size));
  for (int j = 0; j < group_size; ++j) {
    int rest = j, offset = 0;
    for (size_t k = 0; k < m_sizes.size(); ++k) {
      offset += (rest % m_sizes[k]) * m_strides[k];
      rest /= m_sizes[k];
    }
    member_offset[static_cast<size_t>(j)] = offset;
  }
  std::vector<std::vector<int>> out(static_cast<size_t>(num_groups));
  for (int g = 0; g < num_groups; ++g) {
    int rest = g, base = 0;
    for (size_t k = 0; k < u_sizes.size(); ++k) {
      base += (rest % u_sizes[k]) * u_strides[k];
      rest /= u_sizes[k];
    }
    std::vector<int>& group = out[static_cast<size_t>(g)];
    group.resize(static_cast<size_t>(group_size));
    for (int j = 0; j < group_size; ++j)
      group[static_cast<size_t>(j)] = base + member_offset[static_cast<size_t>(j)];
  }
  return out;
}

// --------------------------------------------------------------------------------- RankLayout

const char* group_kind_name(GroupKind kind) {
  switch (kind) {
    case GroupKind::Tp: return "tp";
    case GroupKind::Cp: return "cp";
    case GroupKind::Dp: return "dp";
    case GroupKind::DpCp: return "dp-cp";
    case GroupKind::Pp: return "pp";
    case GroupKind::TpPp: return "tp-pp (model parallel)";
    case GroupKind::TpDp: return "tp-dp";
    case GroupKind::TpCp: return "tp-cp";
    case GroupKind::TpDpCp: return "tp-dp-cp";
    case GroupKind::Embedding: return "embedding";
    case GroupKind::PositionEmbedding: return "position-embedding";
    case GroupKind::ExpertEp: return "expert-ep";
    case GroupKind::ExpertTp: return "expert-tp";
    case GroupKind::ExpertTpEp: return "expert-tp-ep";
    case GroupKind::ExpertTpEpPp: return "expert-tp-ep-pp";
    case GroupKind::ExpertDp: return "expert-dp";
    case GroupKind::DistOptIntra: return "dist-opt intra-instance";
    case GroupKind::DistOptInter: return "dist-opt inter-instance";
    case GroupKind::kCount: break;
  }
  return "?";
}

void RankLayout::index(Partition& p, int world_size) {
  p.group_index.assign(static_cast<size_t>(world_size), -1);
  p.position.assign(static_cast<size_t>(world_size), -1);
  for (size_t g = 0; g < p.groups.size(); ++g) {
    for (size_t i = 0; i < p.groups[g].size(); ++i) {
      const int r = p.groups[g][i];
      MDLM_CHECK(r >= 0 && r < world_size, "rank ", r, " outside the world of ", world_size);
      MDLM_CHECK(p.group_index[static_cast<size_t>(r)] == -1, "rank ", r,
                 " is in two groups of one kind");
      p.group_index[static_cast<size_t>(r)] = static_cast<int>(g);
      p.position[static_cast<size_t>(r)] = static_cast<int>(i);
    }
  }
}

RankLayout RankLayout::build(const ParallelConfig& c) {
  const int world = c.world_size;
  const int tp = c.tensor_model_parallel_size, pp = c.pipeline_model_parallel_size;
  const int cp = c.context_parallel_size, ep = c.expert_model_parallel_size;
  const int etp = c.expert_tensor_parallel_size;
  MDLM_CHECK(world >= 1 && tp >= 1 && pp >= 1 && cp >= 1 && ep >= 1 && etp >= 1,
             "parallel sizes must be at least 1 (world ", world, ", tp ", tp, ", pp ", pp, ", cp ",
             cp, ", ep ", ep, ", etp ", etp, ")");
  MDLM_CHECK(world % (tp * pp * cp) == 0, "world size ", world,
             " is not divisible by tp·pp·cp = ", tp * pp * cp);
  MDLM_CHECK(world % (etp * ep * pp) == 0, "world size ", world,
             " is not divisible by etp·ep·pp = ", etp * ep * pp);
  RankLayout L;
  L.world_size_ = world;
  L.dp_ = world / (tp * pp * cp);
  L.edp_ = world / (etp * ep * pp);
  L.parts_.resize(static_cast<size_t>(GroupKind::kCount));

  const std::string order = c.order();
  const RankGenerator dense({.tp = tp, .cp = cp, .ep = 1, .dp = L.dp_, .pp = pp}, order);
  const RankGenerator expert({.tp = etp, .cp = 1, .ep = ep, .dp = L.edp_, .pp = pp}, order);

  const std::pair<GroupKind, const char*> dense_groups[] = {
      {GroupKind::Tp, "tp"},       {GroupKind::Cp, "cp"},       {GroupKind::Dp, "dp"},
      {GroupKind::DpCp, "dp-cp"},  {GroupKind::Pp, "pp"},       {GroupKind::TpPp, "tp-pp"},
      {GroupKind::TpDp, "tp-dp"},  {GroupKind::TpCp, "tp-cp"},  {GroupKind::TpDpCp, "tp-dp-cp"}};
  for (const auto& [kind, token] : dense_groups) L.part(kind).groups = dense.get_ranks(token);
  const std::pair<GroupKind, const char*> expert_groups[] = {
      {GroupKind::ExpertEp, "ep"},
      {GroupKind::ExpertTp, "tp"},
      {GroupKind::ExpertTpEp, "tp-ep"},
      {GroupKind::ExpertTpEpPp, "tp-ep-pp"},
      {GroupKind::ExpertDp, "dp"}};
  for (const auto& [kind, token] : expert_groups) L.part(kind).groups = expert.get_ranks(token);
  MDLM_CHECK(expert.get_ranks("pp") == L.part(GroupKind::Pp).groups,
             "dense and expert pipeline groups differ (order ", order, ", tp ", tp, ", etp ", etp,
             "); with the tp-pp-dp order etp must equal tp");

  // Embedding groups: first and last stage of each pipeline group.
  for (const std::vector<int>& p : L.part(GroupKind::Pp).groups) {
    L.part(GroupKind::Embedding).groups.push_back(
        p.size() == 1 ? std::vector<int>{p.front()} : std::vector<int>{p.front(), p.back()});
    L.part(GroupKind::PositionEmbedding).groups.push_back({p.front()});
  }

  // Distributed-optimizer instances: n = dp·cp / N, consecutive intra slices, strided
  // inter slices (the upstream fix; MegaDLMs used dp / N).
  const int instances = c.num_distributed_optimizer_instances;
  MDLM_CHECK(instances >= 1 && (L.dp_ * cp) % instances == 0, "dp·cp = ", L.dp_ * cp,
             " is not divisible by the number of distributed-optimizer instances ", instances);
  const size_t n = static_cast<size_t>(L.dp_ * cp / instances);
  for (const std::vector<int>& g : L.part(GroupKind::DpCp).groups) {
    for (size_t i = 0; i < static_cast<size_t>(instances); ++i)
      L.part(GroupKind::DistOptIntra).groups.emplace_back(g.begin() + static_cast<long>(i * n),
                                                          g.begin() + static_cast<long>((i + 1) * n));
    for (size_t j = 0; j < n; ++j) {
      std::vector<int> inter;
      for (size_t k = j; k < g.size(); k += n) inter.push_back(g[k]);
      L.part(GroupKind::DistOptInter).groups.push_back(std::move(inter));
    }
  }
  for (Partition& p : L.parts_) index(p, world);

  // Hierarchical CP: level l groups of cp group R are, for k < cp/acc_l and j < acc_{l-1},
  // [R[j + i·acc_{l-1} + k·acc_l] for i < h_l].
  const std::vector<int>& h = c.hierarchical_context_parallel_sizes;
  if (!h.empty()) {
    long long product = 1;
    for (int s : h) {
      MDLM_CHECK(s >= 1, "hierarchical context-parallel sizes must be at least 1, got ", s);
      product *= s;
    }
    MDLM_CHECK(product == cp, "hierarchical context-parallel sizes multiply to ", product,
               ", not to cp = ", cp);
    L.hier_cp_.resize(h.size());
    for (const std::vector<int>& R : L.part(GroupKind::Cp).groups) {
      int acc_prev = 1;
      for (size_t l = 0; l < h.size(); ++l) {
        const int acc = acc_prev * h[l];
        for (int k = 0; k < cp / acc; ++k) {
          for (int j = 0; j < acc_prev; ++j) {
            std::vector<int> group;
            for (int i = 0; i < h[l]; ++i)
              group.push_back(R[static_cast<size_t>(j + i * acc_prev + k * acc)]);
            L.hier_cp_[l].groups.push_back(std::move(group));
          }
        }
        acc_prev = acc;
      }
    }
    for (Partition& p : L.hier_cp_) index(p, world);
  }
  return L;
}

void RankLayout::check_rank(int rank) const {
  MDLM_CHECK(rank >= 0 && rank < world_size_, "rank ", rank, " outside the world of ", world_size_);
}

const std::vector<std::vector<int>>& RankLayout::groups(GroupKind kind) const {
  MDLM_CHECK(kind != GroupKind::kCount, "GroupKind::kCount is not a group");
  return part(kind).groups;
}

const std::vector<int>& RankLayout::group_of(GroupKind kind, int rank) const {
  check_rank(rank);
  const Partition& p = part(kind);
  const int g = p.group_index[static_cast<size_t>(rank)];
  return g < 0 ? empty_group() : p.groups[static_cast<size_t>(g)];
}

int RankLayout::rank_in_group(GroupKind kind, int rank) const {
  check_rank(rank);
  return part(kind).position[static_cast<size_t>(rank)];
}

const std::vector<std::vector<int>>& RankLayout::hierarchical_cp_groups(int level) const {
  MDLM_CHECK(level >= 0 && level < num_hierarchical_cp_levels(), "hierarchical CP level ", level,
             " outside [0, ", num_hierarchical_cp_levels(), ")");
  return hier_cp_[static_cast<size_t>(level)].groups;
}

const std::vector<int>& RankLayout::hierarchical_cp_group_of(int level, int rank) const {
  check_rank(rank);
  const std::vector<std::vector<int>>& groups = hierarchical_cp_groups(level);
  const int g = hier_cp_[static_cast<size_t>(level)].group_index[static_cast<size_t>(rank)];
  return groups[static_cast<size_t>(g)];
}

RankCoordinates RankLayout::coordinates(int rank) const {
  check_rank(rank);
  return {.tp = rank_in_group(GroupKind::Tp, rank),
          .cp = rank_in_group(GroupKind::Cp, rank),
          .dp = rank_in_group(GroupKind::Dp, rank),
          .pp = rank_in_group(GroupKind::Pp, rank),
          .ep = rank_in_group(GroupKind::ExpertEp, rank),
          .expert_tp = rank_in_group(GroupKind::ExpertTp, rank),
          .expert_dp = rank_in_group(GroupKind::ExpertDp, rank)};
}

int RankLayout::pipeline_next_rank(int rank) const {
  const std::vector<int>& p = group_of(GroupKind::Pp, rank);
  const size_t i = static_cast<size_t>(rank_in_group(GroupKind::Pp, rank));
  return p[(i + 1) % p.size()];
}

int RankLayout::pipeline_prev_rank(int rank) const {
  const std::vector<int>& p = group_of(GroupKind::Pp, rank);
  const size_t i = static_cast<size_t>(rank_in_group(GroupKind::Pp, rank));
  return p[(i + p.size() - 1) % p.size()];
}

// ------------------------------------------------------------------------------------- report

std::string format_layout(const ParallelConfig& c, int rank) {
  const RankLayout L = RankLayout::build(c);
  const RankCoordinates x = L.coordinates(rank);
  std::ostringstream os;
  os << "------------------------ parallel layout ------------------------\n";
  os << "world size " << c.world_size << " = tp " << c.tensor_model_parallel_size << " x cp "
     << c.context_parallel_size << " x dp " << L.data_parallel_size() << " x pp "
     << c.pipeline_model_parallel_size << "; experts: etp " << c.expert_tensor_parallel_size
     << " x ep " << c.expert_model_parallel_size << " x edp " << L.expert_data_parallel_size()
     << " x pp " << c.pipeline_model_parallel_size << "\n";
  os << "virtual pipeline stages " << std::max(1, c.virtual_pipeline_model_parallel_size)
     << "; rank order " << c.order() << "\n";
  os << "rank " << rank << ": tp_rank " << x.tp << ", cp_rank " << x.cp << ", dp_rank " << x.dp
     << ", pp_rank " << x.pp << ", ep_rank " << x.ep << ", expert_tp_rank " << x.expert_tp
     << ", expert_dp_rank " << x.expert_dp << "\n";
  os << "groups of rank " << rank << ":\n";
  auto line = [&](const std::string& name, const std::vector<int>& members) {
    const size_t dots = name.size() < 28 ? 28 - name.size() : 1;
    os << "  " << name << " " << std::string(dots, '.') << " "
       << (members.empty() ? std::string("(none)") : compact(members)) << "\n";
  };
  for (int k = 0; k < static_cast<int>(GroupKind::kCount); ++k) {
    const GroupKind kind = static_cast<GroupKind>(k);
    const bool dist_opt = kind == GroupKind::DistOptIntra || kind == GroupKind::DistOptInter;
    if (dist_opt && c.num_distributed_optimizer_instances <= 1) continue;
    line(group_kind_name(kind), L.group_of(kind, rank));
  }
  for (int l = 0; l < L.num_hierarchical_cp_levels(); ++l)
    line("hierarchical-cp level " + std::to_string(l + 1), L.hierarchical_cp_group_of(l, rank));
  os << "-------------------- end of parallel layout ---------------------\n";
  return os.str();
}

}  // namespace megadlm::parallel
