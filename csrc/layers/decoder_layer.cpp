// The decoder block (see decoder_layer.h). The three residual forms:
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
// A cross-attention block (an encoder-decoder's decoder) adds, after the self-attention's
// residual add, x += cross(lnc(x)) @ Wco (pre-norm) or z = lnc(y + cross(y) @ Wco + bco) with the
// MLP reading z (post-norm); its queries attend to the encoder memory (AttentionInputs::cross).
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

#include <algorithm>
#include <cmath>

#include "csrc/core/check.h"
#include "csrc/core/dispatch.h"
#include "kernels/activations.h"
#include "kernels/attention/attention.h"
#include "kernels/gemv.h"

namespace warpformer {
namespace layers {
namespace {

// The norm that follows a row-parallel product: x = product (+ bias) (+ residual); out = norm(x);
// residual_out = x when given.
struct NormSpec {
  kernels::NormKind kind;
  NormWeights w;
  const void* bias;
  const void* residual;
  void* residual_out;
  void* out;
};

// The Linear without its bias: products whose bias a later residual add or norm applies.
Linear without_bias(Linear l) {
  l.bias = nullptr;
  return l;
}

// out = act(in @ W + bias) (+ beta * out) on this rank (layers::linear_forward, the block's
// dequantizing scratch at hand).
void run_linear(const LayerContext& lc, const LayerBuffers& b, const Linear& w, const void* in,
                void* out, int64_t tokens, kernels::Activation act = kernels::Activation::kIdentity,
                float beta = 0.f) {
  linear_forward(*lc.gemm, lc.dtype, w, in, out, tokens, act, beta, b.wq);
}

// out[tokens, n] = in @ W (+ beta * out) without W's bias, summed over the tensor-parallel group.
void product(const LayerContext& lc, const LayerBuffers& b, const void* in, const Linear& w,
             void* out, int64_t tokens, float beta = 0.f) {
  run_linear(lc, b, without_bias(w), in, out, tokens, kernels::Activation::kIdentity, beta);
  all_reduce_if_parallel(lc.comm, out, tokens * w.out, lc.dtype, lc.ctx->stream());
}

// product(), then `nm` over its rows (one norms kernel with the residual and bias adds).
void product_then_norm(const LayerContext& lc, const LayerBuffers& b, const void* in,
                       const Linear& w, void* out, int64_t tokens, const NormSpec& nm) {
  product(lc, b, in, w, out, tokens);
  norm_rows(lc, nm.kind, nm.w, out, nm.residual, nm.residual_out, nm.bias, nm.out, tokens, w.out);
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
  in.kind = lc.spec->norm;
  in.input = s.delta != nullptr ? s.delta : s.x;
  in.residual = s.delta != nullptr ? s.x : nullptr;
  in.input_bias = s.bias;
  in.gamma = gamma;
  in.beta = beta;
  in.eps = lc.spec->norm_eps;
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
// A quantized weight takes the norms kernel and then its product (the normalising GEMV streams
// dense weights only).
void normed_product(const LayerContext& lc, ResidualStream* s, const LayerBuffers& b,
                    const void* gamma, const void* beta, void* normed, bool keep_normed,
                    const Linear& w, void* out, int64_t tokens, kernels::Activation act,
                    bool beside = false) {
  const GemmNormedInput in = stream_input(lc, *s, b, tokens, gamma, beta, normed, keep_normed);
  if (w.quantized()) {
    norm_rows(lc, in.kind, NormWeights{gamma, beta}, in.input, in.residual, in.residual_out,
              in.input_bias, normed, tokens, lc.spec->hidden);
    run_linear(lc, b, w, normed, out, tokens, act);
  } else {
    lc.gemm->run_normed(lc.dtype, in, w.weight, w.bias, out, tokens, w.out, lc.spec->hidden, act,
                        beside);
  }
  stream_written(in, s);
}

// The end of a pre-norm layer: the stream is x + delta + bias. Left pending when the next layer
// takes it (next.defer); otherwise one norms kernel materialises it into bufs.x and next(x)
// into bufs.n (kAddOnly: bufs.x only).
void finish_stream(const LayerContext& lc, const LayerBuffers& b, int64_t tokens,
                   const NextNorm& next, const void* delta, const void* bias, ResidualStream* s) {
  s->delta = delta;
  s->bias = bias;
  if (next.defer) return;
  void* out = next.kind == kernels::NormKind::kAddOnly ? b.x : b.n;
  norm_rows(lc, next.kind, next.w, delta, s->x, b.x, bias, out, tokens, lc.spec->hidden);
  *s = ResidualStream{b.x, nullptr, nullptr};
}

// The QKV and MLP-in products of a parallel-residual layer's decode step as one GEMV launch
// (normed_pair): [qkv | fj] = [ln1(x) @ Wqkv | act(ln(x) @ W1 + b1)], ln being
// ln1 (shared) or ln2, the stream's pending adds applied on the way. False (nothing launched)
// where the GEMV cannot pair the two products.
bool paired_products(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& b,
                     int64_t tokens, ResidualStream* s) {
  const LayerSpec& c = *lc.spec;
  if (w.qkv.quantized() || w.fc1.quantized()) return false;
  const bool shared_norm = (c.mlp == MlpPlacement::kParallelSharedNorm);
  const GemmNormedInput in = stream_input(lc, *s, b, tokens, w.ln1.gamma, w.ln1.beta, b.n, false);
  PairedProduct qkv;
  qkv.weight = w.qkv.weight;
  qkv.out = b.qkv;
  qkv.n = c.qkv_width();
  PairedProduct mlp;
  mlp.weight = w.fc1.weight;
  mlp.bias = w.fc1.bias;
  mlp.out = b.fj;
  mlp.n = c.inter;
  mlp.act = c.activation;
  if (!normed_pair(*lc.gemm, lc.dtype, in, qkv, mlp, shared_norm ? NormWeights{} : w.ln2, tokens,
                   c.hidden)) {
    return false;
  }
  stream_written(in, s);
  return true;
}

// A gated MLP's gate and up products at decode sizes as one GEMV launch (normed_pair, one norm):
// [f | fu] = [act(ln2(x) @ G + g) | ln2(x) @ U + u]. Returns false, launching nothing, where the
// GEMV does not run them (many rows, quantized weights, the shapes).
bool gated_pair(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& b,
                int64_t tokens, ResidualStream* s) {
  const LayerSpec& c = *lc.spec;
  if (tokens > kernels::kGemvMaxRows || w.gate.quantized() || w.fc1.quantized()) return false;
  const GemmNormedInput in = stream_input(lc, *s, b, tokens, w.ln2.gamma, w.ln2.beta, b.n, false);
  PairedProduct gate;
  gate.weight = w.gate.weight;
  gate.bias = w.gate.bias;
  gate.out = b.f;
  gate.n = c.inter;
  gate.act = c.activation;
  PairedProduct up;
  up.weight = w.fc1.weight;
  up.bias = w.fc1.bias;
  up.out = b.fu;
  up.n = c.inter;
  if (!normed_pair(*lc.gemm, lc.dtype, in, gate, up, NormWeights{}, tokens, c.hidden)) return false;
  stream_written(in, s);
  return true;
}

// The post-norm layer (OPT-350m): y = ln1(x + attn(x) @ Wo + bo); x = ln2(y + mlp(y) + b2);
// then n = next(x). The stream is always materialised in bufs.x.
void post_norm_layer(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& b,
                     int64_t tokens, const AttentionInputs& ai, const NextNorm& next) {
  const LayerSpec& c = *lc.spec;
  const kernels::NormKind ln = c.norm;
  run_linear(lc, b, without_bias(w.qkv), b.x, b.qkv, tokens);
  self_attention(lc, AttentionIO{b.qkv, w.qkv.bias, b.q, b.a}, tokens, ai);
  product_then_norm(lc, b, b.a, w.dense, b.p, tokens,
                    NormSpec{ln, w.ln1, w.dense.bias, b.x, b.x, b.y});
  // The MLP reads y, or with cross-attention n = lnc(y + cross(y) @ Wco + bco); its output then
  // lands in x either way.
  void* mlp_in = b.y;
  if (c.cross_attention) {
    run_linear(lc, b, w.cross_q, b.y, b.q, tokens);
    cross_attention(lc, b.q, b.a, tokens, ai);
    product_then_norm(lc, b, b.a, w.cross_dense, b.p, tokens,
                      NormSpec{ln, w.ln_cross, w.cross_dense.bias, b.y, b.y, b.n});
    mlp_in = b.n;
  }
  run_linear(lc, b, w.fc1, mlp_in, b.f, tokens, c.activation);
  product_then_norm(lc, b, b.f, w.fc2, b.o, tokens,
                    NormSpec{ln, w.ln2, w.fc2.bias, mlp_in, mlp_in, b.x});
  if (next.kind != kernels::NormKind::kAddOnly) {
    norm_rows(lc, next.kind, next.w, b.x, nullptr, nullptr, nullptr, b.n, tokens, c.hidden);
  }
}

void layer_forward(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& b,
                   int64_t tokens, const AttentionInputs& ai, const NextNorm& next,
                   ResidualStream* s) {
  const LayerSpec& c = *lc.spec;
  if (!c.pre_norm()) {
    TORCH_CHECK(s->x == b.x && s->delta == nullptr && s->bias == nullptr && !next.defer,
                "decoder layer: a post-norm layer takes and leaves the stream in bufs.x");
    post_norm_layer(lc, w, b, tokens, ai, next);
    return;
  }
  const int64_t lh = c.q_width(), li = c.inter;
  using kernels::Activation;
  // Quantized weights run each product on its own (the joined GEMV launches stream dense ones).
  const bool decode_sized =
      c.parallel_mlp() && b.fj != nullptr && tokens <= kernels::kGemvMaxRows && !w.quantized();

  // Attention block: qkv = ln1(x) @ Wqkv, the pending adds applied on the way; with paired
  // products the MLP-in product runs in the same launch. The parallel form with one shared norm
  // otherwise keeps n = ln1(x) for its MLP.
  const bool paired = decode_sized && paired_products(lc, w, b, tokens, s);
  const bool shared_norm = c.parallel_mlp() && (c.mlp == MlpPlacement::kParallelSharedNorm);
  if (!paired) {
    normed_product(lc, s, b, w.ln1.gamma, w.ln1.beta, b.n, shared_norm, without_bias(w.qkv), b.qkv,
                   tokens, Activation::kIdentity);
  }
  self_attention(lc, AttentionIO{b.qkv, w.qkv.bias, b.q, b.a}, tokens, ai);

  if (c.parallel_mlp()) {  // p = attn @ Wo + mlp(.) @ W2 [one all-reduce]; x += p + bo + b2
    // Decode-sized: the MLP-in product has run with the QKV product
    // (paired), or runs beside the attention (it reads neither qkv nor a, and writes bufs.fj,
    // apart from both); then attention-out and MLP-out are one product, which when paired
    // streams W2 beside the attention (second_ready). Otherwise: attention-out, MLP-in, MLP-out
    // accumulating.
    const bool beside = decode_sized;
    void* const f = beside ? b.fj : b.f;
    if (!beside) run_linear(lc, b, without_bias(w.dense), b.a, b.p, tokens);
    if (paired) {
      // the MLP hidden is in bufs.fj already
    } else if (shared_norm && beside) {
      lc.gemm->run_act(lc.dtype, b.n, w.fc1.weight, w.fc1.bias, f, tokens, li, c.hidden,
                       c.activation, 0.f, beside);
    } else if (shared_norm) {
      run_linear(lc, b, w.fc1, b.n, f, tokens, c.activation);
    } else {  // ln2 of the stream (materialised by the QKV product); n is free as scratch
      normed_product(lc, s, b, w.ln2.gamma, w.ln2.beta, b.n, false, w.fc1, f, tokens, c.activation,
                     beside);
    }
    if (beside) {
      product_sum(*lc.gemm, lc.dtype, b.a, w.dense.weight, lh, f, w.fc2.weight, li, b.p, tokens,
                  c.hidden, paired);
      all_reduce_if_parallel(lc.comm, b.p, tokens * c.hidden, lc.dtype, lc.ctx->stream());
    } else {
      product(lc, b, f, w.fc2, b.p, tokens, 1.f);
    }
    finish_stream(lc, b, tokens, next, b.p, w.residual_bias, s);
    return;
  }

  // Sequential: x += p + bo; f = act(ln2(x) @ W1 + b1); pending = f @ W2, b2.
  product(lc, b, b.a, w.dense, b.p, tokens);
  s->delta = b.p;
  s->bias = w.dense.bias;
  if (c.cross_attention) {  // x += p + bo; q = lnc(x) @ Wcq + bcq; pending = cross(q) @ Wco, bco
    normed_product(lc, s, b, w.ln_cross.gamma, w.ln_cross.beta, b.n, false, w.cross_q, b.q, tokens,
                   Activation::kIdentity);
    cross_attention(lc, b.q, b.a, tokens, ai);
    product(lc, b, b.a, w.cross_dense, b.p, tokens);
    s->delta = b.p;
    s->bias = w.cross_dense.bias;
  }
  if (c.gated) {  // f = act(n @ G + g) * (n @ U + u), n = ln2(x)
    // At decode sizes both products stream their weights in one GEMV launch; otherwise the gate
    // product keeps n for the up product.
    if (!gated_pair(lc, w, b, tokens, s)) {
      normed_product(lc, s, b, w.ln2.gamma, w.ln2.beta, b.n, true, w.gate, b.f, tokens,
                     c.activation);
      run_linear(lc, b, w.fc1, b.n, b.fu, tokens, kernels::Activation::kIdentity);
    }
    WF_DISPATCH_FLOATING(lc.dtype, "gated_mlp", [&] {
      WF_CUDA_CHECK(kernels::launch_mul(
          static_cast<scalar_t*>(b.f), static_cast<const scalar_t*>(b.f),
          static_cast<const scalar_t*>(b.fu), tokens * c.inter, lc.ctx->stream()));
    });
  } else {
    normed_product(lc, s, b, w.ln2.gamma, w.ln2.beta, b.n, false, w.fc1, b.f, tokens, c.activation);
  }
  product(lc, b, b.f, w.fc2, b.o, tokens);
  finish_stream(lc, b, tokens, next, b.o, w.fc2.bias, s);
}

}  // namespace

void decoder_layer_forward(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& bufs,
                           int64_t tokens, const AttentionInputs& attn, const NextNorm& next,
                           ResidualStream* stream) {
  if (tokens == 0) return;
  layer_forward(lc, w, bufs, tokens, attn, next, stream);
}

int64_t LayerWeights::largest_quantized() const {
  int64_t most = 0;
  for (const Linear* l : {&qkv, &dense, &fc1, &gate, &fc2, &cross_q, &cross_dense}) {
    if (l->quantized()) most = std::max(most, l->in * l->out);
  }
  return most;
}

LayerBuffers carve_layer_buffers(const LayerSpec& spec, DType dtype, int64_t t, Carver* carver,
                                 int64_t quantized_elems) {
  const int64_t h = spec.hidden, lh = spec.q_width(), li = spec.inter;
  const size_t es = dtype_size(dtype);
  Carver& c = *carver;
  layers::LayerBuffers b{};
  b.x = c.take(t * h * es);
  b.n = c.take(t * h * es);
  // Pre-norm layers move the stream into y only at up to kGemvMaxRows rows (ResidualStream);
  // post-norm layers hold ln1's output there.
  b.y_rows = spec.pre_norm() ? std::min<int64_t>(t, kernels::kGemvMaxRows) : t;
  b.y = c.take(b.y_rows * h * es);
  b.p = c.take(t * h * es);
  // The MLP output is written after the attention projection was consumed (added into the
  // residual, or accumulated into in the parallel form), so they share one buffer.
  b.o = b.p;
  // qkv, q and the attention output are dead once the attention projection ran, before the
  // MLP hidden is written: one region serves both.
  const size_t qkv_bytes = Carver::align_up(t * spec.qkv_width() * es);
  const size_t attn_bytes = qkv_bytes + 2 * Carver::align_up(t * lh * es);
  const size_t mlp_bytes = Carver::align_up(t * li * es) * (spec.gated ? 2 : 1);
  char* region = static_cast<char*>(c.take(std::max(attn_bytes, mlp_bytes)));
  b.fu = nullptr;
  if (region != nullptr) {
    b.qkv = region;
    b.q = region + qkv_bytes;
    b.a = region + qkv_bytes + Carver::align_up(t * lh * es);
    b.f = region;
    if (spec.gated) b.fu = region + Carver::align_up(t * li * es);
  }
  // The MLP hidden of a parallel-residual layer at decode sizes (up to kGemvMaxRows rows): live
  // together with qkv and the attention output, so apart from them.
  b.fj = spec.parallel_mlp() && spec.pre_norm()
             ? c.take(std::min<int64_t>(t, kernels::kGemvMaxRows) * li * es)
             : nullptr;
  b.wq = quantized_elems > 0 ? c.take(quantized_elems * es) : nullptr;
  return b;
}

}  // namespace layers
}  // namespace warpformer
