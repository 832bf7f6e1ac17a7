// torch.classes.warpformer.GptModel: the TorchScript custom class that owns a GPT-family model
// instance (csrc/models/gpt) on one GPU. Weights arrive as a Dict[str, Tensor] keyed by the
// on-disk names (docs/FORMAT.md, without the "model." prefix and the rank suffix, as
// warpformer.weights.load_weights returns them); every one is checked by name.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "csrc/generation/session.h"
#include "csrc/models/gpt/gpt_model.h"
#include "csrc/torch/generation_call.h"
#include "csrc/torch/model_options.h"
#include "csrc/torch/nccl_class.h"

namespace warpformer {

class GptModelHolder : public torch::CustomClassHolder {
 public:
  // config: GptConfig JSON (warpformer.config.GptConfig.to_json()); options: ModelOptions JSON
  // (warpformer.options.EngineOptions.to_json(): the limits max_batch and max_seq_len that bound
  // every call, input length + output length <= max_seq_len; dtype, "" for the dtype of `wte`,
  // other floating weights being converted; this rank's place; the tuning file; cuda_graphs,
  // prefill_tokens).
  GptModelHolder(const std::string& config, c10::Dict<std::string, at::Tensor> weights,
                 const std::string& options);

  // input_ids int32 [B, S] (right-padded; on the model's GPU or on the CPU, which saves the
  // device->host copy of the checks), input_lengths int32 [B] (any device) -> logits [B, S, V] of
  // the model dtype; positions past a row's length are zero. The same inputs for generate and
  // decode.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& input_lengths);

  // Greedy generation of output_len tokens -> (output_ids int32 [B, 1, S + output_len],
  // sequence_lengths int32 [B, 1]). Generated tokens start at each row's input length; slots
  // past a row's sequence length hold end_id. end_id < 0 takes the config's.
  std::tuple<at::Tensor, at::Tensor> generate(const at::Tensor& input_ids,
                                              const at::Tensor& input_lengths, int64_t output_len,
                                              int64_t end_id);

  // Generation with the options of docs/GENERATION_API.md; returns output_ids [B, beam, S + L],
  // sequence_lengths [B, beam] and, when asked, cum_log_probs [B, beam], output_log_probs
  // [B, beam, L], context_embeddings [B, S, H] and hidden_states [B, 1, L, H].
  c10::Dict<std::string, at::Tensor> decode(const at::Tensor& input_ids,
                                            const at::Tensor& input_lengths, int64_t output_len,
                                            const c10::Dict<std::string, at::Tensor>& options);
  void decode_start(const at::Tensor& input_ids, const at::Tensor& input_lengths,
                    int64_t output_len, const c10::Dict<std::string, at::Tensor>& options);
  // Interactive sessions: `batch` rows whose KV caches stay on the GPU between calls, in slots
  // of the instance's cache that no other call or session uses, for prompts + outputs of up to
  // max_len tokens. A decode call with the option "session" (the returned handle) runs in them:
  // row b continues from the longest prefix of its input ids that the session's row b holds (the
  // tokens of its earlier calls, outputs included but for the last one; none after a call with
  // another memory_len) and runs the prompt pass over the rest only. Its results are those of
  // the same call without the session (in fp16/bf16 up to rounding: cached outputs' K/V came
  // from decode steps, not a prompt pass). Beam width 1; no session closes while a call runs.
  int64_t open_session(int64_t batch, int64_t max_len);
  void close_session(int64_t handle);
  // Runs up to max_steps steps; returns their tokens int32 [B, beam, k] (k = steps run; beam
  // search returns -1s: its tokens are final only after decode_finish).
  at::Tensor decode_step(int64_t max_steps);
  c10::Dict<std::string, at::Tensor> decode_finish();

  // The tensor-parallel group (warpformer.distributed creates it); needed before any call when
  // tensor_para_size > 1.
  void attach_tensor_parallel(const c10::intrusive_ptr<NcclCommHolder>& comm);
  void attach_pipeline_parallel(const c10::intrusive_ptr<NcclCommHolder>& comm);

  std::string config() const { return config_json_; }
  // The options as given (every key written out): with config() and the weights, what builds
  // another instance of this model (GPT.generate_batches' replicas) or restores a pickled one.
  std::string options() const { return options_.to_json(); }
  int64_t tensor_para_size() const { return model_->config().tensor_para_size; }
  int64_t pipeline_para_size() const { return options_.pipeline_para_size; }
  std::string dtype() const { return dtype_name(model_->dtype()); }
  int64_t max_batch() const { return model_->max_batch(); }
  int64_t max_seq_len() const { return model_->max_seq_len(); }
  int64_t vocab_size() const { return model_->config().vocab_size; }
  int64_t device() const { return device_; }
  // Shapes whose cuBLASLt algorithm comes from the GEMM tuning file (0: heuristics only).
  int64_t gemm_tuned_shapes() const { return static_cast<int64_t>(model_->gemm().tuned_shapes()); }
  // cuBLASLt plans made so far whose algorithm came from the tuning file (its own shape's entry,
  // or that of the rounded row count a prompt's shape borrows from; Gemm::tuned_plans).
  int64_t gemm_tuned_plans() const {
    const std::lock_guard<std::recursive_mutex> lock(call_mu_);
    return model_->gemm().tuned_plans();
  }
  // cuBLASLt plans cached now (at most Gemm::kMaxPlans; least recently used shapes are dropped).
  int64_t gemm_cached_plans() const {
    const std::lock_guard<std::recursive_mutex> lock(call_mu_);
    return static_cast<int64_t>(model_->gemm().cached_plans());
  }
  // The shapes of the cached plans (Gemm::plan_shapes): "float16 m n k transposed epilogue
  // accumulate" per shape the calls so far ran on cuBLASLt, for comparing with gemm-tune's list.
  std::vector<std::string> gemm_plan_shapes() const {
    const std::lock_guard<std::recursive_mutex> lock(call_mu_);
    return model_->gemm().plan_shapes();
  }
  // cuBLASLt heuristic queries made so far: one per new shape of up to Gemm::kExactRows rows,
  // one per rounded-up row count above (Gemm::heuristic_rows), and one per shape of a tuning
  // file or whose borrowed algorithm cuBLASLt refused.
  int64_t gemm_heuristic_queries() const {
    const std::lock_guard<std::recursive_mutex> lock(call_mu_);
    return model_->gemm().heuristic_queries();
  }
  // [prompt graphs held, prompt passes replayed from one so far] (GptModel::prompt_graph_stats).
  std::vector<int64_t> prompt_graph_stats() const {
    const std::lock_guard<std::recursive_mutex> lock(call_mu_);
    const auto s = model_->prompt_graph_stats();
    return {s.first, s.second};
  }
  // One line about the GEMM tuning file: shapes loaded, or why it was not used ("" without one).
  std::string gemm_tuning_note() const { return gemm_note_; }
  // Bytes held for the KV cache and the workspace, the cuBLASLt one included (grow-only; flat
  // across equal calls).
  int64_t memory_bytes() const {
    const std::lock_guard<std::recursive_mutex> lock(call_mu_);
    return static_cast<int64_t>(model_->kv_cache_bytes() + model_->workspace_bytes() +
                                generation_->state_bytes());
  }
  // Of which the cuBLASLt workspace: what the algorithms chosen so far need.
  int64_t gemm_workspace_bytes() const {
    const std::lock_guard<std::recursive_mutex> lock(call_mu_);
    return static_cast<int64_t>(model_->gemm_workspace_bytes());
  }

  using State = std::tuple<std::string, c10::Dict<std::string, at::Tensor>, std::string>;
  State get_state() const;

 private:
  using Prompt = PromptInput;
  // check_prompt with this instance's limits; table_rows: ids vocab .. vocab + table_rows - 1
  // are prompt-table rows (decode's prompt_table option).
  Prompt check_inputs(const char* op, const at::Tensor& input_ids, const at::Tensor& input_lengths,
                      int64_t extra_len, int64_t table_rows = 0) const;
  // The running decode call's step / finish (generation_call.h), ending it through end_call.
  CallDriver driver();

  std::string config_json_;
  c10::Dict<std::string, at::Tensor> given_;  // as passed in, for pickling
  ModelOptions options_;
  std::string gemm_note_;
  int64_t device_;
  std::unordered_map<std::string, at::Tensor> owned_;  // converted weights + derived tensors

  // forward with an attention window (decode's memory_len for its context log probs).
  at::Tensor forward_windowed(const at::Tensor& input_ids, const at::Tensor& input_lengths,
                              int64_t window, int64_t table_rows = 0);
  // The running decode call (device arrays the C++ loop reads and writes).
  using Session = GenerationCall;
  Session session_;
  // open_session's sessions: their slots and, per row, the ids whose K/V the slots hold.
  struct HeldSession {
    int64_t first_slot = 0, batch = 0, max_len = 0;
    int64_t window = 0;  // the memory_len the cached K/V were computed under
    std::vector<std::vector<int32_t>> cached;
  };
  std::map<int64_t, HeldSession> held_;
  int64_t next_handle_ = 1;
  // The rows a decode call in session `handle` takes from its cache (Session::start's `past`),
  // after checking the call against the session's shape.
  std::vector<int32_t> session_prefixes(int64_t handle, const Prompt& prompt, int64_t beam,
                                        int64_t output_len, int64_t window) const;
  // After a session call: records the rows' cached ids (or forgets them after an error) and
  // returns the model to the shared slots.
  void end_session_call(const Session& s, bool ok);
  // After any decode call (finished, or failed): drops the call's prompt table and ends its
  // session call.
  void end_call(const Session& s, bool ok);
  c10::intrusive_ptr<NcclCommHolder> tp_comm_;
  c10::intrusive_ptr<NcclCommHolder> pp_comm_;
  void check_parallel_ready(const char* op) const;
  // Attaches `comm` through `install` (a GptModel::set_*_parallel): refused during generation;
  // the step graphs that baked the group before are dropped.
  void attach(const c10::intrusive_ptr<NcclCommHolder>& comm,
              const std::function<void(Communicator*)>& install);
  std::unique_ptr<gpt::GptModel> model_;
  std::unique_ptr<generation::Session> generation_;  // drives model_ (declared after it)
  // One call at a time per instance: the model's buffers, plans and session are not safe to
  // touch from two host threads at once (TorchScript methods run without the GIL), so a call
  // from another thread waits for the running one. Recursive: decode() is decode_start,
  // decode_step and decode_finish under one hold; the getters of sizes and plan counts take it
  // too. Calls of different instances do not wait for each other.
  mutable std::recursive_mutex call_mu_;
};

}  // namespace warpformer
