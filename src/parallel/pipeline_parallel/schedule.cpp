// Pipeline schedules as action lists (no-pipelining, 1F1B, interleaved 1F1B with batched p2p)
// and the simulator that checks a set of lists. The orders follow Megatron-Core's
// schedules.py (non-overlapped, batch_p2p_comm variant); derivations and worked examples sit
// next to each builder, the full picture in docs/parallelism/pipeline_schedules.md.
#include "megadlm/parallel/pipeline_parallel/schedule.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <sstream>
#include "megadlm/core/error.h"

namespace megadlm::pp {

namespace {

using Kind = Transfer::Kind;

// ------------------------------------------------------------------------------ helpers

int resolved_group_size(int group_size, int pp_size) { return group_size == 0 ? pp_size : group_size; }

Action compute(ActionType type, int micro_batch, int chunk) {
  Action a;
  a.type = type;
  a.micro_batch = micro_batch;
  a.chunk = chunk;
  return a;
}

// Posting order inside a group: the activation pair before the gradient pair, sends before
// receives (see the Action comment in the header for why this matters at pp = 2).
int posting_position(Kind kind) {
  switch (kind) {
    case Kind::SendNext: return 0;
    case Kind::SendPrev: return 1;
    case Kind::RecvPrev: return 2;
    case Kind::RecvNext: return 3;
  }
  return 4;
}

// Appends one Communicate action holding `transfers` in posting order; nothing when empty
// (a call that Megatron turns into a no-op on a pipeline end).
void communicate(std::vector<Action>& out, std::vector<Transfer> transfers) {
  if (transfers.empty()) return;
  std::stable_sort(transfers.begin(), transfers.end(), [](const Transfer& a, const Transfer& b) {
    return posting_position(a.kind) < posting_position(b.kind);
  });
  Action a;
  a.type = ActionType::Communicate;
  a.transfers = std::move(transfers);
  out.push_back(std::move(a));
}

Transfer transfer(Kind kind, int micro_batch, int chunk) { return Transfer{kind, micro_batch, chunk}; }

// Megatron's schedule table (see schedule_table() in the header), without validation.
std::vector<VirtualMicroBatch> make_table(int num_micro_batches, int virtual_stages, int group_size) {
  std::vector<VirtualMicroBatch> table;
  table.reserve(static_cast<size_t>(num_micro_batches) * virtual_stages);
  for (int first = 0; first < num_micro_batches; first += group_size) {
    // The last group runs to M: it takes the remainder M % N when that is not 0.
    const int end = first + group_size >= num_micro_batches ? num_micro_batches : first + group_size;
    for (int chunk = 0; chunk < virtual_stages; ++chunk)
      for (int mb = first; mb < end; ++mb) table.push_back({mb, chunk});
    if (end == num_micro_batches) break;
  }
  return table;
}

int warmup_unchecked(const ScheduleConfig& c) {
  switch (schedule_kind(c)) {
    case ScheduleKind::NoPipelining: return 0;
    case ScheduleKind::OneFOneB: return std::min(c.pp_size - c.pp_rank - 1, c.num_micro_batches);
    case ScheduleKind::Interleaved: {
      const int total = c.num_micro_batches * c.virtual_stages;
      if (c.forward_only) return total;
      const int n = resolved_group_size(c.microbatch_group_size, c.pp_size);
      return std::min(2 * (c.pp_size - c.pp_rank - 1) + (c.virtual_stages - 1) * n, total);
    }
  }
  return 0;
}

template <typename T>
std::string join(const std::vector<T>& values, size_t max_items) {
  std::ostringstream os;
  for (size_t i = 0; i < values.size() && i < max_items; ++i) os << (i ? ", " : "") << values[i];
  if (values.size() > max_items) os << ", …";
  return os.str();
}

bool r1_holds(int pp, int n, int m) { return pp <= n && n <= m && (m % n == 0 || m % n >= pp); }

// The R-1 problem text: the values, what failed, and what would be valid.
std::string r1_problem(const ScheduleConfig& c) {
  const int pp = c.pp_size, m = c.num_micro_batches;
  const int n = resolved_group_size(c.microbatch_group_size, pp);
  std::ostringstream os;
  os << "R-1 (interleaved 1F1B, virtual_stages=" << c.virtual_stages
     << "): the microbatch group size N must satisfy pp <= N <= M and (M % N == 0 or M % N >= pp); "
     << "got pp=" << pp << ", N=" << n << (c.microbatch_group_size == 0 ? " (default N = pp)" : "")
     << ", M=" << m << ": ";
  if (n < pp)
    os << "N < pp";
  else if (n > m)
    os << "N > M";
  else
    os << "M % N = " << m % n << " is neither 0 nor >= pp (the last group would leave a bubble)";
  std::vector<int> valid_n;
  for (int k = pp; k <= m; ++k)
    if (r1_holds(pp, k, m)) valid_n.push_back(k);
  os << ". Valid N for pp=" << pp << ", M=" << m << ": ";
  if (valid_n.empty())
    os << "none (at least pp=" << pp << " micro-batches are needed)";
  else
    os << join(valid_n, 12);
  if (n >= pp) {
    std::vector<int> valid_m;
    for (int k = std::max(n, m - 2 * n); k <= m + 2 * n; ++k)
      if (r1_holds(pp, n, k)) valid_m.push_back(k);
    os << ". Valid M near " << m << " for pp=" << pp << ", N=" << n << ": " << join(valid_m, 12);
  }
  if (c.microbatch_group_size == 0) os << " (with the default N = pp: M a multiple of pp)";
  return os.str();
}

// ------------------------------------------------------------------------------ no pipelining
//
// pp = 1: each micro-batch runs forward then backward (Megatron's forward_backward_no_pipelining);
// there is nobody to talk to. M = 2: F0.0 B0.0 F1.0 B1.0.
std::vector<Action> build_no_pipelining(const ScheduleConfig& c) {
  std::vector<Action> out;
  for (int mb = 0; mb < c.num_micro_batches; ++mb) {
    out.push_back(compute(ActionType::Forward, mb, 0));
    if (!c.forward_only) out.push_back(compute(ActionType::Backward, mb, 0));
  }
  return out;
}

// ------------------------------------------------------------------------------ 1F1B
//
// Rank r runs w = min(pp − r − 1, M) warm-up forwards, then R = M − w steady steps of one
// forward (micro-batch w + i) and one backward (the oldest, micro-batch i), then w cool-down
// backwards (micro-batches R .. M − 1). Megatron's communication calls, each one group:
//   warm-up i:   recv_forward(i) ; F(i) ; send_forward(i)
//   before the steady state (R > 0): recv_forward(w)
//   steady i:    F(w + i) ; send_forward_recv_backward = {S>(w+i), R>(i)} ; B(i) ;
//                then send_backward_recv_forward = {S<(i), R<(w+i+1)}, or send_backward(i) when
//                i is the last steady step
//   forward-only steady i: F(w + i) ; send_forward ; recv_forward(w+i+1) unless last  (two groups)
//   cool-down j: recv_backward(R+j) ; B(R+j) ; send_backward(R+j)
// The first rank drops every receive-forward / send-backward, the last rank every send-forward /
// receive-backward; a call left with no transfer disappears.
//
// Worked example, pp = 4, M = 2, rank 2: w = min(1, 2) = 1, R = 1:
//   [R<0.0] F0.0 [S>0.0]           warm-up
//   [R<1.0]                        receive before the steady state
//   F1.0 [S>1.0 R>0.0] B0.0 [S<0.0] steady (last step: send_backward only)
//   [R>1.0] B1.0 [S<1.0]           cool-down
std::vector<Action> build_one_f_one_b(const ScheduleConfig& c) {
  const bool first = c.pp_rank == 0, last = c.pp_rank == c.pp_size - 1;
  const int m = c.num_micro_batches;
  const int w = warmup_unchecked(c), steady = m - w;
  std::vector<Action> out;
  auto recv_forward = [&](int mb) {
    if (!first) communicate(out, {transfer(Kind::RecvPrev, mb, 0)});
  };
  auto send_forward = [&](int mb) {
    if (!last) communicate(out, {transfer(Kind::SendNext, mb, 0)});
  };

  for (int i = 0; i < w; ++i) {
    recv_forward(i);
    out.push_back(compute(ActionType::Forward, i, 0));
    send_forward(i);
  }
  if (steady > 0) recv_forward(w);
  for (int i = 0; i < steady; ++i) {
    const int fwd_mb = w + i, bwd_mb = i;
    const bool last_step = i == steady - 1;
    out.push_back(compute(ActionType::Forward, fwd_mb, 0));
    if (c.forward_only) {
      send_forward(fwd_mb);
      if (!last_step) recv_forward(fwd_mb + 1);
      continue;
    }
    if (!last)  // send_forward_recv_backward is a no-op on the last stage
      communicate(out, {transfer(Kind::SendNext, fwd_mb, 0), transfer(Kind::RecvNext, bwd_mb, 0)});
    out.push_back(compute(ActionType::Backward, bwd_mb, 0));
    if (!first) {  // send_backward(_recv_forward) is a no-op on the first stage
      std::vector<Transfer> t{transfer(Kind::SendPrev, bwd_mb, 0)};
      if (!last_step) t.push_back(transfer(Kind::RecvPrev, fwd_mb + 1, 0));
      communicate(out, std::move(t));
    }
  }
  if (!c.forward_only) {
    for (int j = 0; j < w; ++j) {
      const int mb = steady + j;
      if (!last) communicate(out, {transfer(Kind::RecvNext, mb, 0)});
      out.push_back(compute(ActionType::Backward, mb, 0));
      if (!first) communicate(out, {transfer(Kind::SendPrev, mb, 0)});
    }
  }
  return out;
}

// ------------------------------------------------------------------------------ interleaved 1F1B
//
// T = M·V virtual micro-batches k = 0..T−1 in schedule-table order: forward k runs table[k],
// backward k runs (table[k].mb, V − 1 − table[k].chunk). Warm-up w = min(2·(pp − r − 1) +
// (V − 1)·N, T) forwards (T when forward-only), R = T − w steady steps "F(w + k) ; B(k) ; one
// group", then backwards R..T−1. Every step ends with one group (Megatron's non-overlapped path):
//   before warm-up:  recv_forward for table[0]                       (not on rank 0)
//   warm-up k:       F(k) ; {S> F(k) output, R< input of the next forward to arrive,
//                            and on the last warm-up step when R > 0: R> grad for backward 0}
//   steady k:        F(w+k) ; B(k) ; {S> F(w+k), S< B(k), R< next input, R> next grad}
//   all warm-up (R = 0, training): recv_backward for backward 0
//   cool-down k:     B(k) ; {S< B(k), R> next grad}
// "S>" is absent for the last virtual stage (last rank, chunk V − 1), "S<" for the first (rank 0,
// chunk 0); nothing is received after the last forward / last backward.
//
// Which input arrives next (Megatron's recv_tensor_from_previous_stage, forward direction),
// after forward k on rank r:
//   r > 0:  the input of table[k + 1] — rank r − 1 ran the same table one step earlier.
//   r = 0:  the last rank's output of forward k − (pp − 1) (rank pp − 1 lags rank 0 by pp − 1
//           steps), i.e. micro-batch table[k − pp + 1].mb entering chunk table[k − pp + 1].chunk
//           + 1; nothing while k < pp − 1 or when that chunk is V − 1 (its output is the loss).
// Backward is the mirror image: the last rank leads, rank 0 trails, chunks count down, and the
// gradient arriving at rank pp − 1 after backward k is that of rank 0's backward k − (pp − 1),
// entering chunk (its chunk − 1); nothing when that chunk is 0. The grad received on the last
// warm-up step is the "next grad" after backward −1, i.e. backward 0 (r < pp − 1 only).
//
// Worked example, pp = 2, V = 2, N = 2, M = 4: table mb 0 1 0 1 2 3 2 3, chunk 0 0 1 1 0 0 1 1.
// Rank 1 (last, w = 2·0 + 1·2 = 2, R = 6):
//   [R<0.0]                              input of table[0]
//   F0.0 [S>0.0 R<1.0]                   k=0: output 0.0 wraps to rank 0 chunk 1; next input table[1]
//   F1.0 [S>1.0 R<0.1]                   k=1 (last warm-up): no grad (last rank leads backward)
//   F0.1 B0.1 [S<0.1 R<1.1]              steady 0: chunk 1 is the last virtual stage: no S>;
//                                        R> needs backward 0 − (pp − 1) < 0: none
//   F1.1 B1.1 [S<1.1 R<2.0 R>0.0]        steady 1: rank 0's backward 0 (0.1) sent 0.0 here
//   F2.0 B0.0 [S>2.0 S<0.0 R<3.0 R>1.0]  steady 2
//   F3.0 B1.0 [S>3.0 S<1.0 R<2.1]        steady 3: rank 0's backward 2 is chunk 0: nothing comes
//   F2.1 B2.1 [S<2.1 R<3.1]              steady 4
//   F3.1 B3.1 [S<3.1 R>2.0]              steady 5 (last: no R<)
//   B2.0 [S<2.0 R>3.0]  B3.0 [S<3.0]     cool-down
std::vector<Action> build_interleaved(const ScheduleConfig& c) {
  const int pp = c.pp_size, v = c.virtual_stages;
  const bool first_rank = c.pp_rank == 0, last_rank = c.pp_rank == pp - 1;
  const auto table = make_table(c.num_micro_batches, v, resolved_group_size(c.microbatch_group_size, pp));
  const int total = static_cast<int>(table.size());
  const int w = warmup_unchecked(c), steady = total - w;

  auto fwd = [&](int k) { return table[k]; };
  auto bwd = [&](int k) { return VirtualMicroBatch{table[k].micro_batch, v - 1 - table[k].chunk}; };
  auto first_virtual_stage = [&](int chunk) { return first_rank && chunk == 0; };
  auto last_virtual_stage = [&](int chunk) { return last_rank && chunk == v - 1; };
  // The input this rank receives after forward k (see the derivation above).
  auto next_input = [&](int k) -> std::optional<VirtualMicroBatch> {
    if (k + 1 >= total) return std::nullopt;
    if (!first_rank) return fwd(k + 1);
    if (k < pp - 1) return std::nullopt;
    const VirtualMicroBatch src = fwd(k - (pp - 1));
    if (src.chunk == v - 1) return std::nullopt;
    return VirtualMicroBatch{src.micro_batch, src.chunk + 1};
  };
  // The output-gradient this rank receives after backward k (k = −1: before backward 0).
  auto next_grad = [&](int k) -> std::optional<VirtualMicroBatch> {
    if (k + 1 >= total) return std::nullopt;
    if (!last_rank) return bwd(k + 1);
    if (k < pp - 1) return std::nullopt;
    const VirtualMicroBatch src = bwd(k - (pp - 1));
    if (src.chunk == 0) return std::nullopt;
    return VirtualMicroBatch{src.micro_batch, src.chunk - 1};
  };
  auto add = [](std::vector<Transfer>& t, Kind kind, const std::optional<VirtualMicroBatch>& x) {
    if (x) t.push_back(transfer(kind, x->micro_batch, x->chunk));
  };

  std::vector<Action> out;
  if (!first_rank) communicate(out, {transfer(Kind::RecvPrev, fwd(0).micro_batch, fwd(0).chunk)});
  for (int k = 0; k < w; ++k) {
    const VirtualMicroBatch f = fwd(k);
    out.push_back(compute(ActionType::Forward, f.micro_batch, f.chunk));
    std::vector<Transfer> t;
    if (!last_virtual_stage(f.chunk)) t.push_back(transfer(Kind::SendNext, f.micro_batch, f.chunk));
    add(t, Kind::RecvPrev, next_input(k));
    if (k == w - 1 && !c.forward_only && steady > 0) add(t, Kind::RecvNext, next_grad(-1));
    communicate(out, std::move(t));
  }
  for (int k = 0; k < steady; ++k) {
    const VirtualMicroBatch f = fwd(w + k), b = bwd(k);
    out.push_back(compute(ActionType::Forward, f.micro_batch, f.chunk));
    out.push_back(compute(ActionType::Backward, b.micro_batch, b.chunk));
    std::vector<Transfer> t;
    if (!last_virtual_stage(f.chunk)) t.push_back(transfer(Kind::SendNext, f.micro_batch, f.chunk));
    if (!first_virtual_stage(b.chunk)) t.push_back(transfer(Kind::SendPrev, b.micro_batch, b.chunk));
    add(t, Kind::RecvPrev, next_input(w + k));
    add(t, Kind::RecvNext, next_grad(k));
    communicate(out, std::move(t));
  }
  if (!c.forward_only) {
    if (steady == 0) {
      std::vector<Transfer> t;
      add(t, Kind::RecvNext, next_grad(-1));
      communicate(out, std::move(t));
    }
    for (int k = steady; k < total; ++k) {
      const VirtualMicroBatch b = bwd(k);
      out.push_back(compute(ActionType::Backward, b.micro_batch, b.chunk));
      std::vector<Transfer> t;
      if (!first_virtual_stage(b.chunk)) t.push_back(transfer(Kind::SendPrev, b.micro_batch, b.chunk));
      add(t, Kind::RecvNext, next_grad(k));
      communicate(out, std::move(t));
    }
  }
  return out;
}

// ------------------------------------------------------------------------------ simulator

const char* kind_token(Kind kind) {
  switch (kind) {
    case Kind::SendNext: return "S>";
    case Kind::RecvPrev: return "R<";
    case Kind::SendPrev: return "S<";
    case Kind::RecvNext: return "R>";
  }
  return "?";
}

std::string format_transfer(const Transfer& t) {
  std::string s = kind_token(t.kind);
  s += std::to_string(t.micro_batch);
  s += '.';
  s += std::to_string(t.chunk);
  return s;
}

bool is_send(Kind kind) { return kind == Kind::SendNext || kind == Kind::SendPrev; }

// Runs the lists in rounds: each rank advances until it blocks on a Communicate whose
// transfers are not all matched; the run ends when no rank can advance. All bookkeeping arrays
// are indexed [rank][mb·V + chunk].
class Simulator {
 public:
  Simulator(const std::vector<std::vector<Action>>& lists, int pp, int v, int m, int group_size)
      : lists_(lists), pp_(pp), v_(v), m_(m), group_size_(group_size), ranks_(pp), sends_(pp * pp),
        recvs_(pp * pp) {
    forward_only_ = true;
    for (const auto& list : lists)
      for (const Action& a : list)
        if (a.type == ActionType::Backward) forward_only_ = false;
    for (int r = 0; r < pp; ++r) {
      RankState& s = ranks_[r];
      for (auto* flags : {&s.forwarded, &s.backwarded, &s.input_posted, &s.input_arrived,
                          &s.grad_posted, &s.grad_arrived, &s.output_sent, &s.grad_sent})
        flags->assign(static_cast<size_t>(m) * v, 0);
      ScheduleConfig c;
      c.pp_rank = r;
      c.pp_size = pp;
      c.virtual_stages = v;
      c.num_micro_batches = m;
      c.microbatch_group_size = group_size;
      s.in_flight_bound = warmup_unchecked(c) + 1;
    }
  }

  SimulationReport run() {
    SimulationReport report;
    report.forward_only = forward_only_;
    const bool ok = advance_all() && check_finished();
    report.ok = ok;
    report.error = error_;
    for (const RankState& s : ranks_) {
      report.max_in_flight_per_rank = std::max(report.max_in_flight_per_rank, s.max_in_flight);
      report.idealized_time = std::max(report.idealized_time, s.clock);
    }
    return report;
  }

 private:
  struct RankState {
    size_t pc = 0;                  // next action
    bool posted = false;            // the Communicate at pc has been posted
    int unmatched = 0;              // its transfers still waiting for their peer
    std::vector<uint8_t> matched;   // per transfer of that Communicate
    std::vector<uint8_t> forwarded, backwarded, input_posted, input_arrived, grad_posted,
        grad_arrived, output_sent, grad_sent;
    int in_flight = 0, max_in_flight = 0, in_flight_bound = 0;
    int clock = 0;      // idealized time: one unit per Forward/Backward, transfers take none
    int ready_at = 0;   // when the last matched transfer of the current Communicate could complete
  };
  struct Posted {
    int rank;
    size_t action;
    size_t index;  // in the action's transfers
    int time;      // the owner's clock when it posted
  };

  const Transfer& transfer_of(const Posted& p) const { return lists_[p.rank][p.action].transfers[p.index]; }
  size_t slot(int mb, int chunk) const { return static_cast<size_t>(mb) * v_ + chunk; }
  int virtual_stage(int rank, int chunk) const { return chunk * pp_ + rank; }
  int last_virtual_stage() const { return v_ * pp_ - 1; }

  std::string where(int rank, size_t action) const {
    return "rank " + std::to_string(rank) + ", action " + std::to_string(action) + " (" +
           format_action(lists_[rank][action]) + ")";
  }
  bool fail(const std::string& message) {
    error_ = message;
    return false;
  }

  bool in_range(int mb, int chunk) const { return mb >= 0 && mb < m_ && chunk >= 0 && chunk < v_; }

  bool advance_all() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (int r = 0; r < pp_; ++r) {
        RankState& s = ranks_[r];
        const auto& list = lists_[r];
        while (s.pc < list.size()) {
          const Action& a = list[s.pc];
          if (a.type != ActionType::Communicate) {
            if (!run_compute(r, s.pc)) return false;
            ++s.clock;
            ++s.pc;
            progress = true;
            continue;
          }
          if (!s.posted) {
            if (!post(r, s.pc)) return false;
            progress = true;
          }
          if (s.unmatched > 0) break;
          s.clock = std::max(s.clock, s.ready_at);
          s.posted = false;
          ++s.pc;
          progress = true;
        }
      }
    }
    return true;
  }

  bool run_compute(int r, size_t i) {
    RankState& s = ranks_[r];
    const Action& a = lists_[r][i];
    if (!a.transfers.empty()) return fail(where(r, i) + ": a Forward/Backward action carries transfers");
    if (!in_range(a.micro_batch, a.chunk))
      return fail(where(r, i) + ": micro-batch or chunk out of range (M=" + std::to_string(m_) +
                  ", V=" + std::to_string(v_) + ")");
    const size_t k = slot(a.micro_batch, a.chunk);
    const int stage = virtual_stage(r, a.chunk);
    if (a.type == ActionType::Forward) {
      if (s.forwarded[k]) return fail(where(r, i) + ": forwarded twice");
      if (stage > 0 && !s.input_arrived[k])
        return fail(where(r, i) + ": forward of virtual stage " + std::to_string(stage) +
                    " before its input arrived (no completed R<" + std::to_string(a.micro_batch) +
                    "." + std::to_string(a.chunk) + " earlier)");
      s.forwarded[k] = 1;
      if (!forward_only_) {
        s.max_in_flight = std::max(s.max_in_flight, ++s.in_flight);
        if (s.in_flight > s.in_flight_bound)
          return fail(where(r, i) + ": " + std::to_string(s.in_flight) +
                      " (micro-batch, chunk) pairs forwarded but not backwarded, above warm-up + 1 = " +
                      std::to_string(s.in_flight_bound) + " (warm-up of this rank for pp=" +
                      std::to_string(pp_) + ", V=" + std::to_string(v_) + ", M=" + std::to_string(m_) +
                      ", N=" + std::to_string(resolved_group_size(group_size_, pp_)) + ")");
      }
      return true;
    }
    if (s.backwarded[k]) return fail(where(r, i) + ": backwarded twice");
    if (!s.forwarded[k]) return fail(where(r, i) + ": backward before its forward");
    if (stage < last_virtual_stage() && !s.grad_arrived[k])
      return fail(where(r, i) + ": backward of virtual stage " + std::to_string(stage) +
                  " before its output-gradient arrived (no completed R>" +
                  std::to_string(a.micro_batch) + "." + std::to_string(a.chunk) + " earlier)");
    s.backwarded[k] = 1;
    --s.in_flight;
    return true;
  }

  // Posts the transfers of the Communicate at (r, i) onto their channels and matches them.
  bool post(int r, size_t i) {
    RankState& s = ranks_[r];
    const Action& a = lists_[r][i];
    if (a.transfers.empty()) return fail(where(r, i) + ": empty Communicate action");
    const int next = (r + 1) % pp_, prev = (r - 1 + pp_) % pp_;
    std::vector<int> channels;
    for (size_t j = 0; j < a.transfers.size(); ++j) {
      const Transfer& t = a.transfers[j];
      const std::string what = where(r, i) + ", transfer " + format_transfer(t);
      if (!in_range(t.micro_batch, t.chunk))
        return fail(what + ": micro-batch or chunk out of range (M=" + std::to_string(m_) +
                    ", V=" + std::to_string(v_) + ")");
      const size_t k = slot(t.micro_batch, t.chunk);
      const int stage = virtual_stage(r, t.chunk);
      const bool gradient = t.kind == Kind::SendPrev || t.kind == Kind::RecvNext;
      if (gradient && forward_only_) return fail(what + ": gradient transfer in a forward-only run");
      int channel = 0;
      switch (t.kind) {
        case Kind::SendNext:
          if (stage == last_virtual_stage()) return fail(what + ": the last virtual stage sends no activation");
          if (!s.forwarded[k]) return fail(what + ": sends an output before its forward");
          if (s.output_sent[k]) return fail(what + ": output sent twice");
          s.output_sent[k] = 1;
          channel = r * pp_ + next;
          break;
        case Kind::SendPrev:
          if (stage == 0) return fail(what + ": the first virtual stage sends no input-gradient");
          if (!s.backwarded[k]) return fail(what + ": sends an input-gradient before its backward");
          if (s.grad_sent[k]) return fail(what + ": input-gradient sent twice");
          s.grad_sent[k] = 1;
          channel = r * pp_ + prev;
          break;
        case Kind::RecvPrev:
          if (stage == 0) return fail(what + ": the first virtual stage receives no activation");
          if (s.input_posted[k]) return fail(what + ": input received twice");
          s.input_posted[k] = 1;
          channel = prev * pp_ + r;
          break;
        case Kind::RecvNext:
          if (stage == last_virtual_stage()) return fail(what + ": the last virtual stage receives no gradient");
          if (s.grad_posted[k]) return fail(what + ": output-gradient received twice");
          s.grad_posted[k] = 1;
          channel = next * pp_ + r;
          break;
      }
      (is_send(t.kind) ? sends_ : recvs_)[channel].push_back(Posted{r, i, j, s.clock});
      channels.push_back(channel);
    }
    s.posted = true;
    s.unmatched = static_cast<int>(a.transfers.size());
    s.matched.assign(a.transfers.size(), 0);
    s.ready_at = s.clock;
    for (int channel : channels)
      if (!match(channel)) return false;
    return true;
  }

  // Pairs the heads of one channel's send and receive queues for as long as both have one.
  bool match(int channel) {
    auto& sends = sends_[channel];
    auto& recvs = recvs_[channel];
    const int src = channel / pp_, dst = channel % pp_;
    while (!sends.empty() && !recvs.empty()) {
      const Posted ps = sends.front(), pr = recvs.front();
      sends.pop_front();
      recvs.pop_front();
      const Transfer& ts = transfer_of(ps);
      const Transfer& tr = transfer_of(pr);
      // What the receiver must be waiting for: same micro-batch, the kind's counterpart, and the
      // chunk shifted at the ring wrap-around (last rank → chunk + 1 of rank 0; rank 0 → chunk − 1
      // of the last rank).
      const bool activation = ts.kind == Kind::SendNext;
      const Kind want_kind = activation ? Kind::RecvPrev : Kind::RecvNext;
      const int want_chunk =
          activation ? (src == pp_ - 1 ? ts.chunk + 1 : ts.chunk) : (src == 0 ? ts.chunk - 1 : ts.chunk);
      if (tr.kind != want_kind || tr.micro_batch != ts.micro_batch || tr.chunk != want_chunk) {
        std::ostringstream os;
        os << "mismatch on channel rank " << src << " -> rank " << dst << ": " << where(ps.rank, ps.action)
           << " sends " << format_transfer(ts) << " (the " << (activation ? "input" : "output-gradient")
           << " of rank " << dst << "'s micro-batch " << ts.micro_batch << ", chunk " << want_chunk
           << "), but the receive it meets in FIFO order is " << format_transfer(tr) << " at "
           << where(pr.rank, pr.action);
        return fail(os.str());
      }
      RankState& receiver = ranks_[pr.rank];
      (activation ? receiver.input_arrived : receiver.grad_arrived)[slot(tr.micro_batch, tr.chunk)] = 1;
      for (const Posted& p : {ps, pr}) {
        RankState& owner = ranks_[p.rank];
        owner.matched[p.index] = 1;
        --owner.unmatched;
        owner.ready_at = std::max(owner.ready_at, std::max(ps.time, pr.time));
      }
    }
    return true;
  }

  bool check_finished() {
    std::ostringstream stuck;
    for (int r = 0; r < pp_; ++r) {
      const RankState& s = ranks_[r];
      if (s.pc == lists_[r].size()) continue;
      stuck << "\n  " << where(r, s.pc) << " waits for";
      const Action& a = lists_[r][s.pc];
      for (size_t j = 0; j < a.transfers.size(); ++j)
        if (!s.matched[j]) stuck << ' ' << format_transfer(a.transfers[j]);
      stuck << " (" << s.pc << " of " << lists_[r].size() << " actions done)";
    }
    if (!stuck.str().empty()) return fail("deadlock: no rank can advance;" + stuck.str());
    for (int r = 0; r < pp_; ++r) {
      const RankState& s = ranks_[r];
      for (int mb = 0; mb < m_; ++mb)
        for (int chunk = 0; chunk < v_; ++chunk) {
          const std::string id = std::to_string(mb) + "." + std::to_string(chunk);
          if (!s.forwarded[slot(mb, chunk)])
            return fail("rank " + std::to_string(r) + " never runs F" + id);
          if (!forward_only_ && !s.backwarded[slot(mb, chunk)])
            return fail("rank " + std::to_string(r) + " never runs B" + id);
        }
    }
    return true;
  }

  const std::vector<std::vector<Action>>& lists_;
  int pp_, v_, m_, group_size_;
  bool forward_only_ = true;
  std::vector<RankState> ranks_;
  std::vector<std::deque<Posted>> sends_, recvs_;  // per channel src·pp + dst, in posting order
  std::string error_;
};

}  // namespace

// ------------------------------------------------------------------------------ public API

ScheduleKind schedule_kind(const ScheduleConfig& config) {
  if (config.pp_size == 1) return ScheduleKind::NoPipelining;
  if (config.virtual_stages == 1) return ScheduleKind::OneFOneB;
  return ScheduleKind::Interleaved;
}

void validate(const ScheduleConfig& c) {
  std::vector<std::string> problems;
  if (c.pp_size < 1) problems.push_back("pp_size=" + std::to_string(c.pp_size) + " must be >= 1");
  if (c.pp_size >= 1 && (c.pp_rank < 0 || c.pp_rank >= c.pp_size))
    problems.push_back("pp_rank=" + std::to_string(c.pp_rank) + " must be in [0, " +
                       std::to_string(c.pp_size - 1) + "] for pp_size=" + std::to_string(c.pp_size));
  if (c.virtual_stages < 1)
    problems.push_back("virtual_stages=" + std::to_string(c.virtual_stages) + " must be >= 1");
  if (c.num_micro_batches < 1)
    problems.push_back("num_micro_batches=" + std::to_string(c.num_micro_batches) + " must be >= 1");
  if (c.microbatch_group_size < 0)
    problems.push_back("microbatch_group_size=" + std::to_string(c.microbatch_group_size) +
                       " must be >= 0 (0 = pp_size)");
  if (c.pp_size == 1 && c.virtual_stages > 1)
    problems.push_back("virtual_stages=" + std::to_string(c.virtual_stages) +
                       " needs pp_size > 1 (an interleaved schedule needs more than one pipeline "
                       "stage); valid: virtual_stages=1 with pp_size=1, or pp_size >= 2");
  if (problems.empty() && schedule_kind(c) == ScheduleKind::Interleaved &&
      !r1_holds(c.pp_size, microbatch_group_size(c), c.num_micro_batches))
    problems.push_back(r1_problem(c));
  if (problems.empty()) return;
  std::ostringstream os;
  os << "invalid pipeline schedule (pp_rank=" << c.pp_rank << ", pp_size=" << c.pp_size
     << ", virtual_stages=" << c.virtual_stages << ", num_micro_batches=" << c.num_micro_batches
     << ", microbatch_group_size=" << c.microbatch_group_size << "):";
  for (const auto& p : problems) os << "\n  - " << p;
  MDLM_FAIL(os.str());
}

int microbatch_group_size(const ScheduleConfig& config) {
  return resolved_group_size(config.microbatch_group_size, config.pp_size);
}

std::vector<VirtualMicroBatch> schedule_table(const ScheduleConfig& config) {
  validate(config);
  const int n = schedule_kind(config) == ScheduleKind::Interleaved ? microbatch_group_size(config)
                                                                   : config.num_micro_batches;
  return make_table(config.num_micro_batches, config.virtual_stages, n);
}

int warmup_micro_batches(const ScheduleConfig& config) {
  validate(config);
  return warmup_unchecked(config);
}

std::vector<Action> build_schedule(const ScheduleConfig& config) {
  validate(config);
  switch (schedule_kind(config)) {
    case ScheduleKind::NoPipelining: return build_no_pipelining(config);
    case ScheduleKind::OneFOneB: return build_one_f_one_b(config);
    case ScheduleKind::Interleaved: return build_interleaved(config);
  }
  return {};
}

std::string format_action(const Action& action) {
  switch (action.type) {
    case ActionType::Forward:
    case ActionType::Backward:
    {
      std::string s(1, action.type == ActionType::Forward ? 'F' : 'B');
      s += std::to_string(action.micro_batch);
      s += '.';
      s += std::to_string(action.chunk);
      return s;
    }
    case ActionType::Communicate: {
      std::string s = "[";
      for (size_t i = 0; i < action.transfers.size(); ++i) {
        if (i) s += ' ';
        s += format_transfer(action.transfers[i]);
      }
      s += ']';
      return s;
    }
  }
  return "?";
}

std::string format_schedule(const std::vector<Action>& actions) {
  std::string s;
  for (size_t i = 0; i < actions.size(); ++i) {
    if (i) s += ' ';
    s += format_action(actions[i]);
  }
  return s;
}

SimulationReport simulate(const std::vector<std::vector<Action>>& per_rank, int pp_size,
                          int virtual_stages, int num_micro_batches, int microbatch_group_size) {
  MDLM_CHECK(pp_size >= 1 && virtual_stages >= 1 && num_micro_batches >= 1 && microbatch_group_size >= 0,
             "simulate: pp_size=", pp_size, ", virtual_stages=", virtual_stages,
             ", num_micro_batches=", num_micro_batches, ", microbatch_group_size=",
             microbatch_group_size, " (sizes must be >= 1, the group size >= 0)");
  MDLM_CHECK(static_cast<int>(per_rank.size()) == pp_size, "simulate: ", per_rank.size(),
             " action lists for pp_size=", pp_size, " (one list per pipeline rank)");
  return Simulator(per_rank, pp_size, virtual_stages, num_micro_batches, microbatch_group_size).run();
}

}  // namespace megadlm::pp
