// GptModelHolder's generation methods: the decode_start / decode_step / decode_finish session
// around csrc/generation/session.h (the shared part in generation_call.h), with the GPT family's
// own options: interactive sessions, prompt tables, memory_len and context log probs.
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

  const c10::cuda::CUDAGuard guard(device_);
  model_->context().set_stream(c10::cuda::getCurrentCUDAStream(device_).stream());
  prepare_call(g, prompt, input_ids, output_len, model_->config().hidden(), model_->dtype(),
               device_, &s);
  const at::Tensor& ids = s.ids;
  if (s.prompt_table.defined()) {  // dropped by end_call
    model_->set_prompt_table({s.prompt_table.data_ptr(), s.prompt_table.size(0)});
  }
  if (s.cum_mode == 2) {
    // Context log probs: log p(token_i | tokens_<i) of the prompt, i >= 1, summed per row (a
    // prompt-table position is not a token: it has none).
    try {
      const at::Tensor logits =
          forward_windowed(ids, s.input_lengths, memory_len, table_rows).to(at::kFloat);
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

  // The session's prompt pass and steps attend through the call's window (forward and generate
  // set their own, and neither runs while the session does).
  model_->set_attention_window(memory_len);
  if (held != 0) model_->use_slots(held_.at(held).first_slot);
  try {
    generation_->start(ids.data_ptr<int32_t>(), prompt.lengths, s.seq, output_len, s.opt, s.out,
                       past);
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

CallDriver GptModelHolder::driver() {
  return CallDriver{
      generation_.get(), model_.get(),
      device_,           "GptModel",
      &session_,         [this](const GenerationCall& s, bool ok) { end_call(s, ok); }};
}

at::Tensor GptModelHolder::decode_step(int64_t max_steps) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  return driver().step(max_steps);
}

c10::Dict<std::string, at::Tensor> GptModelHolder::decode_finish() {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  return driver().finish();
}

c10::Dict<std::string, at::Tensor> GptModelHolder::decode(
    const at::Tensor& input_ids, const at::Tensor& input_lengths, int64_t output_len,
    const c10::Dict<std::string, at::Tensor>& options) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  decode_start(input_ids, input_lengths, output_len, options);
  driver().run_steps(output_len);  // the outputs are read from decode_finish's dict
  return decode_finish();
}

}  // namespace warpformer
