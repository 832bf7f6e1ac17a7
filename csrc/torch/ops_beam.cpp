// Torch ops of the beam-search kernel family (kernels/sampling/beam_search.h): argument checks,
// launch on PyTorch's current stream, schemas and registrations. The state travels as named
// tensors with the kernels' layout (rows = B * W, row = b * W + k); mutated ones are marked `!`.
// dtype/shape checks come before the device check, so CPU tensors reach every message; the CPU
// registration then fails naming the first argument that is not on the GPU.
#include "csrc/torch/ops_beam.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "csrc/core/check.h"
#include "csrc/torch/tensor_utils.h"
#include "kernels/sampling/beam_search.h"

namespace warpformer {
namespace ops {
namespace {

using Shape = std::vector<int64_t>;

// dtype, exact shape (described by `layout`, e.g. "[B, W]") and contiguity.
void expect(const at::Tensor& t, c10::ScalarType dtype, const Shape& shape, const char* op,
            const char* arg, const char* layout) {
  TORCH_CHECK(t.defined(), op, ": ", arg, " is an undefined tensor");
  check_dtype(t, dtype, op, arg);
  TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), op, ": ", arg, " must have shape ", layout,
              " = ", at::IntArrayRef(shape), ", got ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), op, ": ", arg, " must be contiguous, got strides ", t.strides());
}

int64_t batch_of(const at::Tensor& input_lengths, const char* op) {
  check_dtype(input_lengths, at::kInt, op, "input_lengths");
  check_dim(input_lengths, 1, op, "input_lengths");
  const int64_t batch = input_lengths.size(0);
  TORCH_CHECK(batch >= 1 && batch <= INT32_MAX / kernels::kMaxBeamWidth, op,
              ": input_lengths must hold between 1 and ", INT32_MAX / kernels::kMaxBeamWidth,
              " batch entries, got ", batch);
  TORCH_CHECK(input_lengths.is_contiguous(), op, ": input_lengths must be contiguous");
  return batch;
}

void check_beam(int64_t beam, const char* op, const char* what) {
  TORCH_CHECK(beam >= 1 && beam <= kernels::kMaxBeamWidth, op, ": ", what, " must be in [1, ",
              kernels::kMaxBeamWidth, "], got ", beam);
}

void check_positive_int(int64_t v, const char* op, const char* arg) {
  TORCH_CHECK(v >= 1 && v <= INT32_MAX, op, ": ", arg, " must be in [1, 2^31), got ", v);
}

void check_devices(const char* op,
                   const std::vector<std::pair<const at::Tensor*, const char*>>& ts) {
  const at::Tensor& ref = *ts.front().first;
  check_cuda(ref, op, ts.front().second);
  for (size_t i = 1; i < ts.size(); ++i) {
    check_cuda(*ts[i].first, op, ts[i].second, ref, ts.front().second);
  }
}

std::vector<int32_t> host_values(const at::Tensor& t) {
  const at::Tensor h = t.to(at::kCPU).contiguous();
  std::vector<int32_t> v(static_cast<size_t>(h.numel()));
  if (!v.empty()) std::memcpy(v.data(), h.data_ptr<int32_t>(), v.size() * sizeof(int32_t));
  return v;
}

template <typename T>
T* mp(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

// The beam state that beam_search_step and beam_search_finalize both read: running sequences and
// their log probs, lengths, and the finished-hypotheses store.
struct BeamStateArgs {
  const at::Tensor& input_lengths;
  const at::Tensor& end_ids;
  const at::Tensor& output_ids;
  const at::Tensor& run_log_probs;
  const at::Tensor& cum_log_probs;
  const at::Tensor& gen_len;
  const at::Tensor& done;
  const at::Tensor& hyp_count;
  const at::Tensor& hyp_score;
  const at::Tensor& hyp_cum;
  const at::Tensor& hyp_len;
  const at::Tensor& hyp_ids;
  const at::Tensor& hyp_log_probs;
  int64_t B = 0, W = 0, stride = 0, max_out = 0;

  // dtype/shape/contiguity of every tensor; sets B, W, ids stride and output length.
  void check(const char* op) {
    B = batch_of(input_lengths, op);
    check_dtype(cum_log_probs, at::kFloat, op, "cum_log_probs");
    check_dim(cum_log_probs, 2, op, "cum_log_probs");
    W = cum_log_probs.size(1);
    check_beam(W, op, "cum_log_probs.shape[1] (the beam width)");
    expect(cum_log_probs, at::kFloat, {B, W}, op, "cum_log_probs", "[B, W]");
    expect(end_ids, at::kInt, {B}, op, "end_ids", "[B]");
    check_dtype(output_ids, at::kInt, op, "output_ids");
    check_dim(output_ids, 2, op, "output_ids");
    stride = output_ids.size(1);
    expect(output_ids, at::kInt, {B * W, stride}, op, "output_ids", "[B * W, ids_stride]");
    check_dtype(run_log_probs, at::kFloat, op, "run_log_probs");
    check_dim(run_log_probs, 2, op, "run_log_probs");
    max_out = run_log_probs.size(1);
    expect(run_log_probs, at::kFloat, {B * W, max_out}, op, "run_log_probs", "[B * W, output_len]");
    TORCH_CHECK(stride >= 1 && stride <= INT32_MAX && max_out >= 1 && max_out <= INT32_MAX, op,
                ": output_ids and run_log_probs must have between 1 and 2^31-1 columns");
    expect(gen_len, at::kInt, {B}, op, "gen_len", "[B]");
    expect(done, at::kInt, {B}, op, "done", "[B]");
    expect(hyp_count, at::kInt, {B}, op, "hyp_count", "[B]");
    expect(hyp_score, at::kFloat, {B, W}, op, "hyp_score", "[B, W]");
    expect(hyp_cum, at::kFloat, {B, W}, op, "hyp_cum", "[B, W]");
    expect(hyp_len, at::kInt, {B, W}, op, "hyp_len", "[B, W]");
    expect(hyp_ids, at::kInt, {B, W, stride}, op, "hyp_ids", "[B, W, ids_stride]");
    expect(hyp_log_probs, at::kFloat, {B, W, max_out}, op, "hyp_log_probs", "[B, W, output_len]");
  }

  // Every tensor on one GPU; `first` (checked first) may name an op-specific input.
  void check_devices_with(const char* op, const at::Tensor* first, const char* first_name) {
    std::vector<std::pair<const at::Tensor*, const char*>> ts;
    if (first != nullptr) ts.emplace_back(first, first_name);
    ts.insert(ts.end(), {{&input_lengths, "input_lengths"},
                         {&end_ids, "end_ids"},
                         {&output_ids, "output_ids"},
                         {&run_log_probs, "run_log_probs"},
                         {&cum_log_probs, "cum_log_probs"},
                         {&gen_len, "gen_len"},
                         {&done, "done"},
                         {&hyp_count, "hyp_count"},
                         {&hyp_score, "hyp_score"},
                         {&hyp_cum, "hyp_cum"},
                         {&hyp_len, "hyp_len"},
                         {&hyp_ids, "hyp_ids"},
                         {&hyp_log_probs, "hyp_log_probs"}});
    check_devices(op, ts);
  }

  // The kernels' view of this state (indir_stride unused by step and finalize).
  void fill(kernels::BeamSearchState* s) const {
    s->batch = static_cast<int>(B);
    s->beam = static_cast<int>(W);
    s->ids_stride = static_cast<int>(stride);
    s->indir_stride = 1;
    s->max_out = static_cast<int>(max_out);
    s->cum_log_probs = mp<float>(cum_log_probs);
    s->output_ids = mp<int32_t>(output_ids);
    s->run_log_probs = mp<float>(run_log_probs);
    s->gen_len = mp<int32_t>(gen_len);
    s->input_lengths = input_lengths.data_ptr<int32_t>();
    s->end_ids = end_ids.data_ptr<int32_t>();
    s->done = mp<int32_t>(done);
    s->hyp_count = mp<int32_t>(hyp_count);
    s->hyp_score = mp<float>(hyp_score);
    s->hyp_cum = mp<float>(hyp_cum);
    s->hyp_len = mp<int32_t>(hyp_len);
    s->hyp_ids = mp<int32_t>(hyp_ids);
    s->hyp_log_probs = mp<float>(hyp_log_probs);
  }
};

}  // namespace

at::Tensor beam_log_softmax(const at::Tensor& logits) {
  const char* op = "warpformer.beam_log_softmax";
  check_floating(logits, op, "logits");
  check_dim(logits, 2, op, "logits");
  TORCH_CHECK(logits.size(1) >= 1 && logits.size(1) <= INT32_MAX && logits.size(0) <= INT32_MAX, op,
              ": logits must be [rows, V] with 1 <= V < 2^31 and rows < 2^31, got shape ",
              logits.sizes());
  check_cuda(logits, op, "logits");
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor x = logits.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::kFloat));
  const int rows = static_cast<int>(x.size(0)), vocab = static_cast<int>(x.size(1));
  WF_DISPATCH_FLOATING(to_dtype(x.scalar_type(), op, "logits"), op, [&] {
    WF_CUDA_CHECK(kernels::launch_log_softmax<scalar_t>(
        mp<float>(out), vocab, reinterpret_cast<const scalar_t*>(x.data_ptr()), vocab, rows, vocab,
        current_stream(x)));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
beam_search_init(const at::Tensor& input_ids, const at::Tensor& input_lengths,
                 const at::Tensor& end_ids, int64_t beam_width, int64_t output_len, int64_t max_seq,
                 bool shared_prompt_slot) {
  const char* op = "warpformer.beam_search_init";
  check_dtype(input_ids, at::kInt, op, "input_ids");
  check_dim(input_ids, 2, op, "input_ids");
  const int64_t B = batch_of(input_lengths, op), S = input_ids.size(1);
  check_size(input_ids, 0, B, op, "input_ids", "batch entries of input_lengths");
  TORCH_CHECK(S >= 1, op, ": input_ids must have at least one column, got shape ",
              input_ids.sizes());
  expect(end_ids, at::kInt, {B}, op, "end_ids", "[B]");
  check_beam(beam_width, op, "beam_width");
  check_positive_int(output_len, op, "output_len");
  TORCH_CHECK(S + output_len <= INT32_MAX, op, ": input_ids.shape[1] + output_len must be < 2^31");
  TORCH_CHECK(max_seq >= S + output_len && max_seq <= INT32_MAX, op,
              ": max_seq (the KV cache length) must be >= input_ids.shape[1] + output_len = ",
              S + output_len, " and < 2^31, got ", max_seq);
  check_devices(
      op, {{&input_ids, "input_ids"}, {&input_lengths, "input_lengths"}, {&end_ids, "end_ids"}});
  const c10::cuda::CUDAGuard guard(input_ids.device());
  const std::vector<int32_t> lens = host_values(input_lengths);
  for (size_t b = 0; b < lens.size(); ++b) {
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= S, op, ": input_lengths[", b, "] = ", lens[b],
                " is outside [1, input_ids.shape[1] = ", S, "]");
  }

  const int64_t W = beam_width, R = B * W, stride = S + output_len;
  const auto i32 = input_ids.options().dtype(at::kInt);
  const auto f32 = input_ids.options().dtype(at::kFloat);
  at::Tensor output_ids = at::empty({R, stride}, i32);
  at::Tensor cache_indir = at::empty({R, max_seq}, i32);
  at::Tensor cum = at::empty({B, W}, f32);
  at::Tensor cur_pos = at::empty({R}, i32), attn_len = at::empty({R}, i32);
  at::Tensor gen_len = at::empty({B}, i32), done = at::empty({B}, i32);
  at::Tensor hyp_count = at::empty({B}, i32);
  at::Tensor hyp_score = at::zeros({B, W}, f32), hyp_cum = at::zeros({B, W}, f32);
  at::Tensor hyp_len = at::zeros({B, W}, i32);
  at::Tensor hyp_ids = at::zeros({B, W, stride}, i32);
  at::Tensor run_lp = at::empty({R, output_len}, f32);
  at::Tensor hyp_lp = at::zeros({B, W, output_len}, f32);
  at::Tensor scratch_i = at::empty({2, B, W}, i32), scratch_f = at::empty({B, W}, f32);
  const at::Tensor ids = input_ids.contiguous();

  kernels::BeamSearchState s{};
  s.batch = static_cast<int>(B);
  s.beam = static_cast<int>(W);
  s.ids_stride = static_cast<int>(stride);
  s.indir_stride = static_cast<int>(max_seq);
  s.max_out = static_cast<int>(output_len);
  s.cum_log_probs = mp<float>(cum);
  s.output_ids = mp<int32_t>(output_ids);
  s.run_log_probs = mp<float>(run_lp);
  s.cache_indir = mp<int32_t>(cache_indir);
  s.cur_pos = mp<int32_t>(cur_pos);
  s.attn_len = mp<int32_t>(attn_len);
  s.gen_len = mp<int32_t>(gen_len);
  s.input_lengths = input_lengths.data_ptr<int32_t>();
  s.end_ids = end_ids.data_ptr<int32_t>();
  s.parents = mp<int32_t>(scratch_i);
  s.tokens = mp<int32_t>(scratch_i) + R;
  s.token_log_probs = mp<float>(scratch_f);
  s.done = mp<int32_t>(done);
  s.hyp_count = mp<int32_t>(hyp_count);
  WF_CUDA_CHECK(kernels::launch_beam_init(s, ids.data_ptr<int32_t>(), S, shared_prompt_slot,
                                          current_stream(ids)));
  return {output_ids, cache_indir, cum,     cur_pos, attn_len, gen_len, done,
          hyp_count,  hyp_score,   hyp_cum, hyp_len, hyp_ids,  run_lp,  hyp_lp};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> beam_search_step(
    const at::Tensor& log_probs, const at::Tensor& input_lengths, const at::Tensor& end_ids,
    const at::Tensor& output_ids, const at::Tensor& run_log_probs, const at::Tensor& gen_len,
    at::Tensor& cum_log_probs, at::Tensor& done, at::Tensor& hyp_count, at::Tensor& hyp_score,
    at::Tensor& hyp_cum, at::Tensor& hyp_len, at::Tensor& hyp_ids, at::Tensor& hyp_log_probs,
    double length_penalty, double diversity_rate) {
  const char* op = "warpformer.beam_search_step";
  BeamStateArgs st{input_lengths, end_ids, output_ids,   run_log_probs, cum_log_probs,
                   gen_len,       done,    hyp_count,    hyp_score,     hyp_cum,
                   hyp_len,       hyp_ids, hyp_log_probs};
  st.check(op);
  const int64_t B = st.B, W = st.W;
  check_dtype(log_probs, at::kFloat, op, "log_probs", "log-softmax in float32");
  check_dim(log_probs, 2, op, "log_probs");
  const int64_t V = log_probs.size(1);
  TORCH_CHECK(log_probs.size(0) == B * W || log_probs.size(0) == B, op,
              ": log_probs must have B * W = ", B * W, " rows (or B = ", B,
              ", one per entry), got shape ", log_probs.sizes());
  TORCH_CHECK(V >= 2 && W * V + 2 * W * W < INT32_MAX, op,
              ": log_probs.shape[1] (the vocabulary) must be >= 2 and beam * vocab < 2^31, got ",
              V);
  TORCH_CHECK(std::isfinite(length_penalty), op, ": length_penalty must be finite, got ",
              length_penalty);
  TORCH_CHECK(std::isfinite(diversity_rate), op, ": diversity_rate must be finite, got ",
              diversity_rate);
  st.check_devices_with(op, &log_probs, "log_probs");

  const c10::cuda::CUDAGuard guard(log_probs.device());
  const at::Tensor lp = log_probs.contiguous();
  const auto i32 = lp.options().dtype(at::kInt);
  at::Tensor parents = at::empty({B, W}, i32), tokens = at::empty({B, W}, i32);
  at::Tensor token_lp = at::empty({B, W}, lp.options());
  const size_t ws_bytes = kernels::beam_search_workspace_bytes(
      static_cast<int>(B), static_cast<int>(W), static_cast<int>(V));
  at::Tensor ws = at::empty({static_cast<int64_t>(ws_bytes)}, lp.options().dtype(at::kByte));

  kernels::BeamStepParams p{};
  st.fill(&p.s);
  p.s.parents = mp<int32_t>(parents);
  p.s.tokens = mp<int32_t>(tokens);
  p.s.token_log_probs = mp<float>(token_lp);
  p.log_probs = lp.data_ptr<float>();
  p.log_probs_stride = V;
  p.shared_rows = lp.size(0) != B * W;
  p.vocab = static_cast<int>(V);
  p.length_penalty = length_penalty;
  p.diversity_rate = static_cast<float>(diversity_rate);
  p.workspace = ws_bytes > 0 ? ws.data_ptr() : nullptr;
  p.workspace_bytes = ws_bytes;
  WF_CUDA_CHECK(kernels::launch_beam_step(p, current_stream(lp)));
  return {parents, tokens, token_lp};
}

void beam_search_update(const at::Tensor& parents, const at::Tensor& tokens,
                        const at::Tensor& token_log_probs, const at::Tensor& input_lengths,
                        at::Tensor& gen_len, at::Tensor& output_ids, at::Tensor& cache_indir,
                        at::Tensor& run_log_probs, at::Tensor& cur_pos, at::Tensor& attn_len) {
  const char* op = "warpformer.beam_search_update";
  const int64_t B = batch_of(input_lengths, op);
  check_dtype(parents, at::kInt, op, "parents");
  check_dim(parents, 2, op, "parents");
  const int64_t W = parents.size(1);
  check_beam(W, op, "parents.shape[1] (the beam width)");
  expect(parents, at::kInt, {B, W}, op, "parents", "[B, W]");
  expect(tokens, at::kInt, {B, W}, op, "tokens", "[B, W]");
  expect(token_log_probs, at::kFloat, {B, W}, op, "token_log_probs", "[B, W]");
  expect(gen_len, at::kInt, {B}, op, "gen_len", "[B]");
  check_dtype(output_ids, at::kInt, op, "output_ids");
  check_dim(output_ids, 2, op, "output_ids");
  expect(output_ids, at::kInt, {B * W, output_ids.size(1)}, op, "output_ids",
         "[B * W, ids_stride]");
  check_dtype(cache_indir, at::kInt, op, "cache_indir");
  check_dim(cache_indir, 2, op, "cache_indir");
  expect(cache_indir, at::kInt, {B * W, cache_indir.size(1)}, op, "cache_indir",
         "[B * W, max_seq]");
  check_dtype(run_log_probs, at::kFloat, op, "run_log_probs");
  check_dim(run_log_probs, 2, op, "run_log_probs");
  expect(run_log_probs, at::kFloat, {B * W, run_log_probs.size(1)}, op, "run_log_probs",
         "[B * W, output_len]");
  TORCH_CHECK(output_ids.size(1) >= 1 && output_ids.size(1) <= INT32_MAX &&
                  cache_indir.size(1) >= 1 && cache_indir.size(1) <= INT32_MAX &&
                  run_log_probs.size(1) >= 1 && run_log_probs.size(1) <= INT32_MAX,
              op,
              ": output_ids, cache_indir and run_log_probs must have between 1 and 2^31-1 "
              "columns");
  expect(cur_pos, at::kInt, {B * W}, op, "cur_pos", "[B * W]");
  expect(attn_len, at::kInt, {B * W}, op, "attn_len", "[B * W]");
  check_devices(op, {{&parents, "parents"},
                     {&tokens, "tokens"},
                     {&token_log_probs, "token_log_probs"},
                     {&input_lengths, "input_lengths"},
                     {&gen_len, "gen_len"},
                     {&output_ids, "output_ids"},
                     {&cache_indir, "cache_indir"},
                     {&run_log_probs, "run_log_probs"},
                     {&cur_pos, "cur_pos"},
                     {&attn_len, "attn_len"}});
  const c10::cuda::CUDAGuard guard(parents.device());
  const std::vector<int32_t> par = host_values(parents);
  for (size_t i = 0; i < par.size(); ++i) {
    TORCH_CHECK(par[i] >= 0 && par[i] < W, op, ": parents[", i / W, ", ", i % W, "] = ", par[i],
                " is outside [0, beam width = ", W, ")");
  }

  kernels::BeamSearchState s{};
  s.batch = static_cast<int>(B);
  s.beam = static_cast<int>(W);
  s.ids_stride = static_cast<int>(output_ids.size(1));
  s.indir_stride = static_cast<int>(cache_indir.size(1));
  s.max_out = static_cast<int>(run_log_probs.size(1));
  s.output_ids = mp<int32_t>(output_ids);
  s.run_log_probs = mp<float>(run_log_probs);
  s.cache_indir = mp<int32_t>(cache_indir);
  s.cur_pos = mp<int32_t>(cur_pos);
  s.attn_len = mp<int32_t>(attn_len);
  s.gen_len = mp<int32_t>(gen_len);
  s.input_lengths = input_lengths.data_ptr<int32_t>();
  s.parents = mp<int32_t>(parents);
  s.tokens = mp<int32_t>(tokens);
  s.token_log_probs = mp<float>(token_log_probs);
  WF_CUDA_CHECK(kernels::launch_beam_update(s, current_stream(parents)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> beam_search_finalize(
    const at::Tensor& input_lengths, const at::Tensor& end_ids, const at::Tensor& output_ids,
    const at::Tensor& run_log_probs, const at::Tensor& cum_log_probs, const at::Tensor& gen_len,
    const at::Tensor& done, const at::Tensor& hyp_count, const at::Tensor& hyp_score,
    const at::Tensor& hyp_cum, const at::Tensor& hyp_len, const at::Tensor& hyp_ids,
    const at::Tensor& hyp_log_probs, double length_penalty, int64_t out_stride) {
  const char* op = "warpformer.beam_search_finalize";
  BeamStateArgs st{input_lengths, end_ids, output_ids,   run_log_probs, cum_log_probs,
                   gen_len,       done,    hyp_count,    hyp_score,     hyp_cum,
                   hyp_len,       hyp_ids, hyp_log_probs};
  st.check(op);
  const int64_t B = st.B, W = st.W;
  TORCH_CHECK(std::isfinite(length_penalty), op, ": length_penalty must be finite, got ",
              length_penalty);
  const int64_t out_cols = out_stride < 0 ? st.stride : out_stride;
  TORCH_CHECK(out_cols >= 1 && out_cols <= INT32_MAX, op,
              ": out_stride must be -1 (output_ids.shape[1]) or in [1, 2^31), got ", out_stride);
  st.check_devices_with(op, nullptr, nullptr);
  const c10::cuda::CUDAGuard guard(output_ids.device());
  const auto i32 = output_ids.options();
  const auto f32 = output_ids.options().dtype(at::kFloat);
  at::Tensor out_ids = at::empty({B, W, out_cols}, i32);
  at::Tensor seq_len = at::empty({B, W}, i32);
  at::Tensor out_cum = at::empty({B, W}, f32), scores = at::empty({B, W}, f32);
  at::Tensor out_lp = at::empty({B, W, st.max_out}, f32);

  kernels::BeamFinalizeParams p{};
  st.fill(&p.s);
  p.length_penalty = length_penalty;
  p.output_ids = mp<int32_t>(out_ids);
  p.out_stride = static_cast<int>(out_cols);
  p.sequence_lengths = mp<int32_t>(seq_len);
  p.cum_log_probs = mp<float>(out_cum);
  p.scores = mp<float>(scores);
  p.output_log_probs = mp<float>(out_lp);
  WF_CUDA_CHECK(kernels::launch_beam_finalize(p, current_stream(output_ids)));
  return {out_ids, seq_len, out_cum, scores, out_lp};
}

}  // namespace ops
}  // namespace warpformer
