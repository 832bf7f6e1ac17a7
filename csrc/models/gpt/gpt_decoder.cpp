// GptModel as a generation::Decoder (the session's view of it), and its captured prompt passes.
#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

#include "csrc/core/check.h"
#include "csrc/models/gpt/gpt_model.h"
#include "kernels/gather.h"
#include "kernels/gemv.h"

namespace warpformer {
namespace gpt {

int64_t GptModel::reserve(int64_t rows, int64_t total, const std::vector<int32_t>& lengths) {
  ensure_kv(rows, total);
  ensure_activations(std::max(plan_prefill(lengths), rows), rows);
  return kv_seq_;
}

size_t GptModel::step_workspace_bytes(int64_t rows) const {
  return layers::self_attention_workspace_bytes(spec_, rows, kv_seq_);
}

// Each group's last-token hidden states are kept (in proj, [batch, h]) for prompt_logits. The
// hidden_out rows are scattered here, after the group's pass (a prompt graph runs the layers
// only), by the packed tokens' places in [batch, seq] as forward scatters its logits.
void GptModel::prefill(const int32_t* ids, const std::vector<int32_t>& lengths,
                       const std::vector<int32_t>& past, int64_t seq, int64_t slot_stride,
                       void* hidden_out) {
  const size_t row_bytes = hidden_row_bytes();
  run_prefill(ids, lengths, past, seq, slot_stride, [&](const PrefillGroup& g) {
    WF_CUDA_CHECK(kernels::launch_gather_rows(static_cast<char*>(scratch().proj) + g.b0 * row_bytes,
                                              buffers().n, d_last_ + g.b0, g.b1 - g.b0, row_bytes,
                                              ctx_->stream()));
    if (hidden_out != nullptr) {
      WF_CUDA_CHECK(kernels::launch_scatter_rows(hidden_out, buffers().n, d_gather_ + g.t0,
                                                 g.tokens(), row_bytes, ctx_->stream()));
    }
  });
}

void GptModel::prompt_logits(const int32_t* entry_of_row, int64_t rows) {
  const Scratch sc = scratch();
  WF_CUDA_CHECK(kernels::launch_gather_rows(sc.last_rows, sc.proj, entry_of_row, rows,
                                            hidden_row_bytes(), ctx_->stream()));
  lm_head(sc.last_rows, rows, sc.last_logits);
  final_hidden_ = sc.last_rows;  // lm_head reads it and writes elsewhere
}

// Each row's newest token at its position, in its own KV slot, beams reading the prompt through
// the cache indirection.
void GptModel::step(const generation::StepRows& in, int64_t r0, int64_t n, bool exchange) {
  layers::AttentionInputs ai{};
  ai.num_slots = static_cast<int>(view_slots());
  ai.max_seq = static_cast<int>(kv_seq_);
  ai.token_slot = in.slots + r0;
  ai.token_pos = in.positions + r0;
  ai.alibi_slopes = alibi_.as<float>();
  ai.decode = true;
  ai.row_slot = in.slots + r0;
  ai.lengths = in.lengths + r0;
  ai.cache_indir = in.cache_indir != nullptr ? in.cache_indir + r0 * kv_seq_ : nullptr;
  // token_slot = row_slot, token_pos = lengths - 1 and cache_indir[r, pos] = r hold here, as the
  // fused QKV preparation requires. It pays while the attention's (row, head) blocks fit in one
  // wave (two per SM): then it saves a kernel; with more blocks every one repeats the rotary
  // table and the separate kernel is cheaper (benchmarks/HISTORY.md, "Fused QKV preparation").
  ai.fused_prep = n * spec_.heads <= 2 * int64_t{ctx_->props().multiProcessorCount};
  ai.rotary_inv_freq = rotary_inv_freq_.as<float>();
  ai.workspace = in.workspace;
  ai.workspace_bytes = in.workspace_bytes;
  if (cfg_.first_stage()) {
    embed(in.tokens + r0, in.positions + r0, n, 1);
  } else if (exchange) {
    stage_recv(n);
  }
  run_layers(n, ai);
  if (cfg_.last_stage()) {
    lm_head(
        buffers().n, n,
        static_cast<char*>(scratch().last_logits) + r0 * cfg_.vocab_padded() * dtype_size(dtype_));
    final_hidden_ = buffers().n;  // lm_head reads it and writes elsewhere
  } else if (exchange) {
    stage_send(n);
  }
}

int64_t GptModel::prompt_graph_tokens(int64_t tokens) const {
  // One GPU only: tensor-parallel ranks would have to capture and replay their collectives
  // together, and pipeline stages exchange each group with send/recv ordered by the host. Up to
  // kGemvMaxRows tokens the products run on the GEMV path, which padding would change.
  if (!options_.cuda_graphs || cfg_.tensor_para_size != 1 || cfg_.pipeline_para_size != 1 ||
      tokens <= kernels::kGemvMaxRows || prompt_table_.count > 0) {
    return 0;
  }
  const int64_t step = tokens <= 128 ? 16 : 64;
  return (tokens + step - 1) / step * step;
}

void GptModel::run_prompt(int64_t tokens, int64_t seq, const layers::AttentionInputs& ai) {
  PromptKey key;
  key.tokens = tokens;
  key.batch = ai.batch;
  key.max_seqlen = ai.max_seqlen;
  key.view = slot_base();
  key.meta = meta_.data();
  key.generation = buffer_generation();
  auto& g = prompt_graphs_.find_or_add(key);
  const bool replayed = prompt_graphs_.run(
      g, ctx_->stream(), [&] { prompt_body(0, tokens, seq, ai); }, g.eager_runs > 0, "prompt pass");
  if (replayed) ++prompt_replays_;
}

}  // namespace gpt
}  // namespace warpformer
