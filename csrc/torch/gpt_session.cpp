// GptModelHolder's generation methods: the options dict of docs/GENERATION_API.md parsed and
// validated into device arrays, the output tensors, and the decode_start / decode_step /
// decode_finish session around csrc/models/gpt/gpt_decode.cpp.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "csrc/torch/gpt_class.h"
#include "csrc/torch/tensor_utils.h"
#include "kernels/sampling/beam_search.h"
#include "kernels/sampling/sampler.h"

namespace warpformer {
namespace {

constexpr const char* kOp = "GptModel.decode";

const std::set<std::string>& known_options() {
  static const std::set<std::string> keys = {"end_id",
                                             "top_k",
                                             "top_p",
                                             "temperature",
                                             "repetition_penalty",
                                             "presence_penalty",
                                             "frequency_penalty",
                                             "min_length",
                                             "seed",
                                             "bad_words",
                                             "stop_words",
                                             "beam_width",
                                             "length_penalty",
                                             "diversity_rate",
                                             "return_log_probs",
                                             "return_cum_log_probs"};
  return keys;
}

std::string known_list() {
  std::string s;
  for (const auto& k : known_options()) s += (s.empty() ? "" : ", ") + k;
  return s;
}

// A per-row option as a CPU tensor of `batch` values (0-d broadcast), of dtype `dt`.
at::Tensor per_row_cpu(const c10::Dict<std::string, at::Tensor>& o, const std::string& key,
                       at::ScalarType dt, double def, int64_t batch) {
  if (!o.contains(key)) return at::full({batch}, def, at::TensorOptions().dtype(dt));
  const at::Tensor t = o.at(key);
  const bool want_int = !at::isFloatingType(dt);
  TORCH_CHECK(!want_int || !t.is_floating_point(), kOp, ": option '", key,
              "' must be an integer tensor, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 0 || (t.dim() == 1 && (t.size(0) == batch || t.size(0) == 1)), kOp,
              ": option '", key, "' must be a scalar or have one value per row (", batch,
              "), got shape ", t.sizes());
  return t.to(at::kCPU).to(dt).reshape({-1}).expand({batch}).contiguous();
}

double scalar_option(const c10::Dict<std::string, at::Tensor>& o, const std::string& key,
                     double def) {
  if (!o.contains(key)) return def;
  const at::Tensor t = o.at(key);
  TORCH_CHECK(t.numel() == 1, kOp, ": option '", key, "' must be a single value, got shape ",
              t.sizes());
  return t.to(at::kCPU).to(at::kDouble).item<double>();
}

template <typename T>
void check_range(const at::Tensor& t, const std::string& key, bool (*ok)(T), const char* rule) {
  const T* p = t.data_ptr<T>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    TORCH_CHECK(ok(p[i]), kOp, ": option '", key, "' must be ", rule, ", got ", p[i], " (row ", i,
                ")");
  }
}

// Whether `pred` holds for any value of a contiguous CPU per-row tensor (a host loop: a tensor
// reduction and item() cost more than the loop at these sizes).
template <typename T>
bool any_row(const at::Tensor& t, bool (*pred)(T)) {
  const T* p = t.data_ptr<T>();
  return std::any_of(p, p + t.numel(), pred);
}

// FT word lists: [2, L] (shared) or [batch, 2, L]; row 0 token ids, row 1 end offsets (-1 pad).
at::Tensor word_list(const c10::Dict<std::string, at::Tensor>& o, const std::string& key,
                     int64_t batch, int64_t vocab, int64_t* row_stride, int* len) {
  *row_stride = 0;
  *len = 0;
  if (!o.contains(key)) return at::Tensor();
  const at::Tensor t = o.at(key).to(at::kCPU);
  TORCH_CHECK(!t.is_floating_point(), kOp, ": option '", key, "' must be an integer tensor");
  TORCH_CHECK(
      (t.dim() == 2 && t.size(0) == 2) || (t.dim() == 3 && t.size(0) == batch && t.size(1) == 2),
      kOp, ": option '", key, "' must have shape [2, L] or [", batch,
      ", 2, L] (FT format: token ids, then end offsets), got ", t.sizes());
  const at::Tensor w = t.to(at::kInt).contiguous();
  const int64_t L = w.size(-1);
  TORCH_CHECK(L >= 1, kOp, ": option '", key, "' is empty");
  const int64_t lists = w.dim() == 3 ? batch : 1;
  const int32_t* p = w.data_ptr<int32_t>();
  for (int64_t b = 0; b < lists; ++b) {
    const int32_t* ids = p + b * 2 * L;
    const int32_t* offs = ids + L;
    int32_t prev = 0;
    for (int64_t i = 0; i < L && offs[i] >= 0; ++i) {
      TORCH_CHECK(offs[i] > prev && offs[i] <= L, kOp, ": option '", key,
                  "' offsets must increase and stay <= L (", L, "), got ", offs[i], " at ", i);
      prev = offs[i];
    }
    for (int64_t i = 0; i < prev; ++i) {
      TORCH_CHECK(ids[i] >= 0 && ids[i] < vocab, kOp, ": option '", key, "' token ", ids[i],
                  " is outside the vocabulary [0, ", vocab, ")");
    }
  }
  *row_stride = w.dim() == 3 ? 2 * L : 0;
  *len = static_cast<int>(L);
  return w;
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
  for (const auto& kv : options) {
    TORCH_CHECK(known_options().count(kv.key()), kOp, ": unknown option '", kv.key(),
                "'; known options: ", known_list());
  }
  TORCH_CHECK(output_len >= 1, kOp, ": output_len must be >= 1, got ", output_len);
  check_parallel_ready(kOp);
  const int64_t V = model_->vocab_size();
  const int64_t beam = static_cast<int64_t>(scalar_option(options, "beam_width", 1));
  TORCH_CHECK(beam >= 1 && beam <= kernels::kMaxBeamWidth, kOp,
              ": option 'beam_width' must be in [1, ", kernels::kMaxBeamWidth, "], got ", beam);
  const int64_t batch = input_ids.dim() == 2 ? input_ids.size(0) : 0;
  const Prompt prompt = check_inputs(kOp, input_ids, input_lengths, output_len);

  Session s;
  s.batch = batch;
  s.beam = beam;
  s.seq = input_ids.size(1);
  s.output_len = output_len;
  auto f32 = at::kFloat;
  const at::Tensor end_ids =
      per_row_cpu(options, "end_id", at::kInt, static_cast<double>(model_->config().end_id), batch);
  {
    const int32_t* p = end_ids.data_ptr<int32_t>();
    for (int64_t i = 0; i < batch; ++i) {
      TORCH_CHECK(p[i] >= 0 && p[i] < V, kOp, ": option 'end_id' must be in [0, ", V, "), got ",
                  p[i], " (row ", i, ")");
    }
  }
  const at::Tensor top_k = per_row_cpu(options, "top_k", at::kInt, 1, batch);
  check_range<int32_t>(
      top_k, "top_k", [](int32_t k) { return k >= 0 && k <= kernels::kSamplerMaxTopK; },
      "in [0, 1024]");
  const at::Tensor top_p = per_row_cpu(options, "top_p", f32, 1.0, batch);
  check_range<float>(top_p, "top_p", [](float p) { return p > 0.f && p <= 1.f; }, "in (0, 1]");
  const at::Tensor temp = per_row_cpu(options, "temperature", f32, 1.0, batch);
  check_range<float>(
      temp, "temperature", [](float t) { return t > 0.f && std::isfinite(t); }, "finite and > 0");
  const at::Tensor rep = per_row_cpu(options, "repetition_penalty", f32, 1.0, batch);
  check_range<float>(
      rep, "repetition_penalty", [](float r) { return r > 0.f && std::isfinite(r); },
      "finite and > 0");
  const at::Tensor pres = per_row_cpu(options, "presence_penalty", f32, 0.0, batch);
  const at::Tensor freq = per_row_cpu(options, "frequency_penalty", f32, 0.0, batch);
  // NaN penalties pass every comparison the sampler makes and turn all logits into NaN.
  check_range<float>(pres, "presence_penalty", [](float p) { return std::isfinite(p); }, "finite");
  check_range<float>(freq, "frequency_penalty", [](float f) { return std::isfinite(f); }, "finite");
  const at::Tensor minl = per_row_cpu(options, "min_length", at::kInt, 0, batch);
  check_range<int32_t>(minl, "min_length", [](int32_t m) { return m >= 0; }, ">= 0");
  const at::Tensor seeds = per_row_cpu(options, "seed", at::kLong, 0, batch);
  int64_t bad_stride = 0, stop_stride = 0;
  int bad_len = 0, stop_len = 0;
  const at::Tensor bad = word_list(options, "bad_words", batch, V, &bad_stride, &bad_len);
  const at::Tensor stop = word_list(options, "stop_words", batch, V, &stop_stride, &stop_len);
  s.return_log_probs = scalar_option(options, "return_log_probs", 0) != 0;
  s.cum_mode = static_cast<int64_t>(scalar_option(options, "return_cum_log_probs", 0));
  TORCH_CHECK(s.cum_mode >= 0 && s.cum_mode <= 2, kOp,
              ": option 'return_cum_log_probs' must be 0, 1 or 2, got ", s.cum_mode);
  const double length_penalty = scalar_option(options, "length_penalty", 1.0);
  const double diversity_rate = scalar_option(options, "diversity_rate", 0.0);
  TORCH_CHECK(std::isfinite(length_penalty), kOp, ": option 'length_penalty' must be finite, got ",
              length_penalty);
  TORCH_CHECK(std::isfinite(diversity_rate), kOp, ": option 'diversity_rate' must be finite, got ",
              diversity_rate);

  const bool all_greedy = !any_row<int32_t>(top_k, [](int32_t k) { return k != 1; });
  const bool penalties = any_row<float>(rep, [](float r) { return r != 1.f; }) ||
                         any_row<float>(pres, [](float p) { return p != 0.f; }) ||
                         any_row<float>(freq, [](float f) { return f != 0.f; });
  const bool process = penalties || any_row<int32_t>(minl, [](int32_t m) { return m != 0; }) ||
                       bad.defined() || stop.defined();
  if (beam > 1) {
    TORCH_CHECK(all_greedy, kOp,
                ": beam search is deterministic: top_k must be 1 (the "
                "default) when beam_width > 1");
    TORCH_CHECK(!stop.defined(), kOp, ": stop_words are not supported with beam search");
  }

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
  std::vector<at::Tensor> host = {
      per_beam(end_ids, beam),
      per_beam(top_k, beam),
      per_beam(top_p, beam),
      per_beam(temp, beam),
      per_beam(rep, beam),
      per_beam(pres, beam),
      per_beam(freq, beam),
      per_beam(minl, beam),
      per_beam(seeds, beam),
      bad.defined() ? (bad.dim() == 3 ? per_beam(bad, beam) : bad) : at::Tensor(),
      stop.defined() ? (stop.dim() == 3 ? per_beam(stop, beam) : stop) : at::Tensor(),
      lengths,
      prompt_then_end_ids(prompt, end_ids.data_ptr<int32_t>(), beam, total),
      per_beam(lengths, beam).view({batch, beam}),
      input_ids.is_cuda() ? at::Tensor() : prompt.host_ids};
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
  if (s.cum_mode == 2) {
    // Context log probs: log p(token_i | tokens_<i) of the prompt, i >= 1, summed per row.
    const at::Tensor logits = forward(ids, s.input_lengths).to(f32);
    const at::Tensor lp = at::log_softmax(logits.narrow(1, 0, s.seq - 1), -1);
    const at::Tensor next = ids.narrow(1, 1, s.seq - 1).to(at::kLong).clamp(0, V - 1);
    const at::Tensor tok = lp.gather(2, next.unsqueeze(2)).squeeze(2);
    const at::Tensor valid =
        at::arange(1, s.seq, ids.options()).unsqueeze(0) < s.input_lengths.unsqueeze(1);
    s.context_log_probs = at::where(valid, tok, at::zeros_like(tok)).sum(1);
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
    opt.bad_words_row_stride = bad_stride;
    opt.bad_words_len = bad_len;
  }
  if (s.stop.defined()) {
    opt.stop_words = s.stop.data_ptr<int32_t>();
    opt.stop_words_row_stride = stop_stride;
    opt.stop_words_len = stop_len;
  }
  opt.greedy = beam == 1 && all_greedy && !process && !s.return_log_probs && s.cum_mode == 0;
  opt.needs_counts = penalties;
  opt.length_penalty = static_cast<float>(length_penalty);
  opt.diversity_rate = static_cast<float>(diversity_rate);
  generation::DecodeOutputs o;
  o.output_ids = s.output_ids.data_ptr<int32_t>();
  o.sequence_lengths = s.seq_lengths.data_ptr<int32_t>();
  o.cum_log_probs = s.cum_log_probs.defined() ? s.cum_log_probs.data_ptr<float>() : nullptr;
  o.output_log_probs =
      s.output_log_probs.defined() ? s.output_log_probs.data_ptr<float>() : nullptr;
  generation_->start(ids.data_ptr<int32_t>(), prompt.lengths, s.seq, output_len, opt, o);
  session_ = std::move(s);
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
    session_ = Session{};
    throw;
  }
  Session s = std::move(session_);
  session_ = Session{};
  c10::Dict<std::string, at::Tensor> out;
  out.insert("output_ids", s.output_ids);
  out.insert("sequence_lengths", s.seq_lengths);
  if (s.cum_log_probs.defined()) {
    if (s.context_log_probs.defined()) s.cum_log_probs.add_(s.context_log_probs.unsqueeze(1));
    out.insert("cum_log_probs", s.cum_log_probs);
  }
  if (s.output_log_probs.defined()) out.insert("output_log_probs", s.output_log_probs);
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
