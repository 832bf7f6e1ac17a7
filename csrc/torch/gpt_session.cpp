// GptModelHolder's generation methods: the options (parsed by generation_options.h) sent to the
// device, the output tensors, and the decode_start / decode_step / decode_finish session around
// csrc/generation/session.h.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <string>

#include "csrc/torch/generation_options.h"
#include "csrc/torch/gpt_class.h"
#include "csrc/torch/tensor_utils.h"

namespace warpformer {
namespace {

constexpr const char* kOp = "GptModel.decode";

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

void GptModelHolder::decode_start(const at::Tensor& input_ids, const at::Tensor& input_lengths,
                                  int64_t output_len,
                                  const c10::Dict<std::string, at::Tensor>& options) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  TORCH_CHECK(!generation_->active(), kOp,
              ": a generation session is running; call decode_finish() first");
  TORCH_CHECK(output_len >= 1, kOp, ": output_len must be >= 1, got ", output_len);
  check_parallel_ready(kOp);
  // Prompt embeddings: ids vocab + j embed as row j of the prompt_table option (its shape is
  // checked with the other options below).
  const int64_t table_rows =
      options.contains("prompt_table") && options.at("prompt_table").dim() == 2
          ? options.at("prompt_table").size(0)
          : 0;
  const Prompt prompt = check_inputs(kOp, input_ids, input_lengths, output_len, table_rows);
  const int64_t V = model_->vocab_size();
  const int64_t batch = input_ids.size(0);
  const c10::Dict<std::string, at::Tensor> g =
      ops::generation_options(options, batch, V, model_->config().end_id);
  const int64_t beam = g.at("beam_width").item<int64_t>();
  const int64_t memory_len = g.at("memory_len").item<int64_t>();
  const at::Tensor bad = g.contains("bad_words") ? g.at("bad_words") : at::Tensor();
  const at::Tensor stop = g.contains("stop_words") ? g.at("stop_words") : at::Tensor();
  const int64_t held = g.at("session").item<int64_t>();
  const std::vector<int32_t> past =
      held != 0 ? session_prefixes(held, prompt, beam, output_len, memory_len)
                : std::vector<int32_t>();

  Session s;
  s.held = held;
  s.window = memory_len;
  if (g.contains("prompt_table")) {
    const at::Tensor& t = g.at("prompt_table");
    const int64_t width = model_->config().embed_dim();
    TORCH_CHECK(t.size(1) == width, kOp,
                ": option 'prompt_table' rows must have the word "
                "embedding width ",
                width, ", got ", t.size(1));
    s.prompt_table =
        t.to(at::TensorOptions().device(at::kCUDA, device_).dtype(to_scalar_type(model_->dtype())))
            .contiguous();
  }
  s.batch = batch;
  s.beam = beam;
  s.seq = input_ids.size(1);
  s.output_len = output_len;
  s.return_log_probs = g.at("return_log_probs").item<int64_t>() != 0;
  s.cum_mode = g.at("return_cum_log_probs").item<int64_t>();
  auto f32 = at::kFloat;
  const bool all_greedy = !any_row<int32_t>(g.at("top_k"), [](int32_t k) { return k != 1; });
  const bool penalties =
      any_row<float>(g.at("repetition_penalty"), [](float r) { return r != 1.f; }) ||
      any_row<float>(g.at("presence_penalty"), [](float p) { return p != 0.f; }) ||
      any_row<float>(g.at("frequency_penalty"), [](float f) { return f != 0.f; });
  const bool process = penalties ||
                       any_row<int32_t>(g.at("min_length"), [](int32_t m) { return m != 0; }) ||
                       bad.defined() || stop.defined();

  const c10::cuda::CUDAGuard guard(device_);
  model_->context().set_stream(c10::cuda::getCurrentCUDAStream(device_).stream());
  const auto dev = at::TensorOptions().device(at::kCUDA, device_);
  // Every per-row array the loop reads, the outputs it starts from (the prompt then end ids per
  // beam; the prompt lengths) and, for CPU inputs, the ids: one host->device copy.
  const int64_t total = s.seq + output_len;
  const at::Tensor lengths =
      at::from_blob(const_cast<int32_t*>(prompt.lengths.data()), {batch}, at::kInt);
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
  host.insert(
      host.end(),
      {lengths, prompt_then_end_ids(prompt, g.at("end_id").data_ptr<int32_t>(), beam, total),
       per_beam(lengths, beam).view({batch, beam}),
       input_ids.is_cuda() ? at::Tensor() : prompt.host_ids});
  const std::vector<at::Tensor> up = upload_together(host, device_);
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
  const at::Tensor ids = input_ids.is_cuda() ? input_ids.contiguous() : up[kIds];
  if (s.cum_mode > 0 || beam > 1) s.cum_log_probs = at::zeros({batch, beam}, dev.dtype(f32));
  if (s.return_log_probs) s.output_log_probs = at::zeros({batch, beam, output_len}, dev.dtype(f32));
  // Final hidden states in the model dtype, zero where nothing is written (past a row's end).
  const auto model_dtype = dev.dtype(to_scalar_type(model_->dtype()));
  const int64_t hidden = model_->config().hidden();
  if (g.at("return_context_embeddings").item<int64_t>() != 0) {
    s.context_embeddings = at::zeros({batch, s.seq, hidden}, model_dtype);
  }
  if (g.at("return_hidden_states").item<int64_t>() != 0) {
    s.hidden_states = at::zeros({batch, beam, output_len, hidden}, model_dtype);
  }
  if (s.prompt_table.defined()) {  // dropped by end_call
    model_->set_prompt_table({s.prompt_table.data_ptr(), s.prompt_table.size(0)});
  }
  if (s.cum_mode == 2) {
    // Context log probs: log p(token_i | tokens_<i) of the prompt, i >= 1, summed per row (a
    // prompt-table position is not a token: it has none).
    try {
      const at::Tensor logits =
          forward_windowed(ids, s.input_lengths, memory_len, table_rows).to(f32);
      const at::Tensor lp = at::log_softmax(logits.narrow(1, 0, s.seq - 1), -1);
      const at::Tensor next_ids = ids.narrow(1, 1, s.seq - 1).to(at::kLong);
      const at::Tensor next = next_ids.clamp(0, V - 1);
      const at::Tensor tok = lp.gather(2, next.unsqueeze(2)).squeeze(2);
      const at::Tensor valid =
          (at::arange(1, s.seq, ids.options()).unsqueeze(0) < s.input_lengths.unsqueeze(1)) &
          (next_ids < V);
      s.context_log_probs = at::where(valid, tok, at::zeros_like(tok)).sum(1);
    } catch (...) {
      end_call(s, /*ok=*/false);
      throw;
    }
  }

  generation::DecodeOptions opt;
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
  generation::DecodeOutputs o;
  o.output_ids = s.output_ids.data_ptr<int32_t>();
  o.sequence_lengths = s.seq_lengths.data_ptr<int32_t>();
  o.cum_log_probs = s.cum_log_probs.defined() ? s.cum_log_probs.data_ptr<float>() : nullptr;
  o.output_log_probs =
      s.output_log_probs.defined() ? s.output_log_probs.data_ptr<float>() : nullptr;
  o.context_embeddings = s.context_embeddings.defined() ? s.context_embeddings.data_ptr() : nullptr;
  o.hidden_states = s.hidden_states.defined() ? s.hidden_states.data_ptr() : nullptr;
  // The session's prompt pass and steps attend through the call's window (forward and generate
  // set their own, and neither runs while the session does).
  model_->set_attention_window(memory_len);
  if (held != 0) model_->use_slots(held_.at(held).first_slot);
  try {
    generation_->start(ids.data_ptr<int32_t>(), prompt.lengths, s.seq, output_len, opt, o, past);
  } catch (...) {
    end_call(s, /*ok=*/false);
    throw;
  }
  session_ = std::move(s);
}

void GptModelHolder::end_call(const Session& s, bool ok) {
  model_->set_prompt_table({});
  if (s.held != 0) end_session_call(s, ok);
}

int64_t GptModelHolder::open_session(int64_t batch, int64_t max_len) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  const char* op = "GptModel.open_session";
  TORCH_CHECK(!generation_->active(), op,
              ": a generation session is running; call decode_finish() first");
  TORCH_CHECK(batch >= 1 && batch <= model_->max_batch(), op,
              ": batch must be in [1, max_batch = ", model_->max_batch(), "], got ", batch);
  TORCH_CHECK(max_len >= 2 && max_len <= model_->max_seq_len(), op,
              ": max_len must be in [2, max_seq_len = ", model_->max_seq_len(), "], got ", max_len);
  const c10::cuda::CUDAGuard guard(device_);
  model_->context().set_stream(c10::cuda::getCurrentCUDAStream(device_).stream());
  HeldSession h;
  h.first_slot = model_->hold_slots(batch, max_len);
  h.batch = batch;
  h.max_len = max_len;
  h.cached.resize(batch);
  const int64_t handle = next_handle_++;
  held_.emplace(handle, std::move(h));
  return handle;
}

void GptModelHolder::close_session(int64_t handle) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  const char* op = "GptModel.close_session";
  TORCH_CHECK(held_.count(handle) == 1, op, ": no open session ", handle);
  // Closing moves the shared slots down when it frees the highest held ones: no call may run.
  TORCH_CHECK(!generation_->active(), op,
              ": a generation session is running; call decode_finish() first");
  model_->release_slots(held_.at(handle).first_slot);
  held_.erase(handle);
}

std::vector<int32_t> GptModelHolder::session_prefixes(int64_t handle, const Prompt& prompt,
                                                      int64_t beam, int64_t output_len,
                                                      int64_t window) const {
  const auto it = held_.find(handle);
  TORCH_CHECK(it != held_.end(), kOp, ": option session = ", handle,
              " is not an open session of this instance (open_session)");
  const HeldSession& h = it->second;
  const auto batch = static_cast<int64_t>(prompt.lengths.size());
  TORCH_CHECK(beam == 1, kOp, ": a session generates with beam_width 1, got ", beam);
  TORCH_CHECK(batch == h.batch, kOp, ": session ", handle, " has ", h.batch,
              " rows; input_ids has ", batch);
  std::vector<int32_t> past(batch, 0);
  const int64_t seq = prompt.host_ids.size(1);
  // The call runs over positions up to the padded width + output_len in the session's slots.
  TORCH_CHECK(seq + output_len <= h.max_len, kOp, ": session ", handle, ": input_ids' width ", seq,
              " + output_len ", output_len, " = ", seq + output_len, " exceeds the session's ",
              "max_len (", h.max_len, ")");
  // K/V computed under another attention window differ past the first layer: none is reused.
  if (window != h.window) return past;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = prompt.lengths[b];
    TORCH_CHECK(len + output_len <= h.max_len, kOp, ": row ", b, " of session ", handle,
                ": input length ", len, " + output_len ", output_len, " = ", len + output_len,
                " exceeds the session's max_len (", h.max_len, ")");
    // The longest prefix the slot holds; the last prompt token always runs (its logits give the
    // first new token).
    const int32_t* ids = prompt.host_ids.data_ptr<int32_t>() + b * seq;
    const std::vector<int32_t>& c = h.cached[b];
    const int64_t most = std::min<int64_t>(static_cast<int64_t>(c.size()), len - 1);
    int64_t n = 0;
    while (n < most && c[n] == ids[n]) ++n;
    past[b] = static_cast<int32_t>(n);
  }
  return past;
}

void GptModelHolder::end_session_call(const Session& s, bool ok) {
  model_->use_slots(-1);
  const auto it = held_.find(s.held);
  if (it == held_.end()) return;
  HeldSession& h = it->second;
  if (!ok || !s.output_ids.defined()) {  // the slots' contents are unknown now
    for (auto& c : h.cached) c.clear();
    return;
  }
  // A row's K/V cover its prompt and outputs but the last token (never fed back).
  const at::Tensor ids = s.output_ids.select(1, 0).cpu().contiguous();
  const at::Tensor lengths = s.seq_lengths.select(1, 0).cpu().contiguous();
  const int64_t total = ids.size(1);
  for (int64_t b = 0; b < h.batch; ++b) {
    const int32_t* row = ids.data_ptr<int32_t>() + b * total;
    const int64_t n = std::max<int64_t>(lengths.data_ptr<int32_t>()[b] - 1, 0);
    h.cached[b].assign(row, row + n);
  }
  h.window = s.window;
}

int64_t GptModelHolder::run_steps(int64_t max_steps) {
  TORCH_CHECK(generation_->active(),
              "GptModel.decode_step: no generation session "
              "(call decode_start first)");
  TORCH_CHECK(max_steps >= 1, "GptModel.decode_step: max_steps must be >= 1, got ", max_steps);
  const c10::cuda::CUDAGuard guard(device_);
  model_->context().set_stream(c10::cuda::getCurrentCUDAStream(device_).stream());
  try {
    return generation_->step(max_steps);
  } catch (...) {
    generation_->abort();
    end_call(session_, /*ok=*/false);
    session_ = Session{};
    throw;
  }
}

at::Tensor GptModelHolder::decode_step(int64_t max_steps) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  const int64_t before = generation_->active() ? generation_->tokens_done() : 0;
  const int64_t n = run_steps(max_steps);
  const c10::cuda::CUDAGuard guard(device_);
  Session& s = session_;
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

c10::Dict<std::string, at::Tensor> GptModelHolder::decode_finish() {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  TORCH_CHECK(generation_->active(),
              "GptModel.decode_finish: no generation session "
              "(call decode_start first)");
  const c10::cuda::CUDAGuard guard(device_);
  model_->context().set_stream(c10::cuda::getCurrentCUDAStream(device_).stream());
  try {
    generation_->finish();
  } catch (...) {
    generation_->abort();
    end_call(session_, /*ok=*/false);
    session_ = Session{};
    throw;
  }
  Session s = std::move(session_);
  session_ = Session{};
  end_call(s, /*ok=*/true);
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

c10::Dict<std::string, at::Tensor> GptModelHolder::decode(
    const at::Tensor& input_ids, const at::Tensor& input_lengths, int64_t output_len,
    const c10::Dict<std::string, at::Tensor>& options) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  decode_start(input_ids, input_lengths, output_len, options);
  run_steps(output_len);  // the outputs are read from decode_finish's dict, not step by step
  return decode_finish();
}

}  // namespace warpformer
