// Torch ops for the sampling kernel family (kernels/sampling): argument checks, dtype dispatch,
// launch on PyTorch's current stream. These are test and user entry points: besides dtype and
// shape they check option values and the word lists on the host (one small device-to-host copy
// each), which the generation loop, calling the launchers directly, does once per request.
// Per-row options are [rows] tensors or 0-d tensors broadcast to every row.
//
// Checks run in the order dtype/shape -> values -> device, so the messages are the same on a
// machine without a GPU (CPU tensors reach every check but the last).
#include "csrc/torch/ops_sampling.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "csrc/core/check.h"
#include "csrc/torch/tensor_utils.h"
#include "kernels/sampling/greedy.h"
#include "kernels/sampling/logits_processor.h"
#include "kernels/sampling/sampler.h"
#include "kernels/sampling/token_update.h"

namespace warpformer {
namespace ops {
namespace {

template <typename T>
std::vector<T> host_copy(const at::Tensor& t) {
  const at::Tensor h = t.to(at::kCPU).contiguous();
  std::vector<T> v(static_cast<size_t>(h.numel()));
  if (!v.empty()) std::memcpy(v.data(), h.data_ptr(), v.size() * sizeof(T));
  return v;
}

// A per-row option: `dtype`, shape [rows] or [] (broadcast). Returns a contiguous [rows] tensor,
// or an undefined tensor when absent.
at::Tensor per_row(const OptTensor& t, int64_t rows, c10::ScalarType dtype, const char* op,
                   const char* arg) {
  if (!t.has_value() || !t->defined()) return at::Tensor();
  check_dtype(*t, dtype, op, arg);
  TORCH_CHECK(t->dim() == 0 || (t->dim() == 1 && t->size(0) == rows), op, ": ", arg,
              " must have shape [", rows, "] (one value per row) or [] (one value for all rows), ",
              "got ", t->sizes());
  return t->dim() == 0 ? t->reshape({1}).expand({rows}).contiguous() : t->contiguous();
}

template <typename T, typename Pred>
void check_each(const at::Tensor& t, Pred ok, const char* op, const char* arg, const char* rule) {
  if (!t.defined()) return;
  const std::vector<T> v = host_copy<T>(t);
  for (size_t i = 0; i < v.size(); ++i) {
    TORCH_CHECK(ok(v[i]), op, ": ", arg, "[", i, "] = ", v[i], " breaks the rule: ", rule);
  }
}

// [rows] state tensor (int32 unless told), written in place.
void check_state(const at::Tensor& t, int64_t rows, const char* op, const char* arg,
                 c10::ScalarType dtype = at::kInt) {
  check_dtype(t, dtype, op, arg);
  check_dim(t, 1, op, arg);
  check_size(t, 0, rows, op, arg, "rows of tokens");
  check_contiguous(t, op, arg);
}

// The logits' row count, validated vocab, and a view whose last axis is unit-stride.
struct LogitsView {
  at::Tensor t;
  int64_t rows;
  int64_t vocab;
  int64_t row_stride;  // elements between rows; 0: every row reads the same logits
};

LogitsView logits_view(const at::Tensor& logits, int64_t vocab, const char* op) {
  check_dim(logits, 2, op, "logits");
  const int64_t rows = logits.size(0), cols = logits.size(1);
  TORCH_CHECK(rows <= INT32_MAX, op, ": logits has more than 2^31-1 rows, got ", rows);
  TORCH_CHECK(cols >= 1 && cols <= INT32_MAX, op,
              ": logits must have 1 to 2^31-1 columns, got shape ", logits.sizes());
  const int64_t v = vocab < 0 ? cols : vocab;
  TORCH_CHECK(v >= 1 && v <= cols, op, ": vocab must be -1 (all columns) or in [1, ",
              "logits.shape[1] = ", cols, "] (columns past it are padding), got ", vocab);
  // Rows may be padded (stride >= columns) or broadcast (stride 0, e.g. from expand).
  const bool usable = logits.stride(1) == 1 && (logits.stride(0) == 0 || logits.stride(0) >= cols);
  const at::Tensor t = usable ? logits : logits.contiguous();
  return LogitsView{t, rows, v, rows == 1 ? 0 : t.stride(0)};
}

// FT word list ([2, L] shared or [rows, 2, L]): validates the offsets (increasing, in (0, L],
// -1 padded at the end) and the ids (in [0, vocab) when vocab > 0, else >= 0). Sets
// *multi_token when an entry is longer than one token.
void check_word_list(const at::Tensor& w, int64_t rows, int64_t vocab, const char* op,
                     const char* arg, bool* multi_token) {
  check_dtype(w, at::kInt, op, arg);
  check_dim_in(w, {2, 3}, op, arg);
  TORCH_CHECK(w.size(-2) == 2 && (w.dim() == 2 || w.size(0) == rows), op, ": ", arg,
              " must have shape [2, L] (shared) or [", rows,
              ", 2, L] (per row) in FT format (row 0: token ids of the entries concatenated, "
              "row 1: each entry's end offset, -1 padded), got ",
              w.sizes());
  TORCH_CHECK(w.size(-1) <= INT32_MAX, op, ": ", arg, " is longer than 2^31-1");
  const int64_t L = w.size(-1);
  const int64_t lists = w.dim() == 2 ? 1 : rows;
  const std::vector<int32_t> v = host_copy<int32_t>(w);
  *multi_token = false;
  for (int64_t l = 0; l < lists; ++l) {
    const int32_t* ids = v.data() + l * 2 * L;
    const int32_t* offs = ids + L;
    int32_t prev = 0;
    bool ended = false;
    for (int64_t i = 0; i < L; ++i) {
      const int32_t o = offs[i];
      if (o < 0) {
        ended = true;
        continue;
      }
      TORCH_CHECK(!ended, op, ": ", arg, " list ", l, ": offset ", o, " at entry ", i,
                  " follows a -1; the -1 padding must come after every entry");
      TORCH_CHECK(o > prev && o <= L, op, ": ", arg, " list ", l, ": entry ", i, " ends at offset ",
                  o, "; offsets must be increasing and in (0, L = ", L, "]");
      for (int32_t j = prev; j < o; ++j) {
        TORCH_CHECK(ids[j] >= 0 && (vocab <= 0 || ids[j] < vocab), op, ": ", arg, " list ", l,
                    ": token id ", ids[j], " at position ", j, " is outside [0, ",
                    vocab > 0 ? std::to_string(vocab) : std::string("inf"), ")");
      }
      if (o - prev > 1) *multi_token = true;
      prev = o;
    }
  }
}

void check_same_device(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* arg,
                       const char* ref_name) {
  if (t.defined()) check_cuda(t, op, arg, ref, ref_name);
}

template <typename T>
T* ptr(const at::Tensor& t) {
  return t.defined() ? reinterpret_cast<T*>(t.data_ptr()) : nullptr;
}

}  // namespace

at::Tensor count_tokens(const at::Tensor& ids, const at::Tensor& lengths, int64_t vocab) {
  const char* op = "warpformer.count_tokens";
  check_dtype(ids, at::kInt, op, "ids");
  check_dim(ids, 2, op, "ids");
  const int64_t rows = ids.size(0);
  TORCH_CHECK(rows <= INT32_MAX && ids.size(1) <= INT32_MAX, op,
              ": ids dimensions must be < 2^31, got ", ids.sizes());
  check_dtype(lengths, at::kInt, op, "lengths");
  check_dim(lengths, 1, op, "lengths");
  check_size(lengths, 0, rows, op, "lengths", "rows of ids");
  TORCH_CHECK(vocab >= 1 && vocab <= INT32_MAX, op, ": vocab must be in [1, 2^31), got ", vocab);
  const int64_t seq = ids.size(1);
  check_each<int32_t>(
      lengths, [seq](int32_t x) { return x >= 0 && x <= seq; }, op, "lengths",
      "0 <= length <= ids.shape[1]");
  check_cuda(ids, op, "ids");
  check_cuda(lengths, op, "lengths", ids, "ids");

  const c10::cuda::CUDAGuard guard(ids.device());
  const at::Tensor i = ids.contiguous();
  const at::Tensor l = lengths.contiguous();
  at::Tensor counts = at::empty({rows, vocab}, ids.options());
  kernels::TokenCountInitParams p{};
  p.counts = counts.data_ptr<int32_t>();
  p.ids = i.data_ptr<int32_t>();
  p.lengths = l.data_ptr<int32_t>();
  p.rows = static_cast<int>(rows);
  p.vocab = static_cast<int>(vocab);
  p.ids_stride = static_cast<int>(seq);
  WF_CUDA_CHECK(kernels::launch_init_token_counts(p, current_stream(i)));
  return counts;
}

void add_token_counts(at::Tensor& counts, const at::Tensor& tokens, const OptTensor& finished) {
  const char* op = "warpformer.add_token_counts";
  check_dtype(counts, at::kInt, op, "counts");
  check_dim(counts, 2, op, "counts");
  check_contiguous(counts, op, "counts");
  const int64_t rows = counts.size(0);
  TORCH_CHECK(rows <= INT32_MAX && counts.size(1) >= 1 && counts.size(1) <= INT32_MAX, op,
              ": counts must be [rows, vocab] with 1 <= vocab < 2^31, got ", counts.sizes());
  check_dtype(tokens, at::kInt, op, "tokens");
  check_dim(tokens, 1, op, "tokens");
  check_size(tokens, 0, rows, op, "tokens", "rows of counts");
  const at::Tensor fin = per_row(finished, rows, at::kInt, op, "finished");
  check_cuda(counts, op, "counts");
  check_cuda(tokens, op, "tokens", counts, "counts");
  check_same_device(fin, counts, op, "finished", "counts");

  const c10::cuda::CUDAGuard guard(counts.device());
  const at::Tensor t = tokens.contiguous();
  kernels::TokenCountAddParams p{};
  p.counts = counts.data_ptr<int32_t>();
  p.tokens = t.data_ptr<int32_t>();
  p.finished = ptr<const int32_t>(fin);
  p.rows = static_cast<int>(rows);
  p.vocab = static_cast<int>(counts.size(1));
  WF_CUDA_CHECK(kernels::launch_add_token_counts(p, current_stream(t)));
}

at::Tensor process_logits(const at::Tensor& logits, const OptTensor& token_counts,
                          const OptTensor& repetition_penalty, const OptTensor& presence_penalty,
                          const OptTensor& frequency_penalty, const OptTensor& temperature,
                          const OptTensor& min_length, const OptTensor& end_ids,
                          const OptTensor& input_lengths, const OptTensor& cur_pos,
                          const OptTensor& output_ids, const OptTensor& bad_words, int64_t vocab,
                          int64_t step) {
  const char* op = "warpformer.process_logits";
  check_floating(logits, op, "logits");
  const LogitsView lv = logits_view(logits, vocab, op);
  const int64_t rows = lv.rows, V = lv.vocab;

  const at::Tensor rep = per_row(repetition_penalty, rows, at::kFloat, op, "repetition_penalty");
  const at::Tensor pres = per_row(presence_penalty, rows, at::kFloat, op, "presence_penalty");
  const at::Tensor freq = per_row(frequency_penalty, rows, at::kFloat, op, "frequency_penalty");
  const at::Tensor temp = per_row(temperature, rows, at::kFloat, op, "temperature");
  const at::Tensor minlen = per_row(min_length, rows, at::kInt, op, "min_length");
  const at::Tensor ends = per_row(end_ids, rows, at::kInt, op, "end_ids");
  const at::Tensor lens = per_row(input_lengths, rows, at::kInt, op, "input_lengths");
  const at::Tensor pos = per_row(cur_pos, rows, at::kInt, op, "cur_pos");
  at::Tensor counts;
  if (token_counts.has_value() && token_counts->defined()) {
    counts = *token_counts;
    check_dtype(counts, at::kInt, op, "token_counts");
    TORCH_CHECK(counts.dim() == 2 && counts.size(0) == rows && counts.size(1) == V, op,
                ": token_counts must have shape [", rows, ", ", V, "] ([rows, vocab]), got ",
                counts.sizes());
    counts = counts.contiguous();
  }
  const bool penalties = rep.defined() || pres.defined() || freq.defined();
  TORCH_CHECK(!penalties || counts.defined(), op,
              ": token_counts is required when repetition_penalty, presence_penalty or "
              "frequency_penalty is given (see warpformer.count_tokens)");
  TORCH_CHECK(!minlen.defined() || ends.defined(), op,
              ": end_ids is required when min_length is given (the token it bans)");
  TORCH_CHECK(lens.defined() == pos.defined() || !minlen.defined(), op,
              ": min_length needs both input_lengths and cur_pos (generated = cur_pos + 1 - "
              "input_lengths), or neither (generated = step)");
  TORCH_CHECK(step >= 0 && step <= INT32_MAX, op, ": step must be in [0, 2^31), got ", step);
  at::Tensor out_ids;
  if (output_ids.has_value() && output_ids->defined()) {
    out_ids = *output_ids;
    check_dtype(out_ids, at::kInt, op, "output_ids");
    check_dim(out_ids, 2, op, "output_ids");
    check_size(out_ids, 0, rows, op, "output_ids", "rows of logits");
    TORCH_CHECK(out_ids.size(1) >= 1 && out_ids.size(1) <= INT32_MAX, op,
                ": output_ids must have 1 to 2^31-1 columns, got ", out_ids.sizes());
    out_ids = out_ids.contiguous();
  }
  at::Tensor bad;
  bool multi_token = false;
  if (bad_words.has_value() && bad_words->defined()) {
    bad = bad_words->contiguous();
    check_word_list(bad, rows, V, op, "bad_words", &multi_token);
    TORCH_CHECK(!multi_token || (out_ids.defined() && pos.defined()), op,
                ": bad_words has entries of several tokens; they need output_ids and cur_pos "
                "(the sequence they are matched against)");
  }
  // values
  check_each<float>(
      rep, [](float x) { return x > 0.f && std::isfinite(x); }, op, "repetition_penalty",
      "finite and > 0");
  check_each<float>(
      pres, [](float x) { return std::isfinite(x); }, op, "presence_penalty", "finite");
  check_each<float>(
      freq, [](float x) { return std::isfinite(x); }, op, "frequency_penalty", "finite");
  check_each<float>(
      temp, [](float x) { return x > 0.f && std::isfinite(x); }, op, "temperature",
      "finite and > 0");
  check_each<int32_t>(minlen, [](int32_t x) { return x >= 0; }, op, "min_length", ">= 0");
  if (pos.defined() && out_ids.defined()) {
    const int64_t cols = out_ids.size(1);
    check_each<int32_t>(
        pos, [cols](int32_t x) { return x >= 0 && x < cols; }, op, "cur_pos",
        "0 <= cur_pos < output_ids.shape[1]");
  }
  // devices
  check_cuda(logits, op, "logits");
  const at::Tensor& ref = logits;
  check_same_device(counts, ref, op, "token_counts", "logits");
  check_same_device(rep, ref, op, "repetition_penalty", "logits");
  check_same_device(pres, ref, op, "presence_penalty", "logits");
  check_same_device(freq, ref, op, "frequency_penalty", "logits");
  check_same_device(temp, ref, op, "temperature", "logits");
  check_same_device(minlen, ref, op, "min_length", "logits");
  check_same_device(ends, ref, op, "end_ids", "logits");
  check_same_device(lens, ref, op, "input_lengths", "logits");
  check_same_device(pos, ref, op, "cur_pos", "logits");
  check_same_device(out_ids, ref, op, "output_ids", "logits");
  check_same_device(bad, ref, op, "bad_words", "logits");

  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor out = at::empty({rows, V}, logits.options().dtype(at::kFloat));
  if (rows == 0) return out;
  WF_DISPATCH_FLOATING(to_dtype(lv.t.scalar_type(), op, "logits"), op, [&] {
    kernels::LogitsProcessorParams<scalar_t> p{};
    p.out = out.data_ptr<float>();
    p.logits = reinterpret_cast<const scalar_t*>(lv.t.data_ptr());
    p.token_counts = ptr<const int32_t>(counts);
    p.repetition_penalty = ptr<const float>(rep);
    p.presence_penalty = ptr<const float>(pres);
    p.frequency_penalty = ptr<const float>(freq);
    p.temperature = ptr<const float>(temp);
    p.min_length = ptr<const int32_t>(minlen);
    p.end_ids = ptr<const int32_t>(ends);
    p.input_lengths = ptr<const int32_t>(lens);
    p.cur_pos = ptr<const int32_t>(pos);
    p.output_ids = ptr<const int32_t>(out_ids);
    p.bad_words = ptr<const int32_t>(bad);
    p.logits_stride = lv.row_stride;
    p.out_stride = V;
    p.bad_words_len = bad.defined() ? static_cast<int>(bad.size(-1)) : 0;
    p.bad_words_row_stride = (bad.defined() && bad.dim() == 3) ? 2 * bad.size(-1) : 0;
    p.output_stride = out_ids.defined() ? static_cast<int>(out_ids.size(1)) : 0;
    p.step = static_cast<int>(step);
    p.rows = static_cast<int>(rows);
    p.vocab = static_cast<int>(V);
    WF_CUDA_CHECK(kernels::launch_process_logits(p, current_stream(lv.t)));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> sample_tokens(const at::Tensor& logits, const at::Tensor& top_k,
                                                 const at::Tensor& top_p, const at::Tensor& seeds,
                                                 const at::Tensor& positions, int64_t vocab) {
  const char* op = "warpformer.sample_tokens";
  check_dtype(logits, at::kFloat, op, "logits",
              "the processed logits; see warpformer.process_logits");
  const LogitsView lv = logits_view(logits, vocab, op);
  const int64_t rows = lv.rows;
  const at::Tensor k = per_row(top_k, rows, at::kInt, op, "top_k");
  const at::Tensor p_ = per_row(top_p, rows, at::kFloat, op, "top_p");
  const at::Tensor s = per_row(seeds, rows, at::kLong, op, "seeds");
  const at::Tensor pos = per_row(positions, rows, at::kInt, op, "positions");
  check_each<int32_t>(
      k, [](int32_t x) { return x >= 0 && x <= kernels::kSamplerMaxTopK; }, op, "top_k",
      "0 <= top_k <= 1024 (0: no top-k filter, 1: greedy)");
  check_each<float>(
      p_, [](float x) { return x > 0.f && x <= 1.f; }, op, "top_p",
      "0 < top_p <= 1 (1: no top-p filter)");
  check_each<int32_t>(pos, [](int32_t x) { return x >= 0; }, op, "positions", ">= 0");
  check_cuda(logits, op, "logits");
  check_cuda(k, op, "top_k", logits, "logits");
  check_cuda(p_, op, "top_p", logits, "logits");
  check_cuda(s, op, "seeds", logits, "logits");
  check_cuda(pos, op, "positions", logits, "logits");

  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor tokens = at::empty({rows}, logits.options().dtype(at::kInt));
  at::Tensor log_probs = at::empty({rows}, logits.options().dtype(at::kFloat));
  if (rows == 0) return {tokens, log_probs};
  kernels::SamplerParams p{};
  p.logits = lv.t.data_ptr<float>();
  p.tokens = tokens.data_ptr<int32_t>();
  p.log_probs = log_probs.data_ptr<float>();
  p.top_k = k.data_ptr<int32_t>();
  p.top_p = p_.data_ptr<float>();
  p.seeds = reinterpret_cast<const uint64_t*>(s.data_ptr<int64_t>());
  p.positions = pos.data_ptr<int32_t>();
  p.logits_stride = lv.row_stride;
  p.position_offset = 0;
  p.rows = static_cast<int>(rows);
  p.vocab = static_cast<int>(lv.vocab);
  WF_CUDA_CHECK(kernels::launch_sample_tokens(p, current_stream(lv.t)));
  return {tokens, log_probs};
}

at::Tensor greedy_tokens(const at::Tensor& logits, int64_t vocab, bool split) {
  const char* op = "warpformer.greedy_tokens";
  check_floating(logits, op, "logits");
  const LogitsView lv = logits_view(logits, vocab, op);
  check_cuda(logits, op, "logits");
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t rows = lv.rows;
  const auto ints = logits.options().dtype(at::kInt);
  // The engine's greedy step on a throwaway state: one new position per row (output_ids
  // [rows, 2], cur_pos 0), end id -1 (never produced), so next_tokens is the argmax.
  at::Tensor next = at::empty({rows}, ints);
  if (rows == 0) return next;
  at::Tensor state = at::zeros({5, rows}, ints);  // cur_pos, attn_len, finished, lengths, arrivals
  at::Tensor out_ids = at::zeros({rows, 2}, ints);
  at::Tensor ends = at::full({rows}, -1, ints);
  const int64_t chunks = kernels::greedy_step_chunks(static_cast<int>(lv.vocab));
  at::Tensor values = at::empty({rows, chunks}, logits.options().dtype(at::kFloat));
  at::Tensor indices = at::empty({rows, chunks}, ints);
  WF_DISPATCH_FLOATING(to_dtype(lv.t.scalar_type(), op, "logits"), op, [&] {
    kernels::GreedyStepParams<scalar_t> p{};
    p.logits = reinterpret_cast<const scalar_t*>(lv.t.data_ptr());
    p.next_tokens = next.data_ptr<int32_t>();
    p.cur_pos = state[0].data_ptr<int32_t>();
    p.attn_len = state[1].data_ptr<int32_t>();
    p.finished = state[2].data_ptr<int32_t>();
    p.seq_lengths = state[3].data_ptr<int32_t>();
    p.output_ids = out_ids.data_ptr<int32_t>();
    p.end_ids = ends.data_ptr<int32_t>();
    p.rows = static_cast<int>(rows);
    p.vocab = static_cast<int>(lv.vocab);
    p.logits_stride = lv.row_stride;
    p.output_stride = 2;
    if (split) {
      p.arrivals = reinterpret_cast<uint32_t*>(state[4].data_ptr<int32_t>());
      p.partial_values = values.data_ptr<float>();
      p.partial_indices = indices.data_ptr<int32_t>();
    }
    WF_CUDA_CHECK(kernels::launch_greedy_step(p, current_stream(lv.t)));
  });
  return next;
}

at::Tensor update_tokens(const at::Tensor& tokens, const OptTensor& log_probs, at::Tensor& cur_pos,
                         at::Tensor& attn_len, at::Tensor& finished, at::Tensor& output_ids,
                         at::Tensor& seq_lengths, const at::Tensor& end_ids,
                         const OptTensor& stop_words, const OptTensor& cum_log_probs,
                         const OptTensor& output_log_probs, int64_t step,
                         const OptTensor& token_counts, const OptTensor& input_lengths) {
  const char* op = "warpformer.update_tokens";
  check_dtype(tokens, at::kInt, op, "tokens");
  check_dim(tokens, 1, op, "tokens");
  const int64_t rows = tokens.size(0);
  TORCH_CHECK(rows <= INT32_MAX, op, ": tokens has more than 2^31-1 rows");
  const at::Tensor lp = per_row(log_probs, rows, at::kFloat, op, "log_probs");
  check_state(cur_pos, rows, op, "cur_pos");
  check_state(attn_len, rows, op, "attn_len");
  check_state(finished, rows, op, "finished");
  check_state(seq_lengths, rows, op, "seq_lengths");
  check_dtype(output_ids, at::kInt, op, "output_ids");
  check_dim(output_ids, 2, op, "output_ids");
  check_size(output_ids, 0, rows, op, "output_ids", "rows of tokens");
  check_contiguous(output_ids, op, "output_ids");
  const int64_t stride = output_ids.size(1);
  TORCH_CHECK(stride >= 1 && stride <= INT32_MAX, op,
              ": output_ids must have 1 to 2^31-1 columns, got ", output_ids.sizes());
  const at::Tensor ends = per_row(end_ids, rows, at::kInt, op, "end_ids");
  at::Tensor cum;
  if (cum_log_probs.has_value() && cum_log_probs->defined()) {
    cum = *cum_log_probs;
    check_state(cum, rows, op, "cum_log_probs", at::kFloat);
  }
  at::Tensor olp;
  if (output_log_probs.has_value() && output_log_probs->defined()) {
    olp = *output_log_probs;
    check_dtype(olp, at::kFloat, op, "output_log_probs");
    check_dim(olp, 2, op, "output_log_probs");
    check_size(olp, 0, rows, op, "output_log_probs", "rows of tokens");
    check_contiguous(olp, op, "output_log_probs");
    TORCH_CHECK(olp.size(1) >= 1 && olp.size(1) <= INT32_MAX, op,
                ": output_log_probs must have 1 to 2^31-1 columns, got ", olp.sizes());
  }
  const at::Tensor in_lens = per_row(input_lengths, rows, at::kInt, op, "input_lengths");
  if (olp.defined() && !in_lens.defined()) {
    TORCH_CHECK(step >= 0 && step < olp.size(1), op, ": step must be in [0, ",
                "output_log_probs.shape[1] = ", olp.size(1), "), got ", step);
  }
  TORCH_CHECK(!(cum.defined() || olp.defined()) || lp.defined(), op,
              ": log_probs is required when cum_log_probs or output_log_probs is given");
  TORCH_CHECK(step >= 0 && step <= INT32_MAX, op, ": step must be in [0, 2^31), got ", step);
  at::Tensor counts;
  if (token_counts.has_value() && token_counts->defined()) {
    counts = *token_counts;
    check_dtype(counts, at::kInt, op, "token_counts");
    check_dim(counts, 2, op, "token_counts");
    check_size(counts, 0, rows, op, "token_counts", "rows of tokens");
    check_contiguous(counts, op, "token_counts");
    TORCH_CHECK(counts.size(1) >= 1 && counts.size(1) <= INT32_MAX, op,
                ": token_counts must be [rows, vocab] with 1 <= vocab < 2^31, got ",
                counts.sizes());
  }
  at::Tensor stop;
  if (stop_words.has_value() && stop_words->defined()) {
    stop = stop_words->contiguous();
    bool multi = false;
    check_word_list(stop, rows, counts.defined() ? counts.size(1) : 0, op, "stop_words", &multi);
  }
  check_each<int32_t>(
      cur_pos, [stride](int32_t x) { return x >= -1 && x < stride; }, op, "cur_pos",
      "-1 <= cur_pos < output_ids.shape[1]");
  check_each<int32_t>(
      in_lens, [stride](int32_t x) { return x >= 0 && x <= stride; }, op, "input_lengths",
      "0 <= input_lengths <= output_ids.shape[1]");
  // devices
  check_cuda(tokens, op, "tokens");
  check_same_device(lp, tokens, op, "log_probs", "tokens");
  check_cuda(cur_pos, op, "cur_pos", tokens, "tokens");
  check_cuda(attn_len, op, "attn_len", tokens, "tokens");
  check_cuda(finished, op, "finished", tokens, "tokens");
  check_cuda(output_ids, op, "output_ids", tokens, "tokens");
  check_cuda(seq_lengths, op, "seq_lengths", tokens, "tokens");
  check_cuda(ends, op, "end_ids", tokens, "tokens");
  check_same_device(cum, tokens, op, "cum_log_probs", "tokens");
  check_same_device(olp, tokens, op, "output_log_probs", "tokens");
  check_same_device(counts, tokens, op, "token_counts", "tokens");
  check_same_device(stop, tokens, op, "stop_words", "tokens");
  check_same_device(in_lens, tokens, op, "input_lengths", "tokens");

  const c10::cuda::CUDAGuard guard(tokens.device());
  const at::Tensor t = tokens.contiguous();
  at::Tensor next = at::empty({rows}, tokens.options());
  if (rows == 0) return next;
  kernels::TokenUpdateParams p{};
  p.tokens = t.data_ptr<int32_t>();
  p.token_log_probs = ptr<const float>(lp);
  p.next_tokens = next.data_ptr<int32_t>();
  p.cur_pos = cur_pos.data_ptr<int32_t>();
  p.attn_len = attn_len.data_ptr<int32_t>();
  p.finished = finished.data_ptr<int32_t>();
  p.output_ids = output_ids.data_ptr<int32_t>();
  p.seq_lengths = seq_lengths.data_ptr<int32_t>();
  p.end_ids = ends.data_ptr<int32_t>();
  p.cum_log_probs = ptr<float>(cum);
  p.output_log_probs = ptr<float>(olp);
  p.token_counts = ptr<int32_t>(counts);
  p.input_lengths = ptr<const int32_t>(in_lens);
  p.stop_words = ptr<const int32_t>(stop);
  p.stop_words_row_stride = (stop.defined() && stop.dim() == 3) ? 2 * stop.size(-1) : 0;
  p.stop_words_len = stop.defined() ? static_cast<int>(stop.size(-1)) : 0;
  p.log_probs_stride = olp.defined() ? static_cast<int>(olp.size(1)) : 0;
  p.step = static_cast<int>(step);
  p.vocab = counts.defined() ? static_cast<int>(counts.size(1)) : 0;
  p.output_stride = static_cast<int>(stride);
  p.rows = static_cast<int>(rows);
  WF_CUDA_CHECK(kernels::launch_update_tokens(p, current_stream(t)));
  return next;
}

}  // namespace ops
}  // namespace warpformer
