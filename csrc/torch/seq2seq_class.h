// torch.classes.warpformer.Seq2SeqModel: the TorchScript custom class that owns an
// encoder-decoder instance (csrc/models/t5: T5, T5 v1.1 / Flan-T5, mT5, UL2, BART, mBART) on one
// GPU. Weights arrive as a Dict[str, Tensor] keyed by FT's file names without the rank suffix (as
// warpformer.t5_weights.load_t5_weights returns them), checked by name against the engine's table
// (csrc/models/t5/t5_weights.h). Generation takes GptModel.decode's options and runs on the same
// generation session: the encoder runs once per call, then the decoder generates from
// decoder_start_token_id.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "csrc/generation/session.h"
#include "csrc/models/t5/t5_model.h"
#include "csrc/torch/generation_call.h"
#include "csrc/torch/model_options.h"
#include "csrc/torch/nccl_class.h"

namespace warpformer {

class Seq2SeqModelHolder : public torch::CustomClassHolder {
 public:
  // config: T5Config JSON (warpformer.t5_config.T5Config.to_json()); options: ModelOptions JSON
  // (max_batch; max_seq_len bounds the encoder input width and 1 + output_len; dtype, "" for the
  // weights'; tensor_para_rank; the tuning file; cuda_graphs).
  Seq2SeqModelHolder(const std::string& config, c10::Dict<std::string, at::Tensor> weights,
                     const std::string& options);

  // The encoder output [B, S, d_model] (model dtype) of input_ids int32 [B, S] (right-padded; CPU
  // or the model's GPU) with input_lengths [B]; zero past each row's length.
  at::Tensor encode(const at::Tensor& input_ids, const at::Tensor& input_lengths);

  // Generation from the encoder inputs with the options of docs/GENERATION_API.md (those of an
  // interactive session, prompt tables, memory_len and context embeddings are refused): returns
  // output_ids [B, beam, 1 + output_len] (decoder_start_token_id, then the generated tokens, end
  // ids past a row's end), sequence_lengths [B, beam] (counting the start token) and, when asked,
  // cum_log_probs, output_log_probs and hidden_states.
  c10::Dict<std::string, at::Tensor> decode(const at::Tensor& input_ids,
                                            const at::Tensor& input_lengths, int64_t output_len,
                                            const c10::Dict<std::string, at::Tensor>& options);
  void decode_start(const at::Tensor& input_ids, const at::Tensor& input_lengths,
                    int64_t output_len, const c10::Dict<std::string, at::Tensor>& options);
  at::Tensor decode_step(int64_t max_steps);
  c10::Dict<std::string, at::Tensor> decode_finish();

  void attach_tensor_parallel(const c10::intrusive_ptr<NcclCommHolder>& comm);

  std::string config() const { return config_json_; }
  std::string options() const { return options_.to_json(); }
  int64_t tensor_para_size() const { return model_->config().tensor_para_size; }
  std::string dtype() const { return dtype_name(model_->dtype()); }
  int64_t max_batch() const { return model_->max_batch(); }
  int64_t max_seq_len() const { return model_->max_seq_len(); }
  int64_t vocab_size() const { return model_->config().vocab_size; }
  int64_t device() const { return device_; }
  // The cuBLASLt shapes planned so far (Gemm::plan_shapes, as GptModel's: what `warpformer
  // gemm-tune` tunes) and those whose algorithm came from the tuning file.
  std::vector<std::string> gemm_plan_shapes() const {
    const std::lock_guard<std::recursive_mutex> lock(call_mu_);
    return model_->gemm().plan_shapes();
  }
  int64_t gemm_tuned_shapes() const { return static_cast<int64_t>(model_->gemm().tuned_shapes()); }
  // Bytes held for the caches, activations and the session state (grow-only).
  int64_t memory_bytes() const {
    const std::lock_guard<std::recursive_mutex> lock(call_mu_);
    return static_cast<int64_t>(model_->cache_bytes() + model_->workspace_bytes() +
                                generation_->state_bytes());
  }

  using State = std::tuple<std::string, c10::Dict<std::string, at::Tensor>, std::string>;
  State get_state() const { return State{config_json_, given_, options_.to_json()}; }

 private:
  PromptInput check_inputs(const char* op, const at::Tensor& input_ids,
                           const at::Tensor& input_lengths) const;
  void check_parallel_ready(const char* op) const;
  // Runs the encoder on the model's stream (input ids uploaded when on the CPU); returns its
  // output [B, S, d_model] when `keep` (else possibly undefined). fp16: refuses an output that
  // overflowed.
  at::Tensor run_encoder(const char* op, const PromptInput& p, const at::Tensor& input_ids,
                         bool keep);
  // The running decode call's step / finish (generation_call.h).
  CallDriver driver();

  std::string config_json_;
  c10::Dict<std::string, at::Tensor> given_;  // as passed in, for pickling
  ModelOptions options_;
  int64_t device_ = 0;
  std::unordered_map<std::string, at::Tensor> owned_;  // converted weights + derived tensors
  c10::intrusive_ptr<NcclCommHolder> tp_comm_;
  GenerationCall call_;
  std::unique_ptr<t5::T5Model> model_;
  std::unique_ptr<generation::Session> generation_;  // drives model_ (declared after it)
  mutable std::recursive_mutex call_mu_;             // one call at a time (see GptModelHolder)
};

}  // namespace warpformer
