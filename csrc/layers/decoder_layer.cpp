// The GPT-family decoder layer (see decoder_layer.h). The three residual forms:
//
//   pre-norm, sequential (GPT-2, OPT, BLOOM, NeoX without parallel residual):
//     n = ln1(x) [fused earlier];  x += attn(n) @ Wo + bo;  y = ln2(x) [fused];
//     x += mlp(y) + b2;  n = next(x) [fused]
//   pre-norm, parallel (GPT-J with one shared norm, NeoX with two):
//     p = attn(n) @ Wo + mlp(n or ln2(x)) @ W2 [one all-reduce];  x += p + bo + b2;  n = next(x)
//   post-norm (OPT-350m):
//     y = ln1(x + attn(x) @ Wo + bo);  x = ln2(y + mlp(y) + b2)
#include "csrc/layers/decoder_layer.h"

#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "csrc/core/check.h"
#include "kernels/attention/attention.h"

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
void attention(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& b,
               int64_t tokens, const AttentionInputs& ai) {
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

// out[tokens, n] = in @ W (+ beta * out), summed over the tensor-parallel group, then `nm` over
// its rows (one norms kernel with the residual and bias adds).
template <typename T>
void product_then_norm(const LayerContext& lc, const void* in, const void* weight, void* out,
                       int64_t tokens, int64_t n, int64_t k, float beta, const NormSpec& nm) {
  lc.gemm->run(lc.dtype, in, weight, nullptr, out, tokens, n, k, GemmEpilogue::kNone, beta);
  all_reduce_if_parallel(lc.comm, out, tokens * n, lc.dtype, lc.ctx->stream());
  run_norm<T>(lc, nm.kind, nm.gamma, nm.beta, out, nm.residual, nm.residual_out, nm.bias, nm.out,
              tokens, n);
}

// The MLP: f = act(in @ W1 + b1) (Gemm::run_act fuses the bias and the activation into the
// product where it can — GEMV path, cuBLASLt's ReLU epilogue — and otherwise runs warpformer's
// bias/activation kernel, whose arithmetic matches the reference exactly); then
// out = f @ W2 (+ beta * out) followed by the norm `nm`.
template <typename T>
void mlp_then_norm(const LayerContext& lc, const LayerWeights& w, const void* in, void* f,
                   void* out, int64_t tokens, float beta, const NormSpec& nm) {
  const gpt::GptConfig& c = *lc.cfg;
  const int64_t h = c.hidden(), li = c.local_inter();
  lc.gemm->run_act(lc.dtype, in, w.fc1_w, w.fc1_b, f, tokens, li, h, c.activation);
  product_then_norm<T>(lc, f, w.fc2_w, out, tokens, h, li, beta, nm);
}

template <typename T>
void layer_forward(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& b,
                   int64_t tokens, const AttentionInputs& ai, const NextNorm& next) {
  const gpt::GptConfig& c = *lc.cfg;
  const int64_t h = c.hidden(), lh = c.local_hidden();
  using kernels::NormKind;
  const NormKind ln = NormKind::kLayerNorm;
  void* next_out = next.kind == NormKind::kAddOnly ? b.x : b.n;

  // Attention block. Post-norm layers attend over x itself.
  const void* attn_in = c.pre_layernorm ? b.n : b.x;
  lc.gemm->run(lc.dtype, attn_in, w.qkv_w, nullptr, b.qkv, tokens, 3 * lh, h);
  attention<T>(lc, w, b, tokens, ai);

  if (!c.pre_layernorm) {  // post-norm: y = ln1(x + p + bo); x = ln2(y + mlp(y) + b2)
    product_then_norm<T>(lc, b.a, w.dense_w, b.p, tokens, h, lh, 0.f,
                         NormSpec{ln, w.ln1_w, w.ln1_b, w.dense_b, b.x, b.x, b.y});
    mlp_then_norm<T>(lc, w, b.y, b.f, b.o, tokens, 0.f,
                     NormSpec{ln, w.ln2_w, w.ln2_b, w.fc2_b, b.y, b.y, b.x});
    if (next.kind != NormKind::kAddOnly) {
      run_norm<T>(lc, next.kind, next.gamma, next.beta, b.x, nullptr, nullptr, nullptr, b.n,
                  tokens, h);
    }
    return;
  }

  if (c.parallel_residual) {  // p = attn @ Wo + mlp(.) @ W2 [one all-reduce]; x += p + bo + b2
    lc.gemm->run(lc.dtype, b.a, w.dense_w, nullptr, b.p, tokens, h, lh);
    const void* mlp_in = b.n;
    if (!c.parallel_shared_layernorm) {
      run_norm<T>(lc, ln, w.ln2_w, w.ln2_b, b.x, nullptr, nullptr, nullptr, b.y, tokens, h);
      mlp_in = b.y;
    }
    mlp_then_norm<T>(lc, w, mlp_in, b.f, b.p, tokens, 1.f,
                     NormSpec{next.kind, next.gamma, next.beta, w.residual_b, b.x, b.x,
                               next_out});
    return;
  }

  // pre-norm, sequential: x += p + bo; y = ln2(x); x += mlp(y) + b2; n = next(x)
  product_then_norm<T>(lc, b.a, w.dense_w, b.p, tokens, h, lh, 0.f,
                       NormSpec{ln, w.ln2_w, w.ln2_b, w.dense_b, b.x, b.x, b.y});
  mlp_then_norm<T>(lc, w, b.y, b.f, b.o, tokens, 0.f,
                   NormSpec{next.kind, next.gamma, next.beta, w.fc2_b, b.x, b.x, next_out});
}

}  // namespace

void decoder_layer_forward(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& bufs,
                           int64_t tokens, const AttentionInputs& attn, const NextNorm& next) {
  if (tokens == 0) return;
  WF_DISPATCH_FLOATING(lc.dtype, "decoder_layer_forward",
                       [&] { layer_forward<scalar_t>(lc, w, bufs, tokens, attn, next); });
}

void apply_norm(const LayerContext& lc, kernels::NormKind kind, const void* gamma,
                const void* beta, const void* x, void* out, int64_t rows, int64_t hidden) {
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
