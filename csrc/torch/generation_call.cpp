#include "csrc/torch/generation_call.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <string>

#include "csrc/torch/tensor_utils.h"

namespace warpformer {
namespace {

// Whether `pred` holds for any value of a contiguous CPU per-row tensor (a host loop: a tensor
// reduction and item() cost more than the loop at these sizes).
template <typename T>
bool any_row(const at::Tensor& t, bool (*pred)(T)) {
  const T* p = t.data_ptr<T>();
  return std::any_of(p, p + t.numel(), pred);
}

// Rows of a [batch, ...] tensor repeated for each beam: [batch * beam, ...].
at::Tensor per_beam(const at::Tensor& t, int64_t beam) {
  return beam == 1 ? t : t.repeat_interleave(beam, 0).contiguous();
}

}  // namespace

PromptInput check_prompt(const char* op, const at::Tensor& input_ids,
                         const at::Tensor& input_lengths, int64_t extra_len,
                         const PromptLimits& limits) {
  check_dtype(input_ids, at::kInt, op, "input_ids");
  check_dim(input_ids, 2, op, "input_ids");
  check_dtype(input_lengths, at::kInt, op, "input_lengths");
  check_dim(input_lengths, 1, op, "input_lengths");
  const int64_t batch = input_ids.size(0), seq = input_ids.size(1);
  TORCH_CHECK(batch >= 1, op, ": input_ids must hold at least one sequence, got shape ",
              input_ids.sizes());
  TORCH_CHECK(seq >= 1, op, ": input_ids must have at least one column, got shape ",
              input_ids.sizes());
  TORCH_CHECK(input_lengths.size(0) == batch, op, ": input_lengths must have ", batch,
              " entries (one per row of input_ids), got ", input_lengths.size(0));
  TORCH_CHECK(batch <= limits.max_batch, op, ": batch size ", batch, " exceeds max_batch (",
              limits.max_batch, ") of this model instance");
  TORCH_CHECK(seq + extra_len <= limits.max_seq_len, op, ": input length ", seq,
              extra_len ? " + output_len " : "", extra_len ? std::to_string(extra_len) : "",
              " exceeds max_seq_len (", limits.max_seq_len, ") of this model instance");
  TORCH_CHECK(input_ids.is_cpu() || input_ids.is_cuda(), op,
              ": input_ids must be on the CPU or on the model's GPU (cuda:", limits.device,
              "), got ", input_ids.device());
  TORCH_CHECK(input_ids.is_cpu() || input_ids.device().index() == limits.device, op,
              ": input_ids is on ", input_ids.device(),
              " but the model is on cuda:", limits.device);
  // The checks run on the host: a device->host copy of each input that is on the GPU, instead
  // of a dozen small kernels and a synchronisation per check.
  PromptInput p;
  p.host_ids = input_ids.to(at::kCPU).contiguous();
  const at::Tensor lens = input_lengths.to(at::kCPU).contiguous();
  const int32_t* lp = lens.data_ptr<int32_t>();
  p.lengths.assign(lp, lp + batch);
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(p.lengths[b] >= 1 && p.lengths[b] <= seq, op, ": input_lengths[", b,
                "] = ", p.lengths[b], " must be in [1, ", seq, "] (input_ids has ", seq,
                " columns)");
  }
  // Token ids of the valid positions must be in the vocabulary (padding is not looked at).
  const int64_t vocab = limits.vocab, table_rows = limits.table_rows;
  const int32_t* ids = p.host_ids.data_ptr<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < p.lengths[b]; ++i) {
      const int32_t v = ids[b * seq + i];
      TORCH_CHECK(v >= 0 && v < vocab + table_rows, op, ": input_ids[", b, ", ", i, "] = ", v,
                  " is outside the vocabulary [0, ", vocab, ")",
                  table_rows > 0 ? c10::str(" and the prompt table's ids [", vocab, ", ",
                                            vocab + table_rows, ")")
                                 : std::string());
    }
  }
  return p;
}

at::Tensor prompt_then_end_ids(const PromptInput& p, const int32_t* end_ids, int64_t beam,
                               int64_t total) {
  const int64_t batch = p.host_ids.size(0), seq = p.host_ids.size(1);
  at::Tensor out = at::empty({batch, beam, total}, at::TensorOptions().dtype(at::kInt));
  int32_t* o = out.data_ptr<int32_t>();
  const int32_t* ids = p.host_ids.data_ptr<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    int32_t* row = o + b * beam * total;
    std::copy(ids + b * seq, ids + b * seq + p.lengths[b], row);
    std::fill(row + p.lengths[b], row + total, end_ids[b]);
    for (int64_t k = 1; k < beam; ++k) std::copy(row, row + total, row + k * total);
  }
  return out;
}

void prepare_call(const c10::Dict<std::string, at::Tensor>& g, const PromptInput& p,
                  const at::Tensor& input_ids, int64_t output_len, int64_t hidden, DType dtype,
                  int64_t device, GenerationCall* call) {
  GenerationCall& s = *call;
  const int64_t batch = p.host_ids.size(0);
  const int64_t beam = g.at("beam_width").item<int64_t>();
  const at::Tensor bad = g.contains("bad_words") ? g.at("bad_words") : at::Tensor();
  const at::Tensor stop = g.contains("stop_words") ? g.at("stop_words") : at::Tensor();
  s.batch = batch;
  s.beam = beam;
  s.seq = p.host_ids.size(1);
  s.output_len = output_len;
  s.return_log_probs = g.at("return_log_probs").item<int64_t>() != 0;
  s.cum_mode = g.at("return_cum_log_probs").item<int64_t>();
  const bool all_greedy = !any_row<int32_t>(g.at("top_k"), [](int32_t k) { return k != 1; });
  const bool penalties =
      any_row<float>(g.at("repetition_penalty"), [](float r) { return r != 1.f; }) ||
      any_row<float>(g.at("presence_penalty"), [](float p) { return p != 0.f; }) ||
      any_row<float>(g.at("frequency_penalty"), [](float f) { return f != 0.f; });
  const bool process = penalties ||
                       any_row<int32_t>(g.at("min_length"), [](int32_t m) { return m != 0; }) ||
                       bad.defined() || stop.defined();

  const auto dev = at::TensorOptions().device(at::kCUDA, device);
  // Every per-row array the loop reads, the outputs it starts from (the prompt then end ids per
  // beam; the prompt lengths) and, for CPU inputs, the ids: one host->device copy.
  const int64_t total = s.seq + output_len;
  const at::Tensor lengths =
      at::from_blob(const_cast<int32_t*>(p.lengths.data()), {batch}, at::kInt);
  enum Slot {
    kEnd,
    kTopK,
    kTopP,
    kTemp,
    kRep,
    kPres,
    kFreq,
    kMinLen,
    kSeeds,
    kBad,
    kStop,
    kLengths,
    kOutput,
    kSeqLengths,
    kIds
  };
  std::vector<at::Tensor> host;  // in Slot's order
  for (const char* key : {"end_id", "top_k", "top_p", "temperature", "repetition_penalty",
                          "presence_penalty", "frequency_penalty", "min_length", "seed"}) {
    host.push_back(per_beam(g.at(key), beam));
  }
  for (const at::Tensor& words : {bad, stop}) {  // shared [2, L] as given, [batch, 2, L] per beam
    host.push_back(words.defined() && words.dim() == 3 ? per_beam(words, beam) : words);
  }
  host.insert(host.end(),
              {lengths, prompt_then_end_ids(p, g.at("end_id").data_ptr<int32_t>(), beam, total),
               per_beam(lengths, beam).view({batch, beam}),
               input_ids.is_cuda() ? at::Tensor() : p.host_ids});
  const std::vector<at::Tensor> up = upload_together(host, device);
  s.end_ids = up[kEnd];
  s.top_k = up[kTopK];
  s.top_p = up[kTopP];
  s.temperature = up[kTemp];
  s.rep = up[kRep];
  s.pres = up[kPres];
  s.freq = up[kFreq];
  s.min_len = up[kMinLen];
  s.seeds = up[kSeeds];
  s.bad = up[kBad];
  s.stop = up[kStop];
  s.output_ids = up[kOutput];
  s.seq_lengths = up[kSeqLengths];
  s.input_lengths = up[kLengths];
  s.ids = input_ids.is_cuda() ? input_ids.contiguous() : up[kIds];
  const auto f32 = dev.dtype(at::kFloat);
  if (s.cum_mode > 0 || beam > 1) s.cum_log_probs = at::zeros({batch, beam}, f32);
  if (s.return_log_probs) s.output_log_probs = at::zeros({batch, beam, output_len}, f32);
  // Final hidden states in the model dtype, zero where nothing is written (past a row's end).
  const auto model_dtype = dev.dtype(to_scalar_type(dtype));
  if (g.at("return_context_embeddings").item<int64_t>() != 0) {
    s.context_embeddings = at::zeros({batch, s.seq, hidden}, model_dtype);
  }
  if (g.at("return_hidden_states").item<int64_t>() != 0) {
    s.hidden_states = at::zeros({batch, beam, output_len, hidden}, model_dtype);
  }

  generation::DecodeOptions& opt = s.opt;
  opt = generation::DecodeOptions{};
  opt.beam_width = static_cast<int>(beam);
  opt.end_ids = s.end_ids.data_ptr<int32_t>();
  opt.top_k = s.top_k.data_ptr<int32_t>();
  opt.top_p = s.top_p.data_ptr<float>();
  opt.temperature = s.temperature.data_ptr<float>();
  opt.repetition_penalty = s.rep.data_ptr<float>();
  opt.presence_penalty = s.pres.data_ptr<float>();
  opt.frequency_penalty = s.freq.data_ptr<float>();
  opt.min_length = s.min_len.data_ptr<int32_t>();
  opt.seeds = reinterpret_cast<const uint64_t*>(s.seeds.data_ptr<int64_t>());
  if (s.bad.defined()) {
    opt.bad_words = s.bad.data_ptr<int32_t>();
    opt.bad_words_row_stride = s.bad.dim() == 3 ? 2 * s.bad.size(2) : 0;
    opt.bad_words_len = static_cast<int>(s.bad.size(-1));
  }
  if (s.stop.defined()) {
    opt.stop_words = s.stop.data_ptr<int32_t>();
    opt.stop_words_row_stride = s.stop.dim() == 3 ? 2 * s.stop.size(2) : 0;
    opt.stop_words_len = static_cast<int>(s.stop.size(-1));
  }
  opt.greedy = beam == 1 && all_greedy && !process && !s.return_log_probs && s.cum_mode == 0;
  opt.needs_counts = penalties;
  opt.length_penalty = g.at("length_penalty").item<float>();
  opt.diversity_rate = g.at("diversity_rate").item<float>();
  generation::DecodeOutputs& o = s.out;
  o = generation::DecodeOutputs{};
  o.output_ids = s.output_ids.data_ptr<int32_t>();
  o.sequence_lengths = s.seq_lengths.data_ptr<int32_t>();
  o.cum_log_probs = s.cum_log_probs.defined() ? s.cum_log_probs.data_ptr<float>() : nullptr;
  o.output_log_probs =
      s.output_log_probs.defined() ? s.output_log_probs.data_ptr<float>() : nullptr;
  o.context_embeddings = s.context_embeddings.defined() ? s.context_embeddings.data_ptr() : nullptr;
  o.hidden_states = s.hidden_states.defined() ? s.hidden_states.data_ptr() : nullptr;
}

at::Tensor step_tokens(const GenerationCall& s, int64_t before, int64_t n) {
  if (n == 0 || s.beam > 1) {
    // Beam search reorders beams until the end: its tokens are final only after decode_finish,
    // so its steps return -1 placeholders.
    return at::full({s.batch, s.beam, n}, -1, s.output_ids.options());
  }
  const int64_t total = s.seq + s.output_len;
  const at::Tensor pos = (s.input_lengths.unsqueeze(1) + before +
                          at::arange(n, s.input_lengths.options()).unsqueeze(0))
                             .clamp_max(total - 1)
                             .to(at::kLong);
  return s.output_ids.select(1, 0).gather(1, pos).unsqueeze(1);
}

c10::Dict<std::string, at::Tensor> call_outputs(const GenerationCall& s) {
  c10::Dict<std::string, at::Tensor> out;
  out.insert("output_ids", s.output_ids);
  out.insert("sequence_lengths", s.seq_lengths);
  if (s.cum_log_probs.defined()) {
    if (s.context_log_probs.defined()) s.cum_log_probs.add_(s.context_log_probs.unsqueeze(1));
    out.insert("cum_log_probs", s.cum_log_probs);
  }
  if (s.output_log_probs.defined()) out.insert("output_log_probs", s.output_log_probs);
  if (s.context_embeddings.defined()) out.insert("context_embeddings", s.context_embeddings);
  if (s.hidden_states.defined()) out.insert("hidden_states", s.hidden_states);
  return out;
}

int64_t CallDriver::run_steps(int64_t max_steps) const {
  TORCH_CHECK(session->active(), op,
              ".decode_step: no generation session (call decode_start first)");
  TORCH_CHECK(max_steps >= 1, op, ".decode_step: max_steps must be >= 1, got ", max_steps);
  const c10::cuda::CUDAGuard guard(device);
  model->context().set_stream(c10::cuda::getCurrentCUDAStream(device).stream());
  try {
    return session->step(max_steps);
  } catch (...) {
    session->abort();
    const GenerationCall failed = std::move(*call);
    *call = GenerationCall{};
    ended(failed, /*ok=*/false);
    throw;
  }
}

at::Tensor CallDriver::step(int64_t max_steps) const {
  const int64_t before = session->active() ? session->tokens_done() : 0;
  const int64_t n = run_steps(max_steps);
  const c10::cuda::CUDAGuard guard(device);
  return step_tokens(*call, before, n);
}

c10::Dict<std::string, at::Tensor> CallDriver::finish() const {
  TORCH_CHECK(session->active(), op,
              ".decode_finish: no generation session (call decode_start first)");
  const c10::cuda::CUDAGuard guard(device);
  model->context().set_stream(c10::cuda::getCurrentCUDAStream(device).stream());
  const GenerationCall done = std::move(*call);
  *call = GenerationCall{};
  try {
    session->finish();
  } catch (...) {
    session->abort();
    ended(done, /*ok=*/false);
    throw;
  }
  ended(done, /*ok=*/true);
  return call_outputs(done);
}

}  // namespace warpformer
