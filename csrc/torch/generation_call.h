// What every model class's decode call shares, whatever the model (GptModel, Seq2SeqModel): the
// prompt's host-side checks, the options (parsed by generation_options.h) sent to the device
// with the output tensors the session writes, and the tokens and outputs returned.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "csrc/core/dispatch.h"
#include "csrc/generation/decoder.h"
#include "csrc/generation/session.h"

namespace warpformer {

// A call's prompt, validated on the host: lengths in [1, S], the ids of valid positions inside
// the vocabulary (or a prompt table's rows), batch and S + extra_len within the limits.
struct PromptInput {
  at::Tensor host_ids;           // int32 [B, S], CPU, contiguous
  std::vector<int32_t> lengths;  // B entries
};

struct PromptLimits {
  int64_t max_batch = 0, max_seq_len = 0, vocab = 0;
  int64_t device = 0;      // the model's GPU
  int64_t table_rows = 0;  // ids vocab .. vocab + table_rows - 1 name prompt-table rows
};

// input_ids int32 [B, S] on the CPU or on the model's GPU (then copied to the host once),
// input_lengths int32 [B] on any device; throws naming `op`, the argument and the rule.
PromptInput check_prompt(const char* op, const at::Tensor& input_ids,
                         const at::Tensor& input_lengths, int64_t extra_len,
                         const PromptLimits& limits);

// int32 [B, beam, total] on the CPU: each row's prompt, then end_ids[b] (also over the row's
// padding): the output_ids a session starts from.
at::Tensor prompt_then_end_ids(const PromptInput& p, const int32_t* end_ids, int64_t beam,
                               int64_t total);

// The device arrays of a running decode call (the session reads and writes them) and what the
// model class keeps about it.
struct GenerationCall {
  int64_t batch = 0, beam = 1, seq = 0, output_len = 0, cum_mode = 0;
  int64_t held = 0;    // GptModel: the interactive session it runs in, or 0
  int64_t window = 0;  // GptModel: memory_len
  bool return_log_probs = false;
  at::Tensor end_ids, top_k, top_p, temperature, rep, pres, freq, min_len, seeds, bad, stop;
  at::Tensor ids;  // the prompt on the device
  at::Tensor input_lengths, output_ids, seq_lengths, cum_log_probs, output_log_probs;
  at::Tensor context_log_probs;
  at::Tensor context_embeddings, hidden_states;  // [B, S, H] and [B, beam, L, H] when asked
  at::Tensor prompt_table;  // GptModel: on the device, in the model dtype, while the call runs
  generation::DecodeOptions opt;
  generation::DecodeOutputs out;
};

// Fills `s` for a call of `output_len` tokens after prompt `p` (input_ids as given: used in place
// when on the GPU) from the parsed options `g`: every per-row option array, the outputs the
// session starts from and the ids in one host->device copy, the optional outputs (hidden states
// of width `hidden` in `dtype`), and s.opt / s.out pointing at them.
void prepare_call(const c10::Dict<std::string, at::Tensor>& g, const PromptInput& p,
                  const at::Tensor& input_ids, int64_t output_len, int64_t hidden, DType dtype,
                  int64_t device, GenerationCall* s);

// The tokens that decode_step returns for the `n` steps after `before` steps: int32 [B, 1, n]
// (beam search: -1s, its tokens being final only at the end).
at::Tensor step_tokens(const GenerationCall& s, int64_t before, int64_t n);

// decode_finish's dict: output_ids, sequence_lengths and the optional outputs asked for.
c10::Dict<std::string, at::Tensor> call_outputs(const GenerationCall& s);

// The running call of a model class: `session` drives `model` on GPU `device`; `ended(call, ok)`
// runs when a call ends (ok = false after an error, which aborts the session first) and resets
// the class's own state of it. `op` names the class in errors ("GptModel").
struct CallDriver {
  generation::Session* session;
  generation::Decoder* model;
  int64_t device;
  const char* op;
  GenerationCall* call;
  std::function<void(const GenerationCall&, bool)> ended;

  // decode_step's steps on PyTorch's current stream: the number run.
  int64_t run_steps(int64_t max_steps) const;
  // run_steps, then the tokens they produced (step_tokens).
  at::Tensor step(int64_t max_steps) const;
  // decode_finish: the session's final outputs (call_outputs), the call ended.
  c10::Dict<std::string, at::Tensor> finish() const;
};

}  // namespace warpformer
