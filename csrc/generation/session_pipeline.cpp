// The generation session under pipeline parallelism: decode steps as micro-batches round the
// stages, and the state every stage needs broadcast from the last one.
#include <vector>

#include "csrc/core/check.h"
#include "csrc/generation/session.h"

namespace warpformer {
namespace generation {

int64_t Session::micro_batches() const {
  const State& s = s_;
  const int64_t stages = model_->pipeline_stages();
  const bool split =
      model_->pipeline_group() != nullptr && stages > 1 && s.beam == 1 && s.rows >= stages;
  return split ? stages : 1;
}

// Pipeline parallelism, `steps` decode steps (after the first) with the rows split into one
// micro-batch per stage (M = P). Item k is micro-batch k % M of step k / M. The micro-batches go
// round a ring: stage s computes item k, then in one grouped call sends what it produced and
// receives what it needs for item k + 1 —
//   first stage:  sends the hidden states (and, when the next stage is not the last, the rows'
//                 token/position/length state, which that stage's attention reads) to stage 1;
//                 receives the state of item k + 1 - M (the same micro-batch one step earlier)
//                 from the last stage;
//   middle stage: sends hidden states + state on, receives those of item k + 1;
//   last stage:   selects the micro-batch's tokens, sends its new state to the first stage,
//                 receives the hidden states of item k + 1.
// With M = P every stage's group at one time pairs with its neighbours' groups, so the stages
// work on different micro-batches at once, across step boundaries, and no call waits for a peer
// that is waiting for it. The selection on the last stage is the same per-row work as without
// the split (rows are independent), so the tokens are the same. The call ends with the full state
// broadcast, as every unsplit step does, so the all-finished poll sees the same flags everywhere.
void Session::steps_split(int64_t steps) {
  State& s = s_;
  const int64_t M = micro_batches();
  Communicator* pp = model_->pipeline_group();
  const int stage = model_->pipeline_stage();
  const int last_rank = model_->pipeline_stages() - 1;
  const bool first = model_->first_stage(), last = model_->last_stage();
  const int64_t K = steps * M;
  const size_t row_bytes = model_->hidden_row_bytes();
  void* const input = model_->stage_input();
  void* const output = model_->stage_output();
  auto begin = [&](int64_t m) { return m * s.rows / M; };
  auto count = [&](int64_t m) { return begin(m + 1) - begin(m); };
  // The state stages need for an item: the token fed (first stage), its position and the
  // attention length; rows [r0, r0 + n) of each array.
  auto add_state = [&](std::vector<P2pOp>* ops, bool send, int64_t m, int peer) {
    const int64_t r0 = begin(m), bytes = count(m) * sizeof(int32_t);
    for (int32_t* a : {s.next_tok, s.cur_pos, s.attn_len}) {
      ops->push_back(P2pOp{send, a + r0, bytes, peer});
    }
  };
  // What this stage receives before item k.
  auto add_input = [&](std::vector<P2pOp>* ops, int64_t k) {
    const int64_t m = k % M;
    if (first) {
      if (k >= M) add_state(ops, false, m, last_rank);
      return;
    }
    ops->push_back(P2pOp{false, input, static_cast<int64_t>(count(m) * row_bytes), stage - 1});
    if (!last) add_state(ops, false, m, stage - 1);
  };
  const StepRows rows = step_rows();
  std::vector<P2pOp> ops;
  add_input(&ops, 0);
  pp->send_recv(ops.data(), static_cast<int>(ops.size()), ctx_.stream());
  for (int64_t k = 0; k < K; ++k) {
    const int64_t m = k % M, r0 = begin(m), n = count(m);
    model_->step(rows, r0, n, /*exchange=*/false);
    ops.clear();
    if (!last) {
      // The input buffer receives the next item meanwhile.
      ops.push_back(P2pOp{true, output, static_cast<int64_t>(n * row_bytes), stage + 1});
      if (stage + 1 != last_rank) add_state(&ops, true, m, stage + 1);
    } else {
      keep_hidden(r0, n);
      select_tokens(r0, n);
      if (k + M < K) add_state(&ops, true, m, 0);  // the first stage's item k + M
    }
    if (k + 1 < K) add_input(&ops, k + 1);
    pp->send_recv(ops.data(), static_cast<int>(ops.size()), ctx_.stream());
  }
  share_state();
}

// Pipeline parallelism: the last stage chose the tokens; every stage needs the new state
// (next_tok, cur_pos, attn_len, finished are contiguous). In beam search the stages' next step
// reads the beams' tokens, positions, lengths and cache indirection instead (every beam of an
// entry may have a new parent), and the all-finished poll reads the entries' done flags. The
// broadcasts form one group, one NCCL launch per step instead of up to six (nothing between them
// waits for one). Eager only: decode_step does not capture steps with pipeline parallelism.
void Session::share_state() {
  State& s = s_;
  GroupScope group(model_->pipeline_group());
  broadcast_from_last_stage(s.next_tok, 4 * s.rows * sizeof(int32_t));
  if (s.beam > 1) {
    const kernels::BeamSearchState& bs = s.beam_state;
    broadcast_from_last_stage(bs.tokens, s.rows * sizeof(int32_t));
    broadcast_from_last_stage(bs.cur_pos, s.rows * sizeof(int32_t));
    broadcast_from_last_stage(bs.attn_len, s.rows * sizeof(int32_t));
    broadcast_from_last_stage(bs.cache_indir, s.rows * s.kv_capacity * sizeof(int32_t));
    broadcast_from_last_stage(bs.done, s.batch * sizeof(int32_t));
  }
  group.end();
}

void Session::broadcast_from_last_stage(void* data, int64_t bytes) {
  Communicator* pp = model_->pipeline_group();
  if (pp == nullptr || pp->size() == 1 || bytes == 0) return;
  pp->broadcast(data, bytes, model_->pipeline_stages() - 1, ctx_.stream());
}

}  // namespace generation
}  // namespace warpformer
