// The GPT-family decoder layer (see decoder_layer.h). The three residual forms:
//
//   pre-norm, sequential (GPT-2, OPT, BLOOM, NeoX without parallel residual):
//     x += pending;  qkv = ln1(x) @ Wqkv;  ...;  p = attn @ Wo;
//     x += p + bo;   f = act(ln2(x) @ W1 + b1);  pending = f @ W2, b2
//   pre-norm, parallel (GPT-J with one shared norm, NeoX with two):
//     x += pending;  n = ln1(x);  p = attn(n) @ Wo + mlp(n or ln2(x)) @ W2 [one all-reduce];
//     pending = p, bo + b2
//     At decode sizes (up to kGemvMaxRows rows, with bufs.fj) [attn | f] @ [Wo; W2] is one GEMV
//     launch, and the QKV and MLP-in products are one launch before the attention, the output
//     product's MLP part running beside the attention (where the GEMV cannot pair them, the
//     MLP-in product runs beside the attention kernel instead).
//   post-norm (OPT-350m):
//     y = ln1(x + attn(x) @ Wo + bo);  x = ln2(y + mlp(y) + b2)
//
// In the pre-norm forms every "x += ...; normalise" is done by the product that reads the
// normalised rows (Gemm::run_normed: inside the GEMV at decode sizes, else a norms kernel
// first), and a layer's last add is left pending for the next layer's QKV product; the stream
// is materialised only after the last layer (with the final norm). Past kGemvMaxRows rows the
// adds are applied in place in x (bufs.y holds only kGemvMaxRows rows for pre-norm models).
#include "csrc/layers/decoder_layer.h"

#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "csrc/core/check.h"
#include "kernels/attention/attention.h"
#include "kernels/gemv.h"

namespace warpformer {
namespace layers {
namespace {

template <typename T>
void run_norm(const LayerContext& lc, kernels::NormKind kind, const void* gamma, const void* beta,
              const void* input, const void* residual, void* residual_out, const void* bias,
              void* out, int64_t rows, int64_t hidden) {
  kernels::NormParams<T> p{};
  p.out = static_cast<T*>(out);
  p.residual_out = static_cast<T*>(residual_out);
  p.input = static_cast<const T*>(input);
  p.residual = static_cast<const T*>(residual);
  p.input_bias = static_cast<const T*>(bias);
  p.gamma = static_cast<const T*>(gamma);
  p.beta = static_cast<const T*>(beta);
  p.rows = rows;
  p.hidden = static_cast<int>(hidden);
  p.eps = static_cast<float>(lc.cfg->layernorm_eps);
  p.kind = kind;
  WF_CUDA_CHECK(kernels::launch_norm(p, lc.ctx->stream()));
}

template <typename T>
kernels::DecodeAttentionParams<T> decode_params(const LayerBuffers& b, int64_t tokens, int heads,
                                                int hd, const AttentionInputs& ai, float scale) {
  kernels::DecodeAttentionParams<T> p{};
  p.out = static_cast<T*>(b.a);
  p.k_cache = static_cast<const T*>(ai.k_cache);
  p.v_cache = static_cast<const T*>(ai.v_cache);
  p.row_slot = ai.row_slot;
  p.lengths = ai.lengths;
  p.cache_indir = ai.cache_indir;
  p.alibi_slopes = ai.alibi_slopes;
  p.workspace = ai.workspace;
  p.workspace_bytes = ai.workspace_bytes;
  p.rows = static_cast<int>(tokens);
  p.heads = heads;
  p.head_dim = hd;
  p.num_slots = ai.num_slots;
  p.max_seq = ai.max_seq;
  p.scale = scale;
  return p;
}

template <typename T>
void attention(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& b, int64_t tokens,
               const AttentionInputs& ai) {
  const gpt::GptConfig& c = *lc.cfg;
  const int heads = static_cast<int>(c.local_heads());
  const int hd = static_cast<int>(c.size_per_head);
  cudaStream_t stream = lc.ctx->stream();

  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  if (ai.decode && ai.fused_prep) {  // one kernel: QKV preparation + attention
    kernels::DecodeAttentionFusedParams<T> p{};
    static_cast<kernels::DecodeAttentionParams<T>&>(p) =
        decode_params<T>(b, tokens, heads, hd, ai, scale);
    p.qkv = static_cast<const T*>(b.qkv);
    p.qkv_bias = static_cast<const T*>(w.qkv_b);
    p.rotary_dim = static_cast<int>(c.rotary_embedding_dim);
    p.rotary_style = c.rotary_style;
    p.rotary_inv_freq = ai.rotary_inv_freq;
    WF_CUDA_CHECK(kernels::launch_decode_attention_fused(p, stream));
    return;
  }

  kernels::QkvPrepParams<T> qp{};
  qp.q_out = static_cast<T*>(b.q);
  qp.k_cache = static_cast<T*>(ai.k_cache);
  qp.v_cache = static_cast<T*>(ai.v_cache);
  qp.qkv = static_cast<const T*>(b.qkv);
  qp.bias = static_cast<const T*>(w.qkv_b);
  qp.token_slot = ai.token_slot;
  qp.token_pos = ai.token_pos;
  qp.tokens = static_cast<int>(tokens);
  qp.heads = heads;
  qp.head_dim = hd;
  qp.num_slots = ai.num_slots;
  qp.max_seq = ai.max_seq;
  qp.rotary_dim = static_cast<int>(c.rotary_embedding_dim);
  qp.rotary_style = c.rotary_style;
  qp.rotary_base = static_cast<float>(c.rotary_base);
  WF_CUDA_CHECK(kernels::launch_qkv_prep(qp, stream));

  if (!ai.decode) {
    kernels::ContextAttentionParams<T> p{};
    p.out = static_cast<T*>(b.a);
    p.q = static_cast<const T*>(b.q);
    p.k_cache = static_cast<const T*>(ai.k_cache);
    p.v_cache = static_cast<const T*>(ai.v_cache);
    p.cu_seqlens = ai.cu_seqlens;
    p.seq_slot = ai.seq_slot;
    p.alibi_slopes = ai.alibi_slopes;
    p.batch = ai.batch;
    p.heads = heads;
    p.head_dim = hd;
    p.num_slots = ai.num_slots;
    p.max_seq = ai.max_seq;
    p.max_seqlen = ai.max_seqlen;
    p.scale = scale;
    WF_CUDA_CHECK(kernels::launch_context_attention(p, stream));
  } else {
    kernels::DecodeAttentionParams<T> p = decode_params<T>(b, tokens, heads, hd, ai, scale);
    p.q = static_cast<const T*>(b.q);
    WF_CUDA_CHECK(kernels::launch_decode_attention(p, stream));
  }
}

// The norm that follows a row-parallel product: x = product (+ bias) (+ residual); out = norm(x);
// residual_out = x when given.
struct NormSpec {
  kernels::NormKind kind;
  const void* gamma;
  const void* beta;
  const void* bias;
  const void* residual;
  void* residual_out;
  void* out;
};

// out[tokens, n] = in @ W (+ beta * out), summed over the tensor-parallel group.
void product(const LayerContext& lc, const void* in, const void* weight, void* out, int64_t tokens,
             int64_t n, int64_t k, float beta = 0.f) {
  lc.gemm->run(lc.dtype, in, weight, nullptr, out, tokens, n, k, GemmEpilogue::kNone, beta);
  all_reduce_if_parallel(lc.comm, out, tokens * n, lc.dtype, lc.ctx->stream());
}

// product(), then `nm` over its rows (one norms kernel with the residual and bias adds).
template <typename T>
void product_then_norm(const LayerContext& lc, const void* in, const void* weight, void* out,
                       int64_t tokens, int64_t n, int64_t k, const NormSpec& nm) {
  product(lc, in, weight, out, tokens, n, k);
  run_norm<T>(lc, nm.kind, nm.gamma, nm.beta, out, nm.residual, nm.residual_out, nm.bias, nm.out,
              tokens, n);
}

// The residual-stream buffer that is not `x` (the two alternate, see ResidualStream).
void* other_stream_buffer(const LayerBuffers& b, const void* x) { return x == b.x ? b.y : b.x; }

// The input of a pre-norm layer's product of norm(stream): the stream's pending adds are
// applied on the way into the other stream buffer (residual_out) at up to kGemvMaxRows rows,
// where the normalising GEMV may run (its outputs must not alias its inputs), and in place
// past them, where the norms kernel runs (it reads each row before writing it). `normed`
// receives norm(stream) (kept when keep_normed, else scratch).
GemmNormedInput stream_input(const LayerContext& lc, const ResidualStream& s, const LayerBuffers& b,
                             int64_t tokens, const void* gamma, const void* beta, void* normed,
                             bool keep_normed) {
  GemmNormedInput in;
  in.kind = kernels::NormKind::kLayerNorm;
  in.input = s.delta != nullptr ? s.delta : s.x;
  in.residual = s.delta != nullptr ? s.x : nullptr;
  in.input_bias = s.bias;
  in.gamma = gamma;
  in.beta = beta;
  in.eps = static_cast<float>(lc.cfg->layernorm_eps);
  const bool adds = s.delta != nullptr || s.bias != nullptr;
  void* const stream_out = tokens > kernels::kGemvMaxRows ? s.x : other_stream_buffer(b, s.x);
  TORCH_CHECK(!adds || stream_out != b.y || tokens <= b.y_rows,
              "decoder layer: the stream "
              "buffer y holds ",
              b.y_rows, " rows, not the ", tokens, " of this call");
  in.residual_out = adds ? stream_out : nullptr;
  in.out = normed;
  in.keep_out = keep_normed;
  return in;
}

// After a product of stream_input(s): the stream is materialised where it was written.
void stream_written(const GemmNormedInput& in, ResidualStream* s) {
  if (in.residual_out != nullptr) *s = ResidualStream{in.residual_out, nullptr, nullptr};
}

// out = act(norm(stream) @ W + bias) for a pre-norm layer (stream_input). beside: see
// Gemm::run_normed.
void normed_product(const LayerContext& lc, ResidualStream* s, const LayerBuffers& b,
                    const void* gamma, const void* beta, void* normed, bool keep_normed,
                    const void* weight, const void* bias, void* out, int64_t tokens, int64_t n,
                    kernels::Activation act, bool beside = false) {
  const GemmNormedInput in = stream_input(lc, *s, b, tokens, gamma, beta, normed, keep_normed);
  lc.gemm->run_normed(lc.dtype, in, weight, bias, out, tokens, n, lc.cfg->hidden(), act, beside);
  stream_written(in, s);
}

// The end of a pre-norm layer: the stream is x + delta + bias. Left pending when the next layer
// takes it (next.defer); otherwise one norms kernel materialises it into bufs.x and next(x)
// into bufs.n (kAddOnly: bufs.x only).
template <typename T>
void finish_stream(const LayerContext& lc, const LayerBuffers& b, int64_t tokens,
                   const NextNorm& next, const void* delta, const void* bias, ResidualStream* s) {
  s->delta = delta;
  s->bias = bias;
  if (next.defer) return;
  void* out = next.kind == kernels::NormKind::kAddOnly ? b.x : b.n;
  run_norm<T>(lc, next.kind, next.gamma, next.beta, delta, s->x, b.x, bias, out, tokens,
              lc.cfg->hidden());
  *s = ResidualStream{b.x, nullptr, nullptr};
}

// The QKV and MLP-in products of a parallel-residual layer's decode step as one GEMV launch
// (Gemm::run_normed_pair): [qkv | fj] = [ln1(x) @ Wqkv | act(ln(x) @ W1 + b1)], ln being
// ln1 (shared) or ln2, the stream's pending adds applied on the way. False (nothing launched)
// where the GEMV cannot pair the two products.
bool paired_products(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& b,
                     int64_t tokens, ResidualStream* s) {
  const gpt::GptConfig& c = *lc.cfg;
  const bool shared_norm = c.parallel_shared_layernorm;
  const GemmNormedInput in = stream_input(lc, *s, b, tokens, w.ln1_w, w.ln1_b, b.n, false);
  GemmProduct qkv;
  qkv.weight = w.qkv_w;
  qkv.out = b.qkv;
  qkv.n = 3 * c.local_hidden();
  GemmProduct mlp;
  mlp.weight = w.fc1_w;
  mlp.bias = w.fc1_b;
  mlp.out = b.fj;
  mlp.n = c.local_inter();
  mlp.act = c.activation;
  if (!lc.gemm->run_normed_pair(lc.dtype, in, qkv, mlp, shared_norm ? nullptr : w.ln2_w,
                                shared_norm ? nullptr : w.ln2_b, tokens, c.hidden())) {
    return false;
  }
  stream_written(in, s);
  return true;
}

// The post-norm layer (OPT-350m): y = ln1(x + attn(x) @ Wo + bo); x = ln2(y + mlp(y) + b2);
// then n = next(x). The stream is always materialised in bufs.x.
template <typename T>
void post_norm_layer(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& b,
                     int64_t tokens, const AttentionInputs& ai, const NextNorm& next) {
  const gpt::GptConfig& c = *lc.cfg;
  const int64_t h = c.hidden(), lh = c.local_hidden(), li = c.local_inter();
  const kernels::NormKind ln = kernels::NormKind::kLayerNorm;
  lc.gemm->run(lc.dtype, b.x, w.qkv_w, nullptr, b.qkv, tokens, 3 * lh, h);
  attention<T>(lc, w, b, tokens, ai);
  product_then_norm<T>(lc, b.a, w.dense_w, b.p, tokens, h, lh,
                       NormSpec{ln, w.ln1_w, w.ln1_b, w.dense_b, b.x, b.x, b.y});
  lc.gemm->run_act(lc.dtype, b.y, w.fc1_w, w.fc1_b, b.f, tokens, li, h, c.activation);
  product_then_norm<T>(lc, b.f, w.fc2_w, b.o, tokens, h, li,
                       NormSpec{ln, w.ln2_w, w.ln2_b, w.fc2_b, b.y, b.y, b.x});
  if (next.kind != kernels::NormKind::kAddOnly) {
    run_norm<T>(lc, next.kind, next.gamma, next.beta, b.x, nullptr, nullptr, nullptr, b.n, tokens,
                h);
  }
}

template <typename T>
void layer_forward(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& b,
                   int64_t tokens, const AttentionInputs& ai, const NextNorm& next,
                   ResidualStream* s) {
  const gpt::GptConfig& c = *lc.cfg;
  if (!c.pre_layernorm) {
    TORCH_CHECK(s->x == b.x && s->delta == nullptr && s->bias == nullptr && !next.defer,
                "decoder layer: a post-norm layer takes and leaves the stream in bufs.x");
    post_norm_layer<T>(lc, w, b, tokens, ai, next);
    return;
  }
  const int64_t h = c.hidden(), lh = c.local_hidden(), li = c.local_inter();
  using kernels::Activation;
  const bool decode_sized =
      c.parallel_residual && b.fj != nullptr && tokens <= kernels::kGemvMaxRows;

  // Attention block: qkv = ln1(x) @ Wqkv, the pending adds applied on the way; with paired
  // products the MLP-in product runs in the same launch. The parallel form with one shared norm
  // otherwise keeps n = ln1(x) for its MLP.
  const bool paired = decode_sized && paired_products(lc, w, b, tokens, s);
  const bool shared_norm = c.parallel_residual && c.parallel_shared_layernorm;
  if (!paired) {
    normed_product(lc, s, b, w.ln1_w, w.ln1_b, b.n, shared_norm, w.qkv_w, nullptr, b.qkv, tokens,
                   3 * lh, Activation::kIdentity);
  }
  attention<T>(lc, w, b, tokens, ai);

  if (c.parallel_residual) {  // p = attn @ Wo + mlp(.) @ W2 [one all-reduce]; x += p + bo + b2
    // Decode-sized: the MLP-in product has run with the QKV product
    // (paired), or runs beside the attention (it reads neither qkv nor a, and writes bufs.fj,
    // apart from both); then attention-out and MLP-out are one product, which when paired
    // streams W2 beside the attention (second_ready). Otherwise: attention-out, MLP-in, MLP-out
    // accumulating.
    const bool beside = decode_sized;
    void* const f = beside ? b.fj : b.f;
    if (!beside) lc.gemm->run(lc.dtype, b.a, w.dense_w, nullptr, b.p, tokens, h, lh);
    if (paired) {
      // the MLP hidden is in bufs.fj already
    } else if (shared_norm) {
      lc.gemm->run_act(lc.dtype, b.n, w.fc1_w, w.fc1_b, f, tokens, li, h, c.activation, 0.f,
                       beside);
    } else {  // ln2 of the stream (materialised by the QKV product); n is free as scratch
      normed_product(lc, s, b, w.ln2_w, w.ln2_b, b.n, false, w.fc1_w, w.fc1_b, f, tokens, li,
                     c.activation, beside);
    }
    if (beside) {
      lc.gemm->run_sum(lc.dtype, b.a, w.dense_w, lh, f, w.fc2_w, li, b.p, tokens, h, paired);
      all_reduce_if_parallel(lc.comm, b.p, tokens * h, lc.dtype, lc.ctx->stream());
    } else {
      product(lc, f, w.fc2_w, b.p, tokens, h, li, 1.f);
    }
    finish_stream<T>(lc, b, tokens, next, b.p, w.residual_b, s);
    return;
  }

  // Sequential: x += p + bo; f = act(ln2(x) @ W1 + b1); pending = f @ W2, b2.
  product(lc, b.a, w.dense_w, b.p, tokens, h, lh);
  s->delta = b.p;
  s->bias = w.dense_b;
  normed_product(lc, s, b, w.ln2_w, w.ln2_b, b.n, false, w.fc1_w, w.fc1_b, b.f, tokens, li,
                 c.activation);
  product(lc, b.f, w.fc2_w, b.o, tokens, h, li);
  finish_stream<T>(lc, b, tokens, next, b.o, w.fc2_b, s);
}

}  // namespace

void decoder_layer_forward(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& bufs,
                           int64_t tokens, const AttentionInputs& attn, const NextNorm& next,
                           ResidualStream* stream) {
  if (tokens == 0) return;
  WF_DISPATCH_FLOATING(lc.dtype, "decoder_layer_forward",
                       [&] { layer_forward<scalar_t>(lc, w, bufs, tokens, attn, next, stream); });
}

void apply_norm(const LayerContext& lc, kernels::NormKind kind, const void* gamma, const void* beta,
                const void* x, void* out, int64_t rows, int64_t hidden) {
  if (rows == 0) return;
  WF_DISPATCH_FLOATING(lc.dtype, "apply_norm", [&] {
    run_norm<scalar_t>(lc, kind, gamma, beta, x, nullptr, nullptr, nullptr, out, rows, hidden);
  });
}

void add_and_norm(const LayerContext& lc, const void* delta, void* x, const void* bias,
                  const NextNorm& next, void* out, int64_t rows, int64_t hidden) {
  if (rows == 0) return;
  WF_DISPATCH_FLOATING(lc.dtype, "add_and_norm", [&] {
    run_norm<scalar_t>(lc, next.kind, next.gamma, next.beta, delta, x, x, bias,
                       out != nullptr ? out : x, rows, hidden);
  });
}

}  // namespace layers
}  // namespace warpformer
