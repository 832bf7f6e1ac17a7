// One decoder layer of the GPT family, written once for every architecture: the switches of
// GptConfig choose pre/post LayerNorm, sequential or parallel residual (shared or separate norm),
// attention biases, rotary/ALiBi, and the activation. Tensor-parallel aware: the weights are this
// rank's shards and the two row-parallel outputs go through the communicator's all-reduce (one
// all-reduce for the parallel-residual form, whose attention and MLP outputs are summed first).
#pragma once

#include <cstdint>

#include "csrc/core/communicator.h"
#include "csrc/core/cuda_context.h"
#include "csrc/core/gemm.h"
#include "csrc/models/gpt/gpt_config.h"
#include "kernels/norms.h"

namespace warpformer {
namespace layers {

// Device pointers of one layer's weights on this rank (element type = the model dtype). Shapes
// use h = hidden, lh = local heads * head size, li = local inter size; kernels stored [in, out].
struct LayerWeights {
  const void* ln1_w = nullptr;       // [h]      input_layernorm
  const void* ln1_b = nullptr;       // [h]
  const void* qkv_w = nullptr;       // [h, 3 * lh]
  const void* qkv_b = nullptr;       // [3 * lh] or null
  const void* dense_w = nullptr;     // [lh, h]
  const void* dense_b = nullptr;     // [h] or null
  const void* ln2_w = nullptr;       // [h]      post_attention_layernorm (null: GPT-J)
  const void* ln2_b = nullptr;       // [h]
  const void* fc1_w = nullptr;       // [h, li]
  const void* fc1_b = nullptr;       // [li] or null
  const void* fc2_w = nullptr;       // [li, h]
  const void* fc2_b = nullptr;       // [h] or null
  const void* residual_b = nullptr;  // [h] dense_b + fc2_b, for the parallel-residual form
};

// What follows this layer. defer (pre-norm layers whose successor is a pre-norm layer of the
// same stage): the layer's last residual add is left pending in the ResidualStream for the
// next layer's QKV product, which applies it together with its input norm. Otherwise the norm
// applied to the stream after this layer (the final norm, or none; the next layer's input norm
// for post-norm models), fused with the layer's last residual add.
struct NextNorm {
  kernels::NormKind kind = kernels::NormKind::kAddOnly;
  const void* gamma = nullptr;
  const void* beta = nullptr;
  bool defer = false;
};

// The residual stream of a pre-norm model between the products of a step: x + delta (+ bias),
// the adds not yet applied when delta or bias is set. The product that next reads the stream's
// norm applies them on the way (Gemm::run_normed) and writes the sum into the other of
// bufs.x / bufs.y at up to kernels::kGemvMaxRows rows (the normalising GEMV may not write its
// input), or back into x past them (the norms kernel runs there), which then holds the stream;
// so no kernel of its own adds and normalises. Entering the first layer: {bufs.x}. After a
// layer without NextNorm::defer: {bufs.x}.
struct ResidualStream {
  void* x = nullptr;
  const void* delta = nullptr;
  const void* bias = nullptr;
};

// Activation buffers for `tokens` rows, all of the model dtype.
// The layer writes f only after its last read of qkv, q and a, and o only after its last read of
// p, so the model may overlap those buffers (GptModel::layout does). x, n, y and p (o) must not
// overlap each other or the qkv/q/a/f region: a pending delta in p or o stays live into the
// next layer's QKV product, and the normalising GEMV reads x / y / p / o while writing x / y / n.
struct LayerBuffers {
  void* x;    // [tokens, h]   residual stream (see ResidualStream)
  void* n;    // [tokens, h]   normed rows (scratch; after the last layer its next(x))
  void* y;    // [y_rows, h]   the second residual-stream buffer (pre-norm: y_rows =
              // min(tokens, kGemvMaxRows)); post-norm: [tokens, h], ln1's output
  void* qkv;  // [tokens, 3 * lh]
  void* q;    // [tokens, lh]
  void* a;    // [tokens, lh]  attention output
  void* p;    // [tokens, h]   attention projection (+ MLP output in the parallel form)
  void* f;    // [tokens, li]  MLP hidden (may share memory with qkv, q and a)
  void* o;    // [tokens, h]   MLP output (may be the same buffer as p)
  // [min(tokens, kGemvMaxRows), li] the MLP hidden of a parallel-residual layer at decode sizes
  // (LayerContext::parallel_products): written beside the attention and read together with its
  // output, so apart from qkv, q, a and the rest; null when the model has no such layers.
  void* fj;
  int64_t y_rows;  // rows y holds (checked where a pre-norm layer moves the stream into it)
};

// Where the attention reads and writes: the layer's KV cache and the token -> (slot, position)
// map, plus either the packed-prefill description or the one-token-per-row decode description.
struct AttentionInputs {
  void* k_cache;  // [num_slots, local_heads, max_seq, head_dim]
  void* v_cache;
  int num_slots;
  int max_seq;
  const int32_t* token_slot;  // [tokens]
  const int32_t* token_pos;   // [tokens]
  const float* alibi_slopes;  // [local_heads] or null
  bool decode;
  // prefill
  const int32_t* cu_seqlens;  // [batch + 1]
  const int32_t* seq_slot;    // [batch]
  int batch;
  int max_seqlen;
  // decode (rows == tokens)
  const int32_t* row_slot;     // [rows] or null
  const int32_t* lengths;      // [rows]
  const int32_t* cache_indir;  // [rows, max_seq] or null
  // QKV preparation inside the decode attention kernel; requires token_slot = row_slot (or
  // iota), token_pos = lengths - 1 and cache_indir[r, token_pos[r]] = the row's slot.
  bool fused_prep;
  const float* rotary_inv_freq;  // [rotary_dim / 2] (kernels::launch_rotary_inv_freq) or null
  float* workspace;              // split-KV scratch
  size_t workspace_bytes;
};

struct LayerContext {
  const CudaContext* ctx;
  Gemm* gemm;
  Communicator* comm;  // tensor-parallel group or null
  const gpt::GptConfig* cfg;
  DType dtype;
};

// Runs one layer over `tokens` rows. `stream` is the residual stream on entry and is updated.
// Pre-norm layers: see ResidualStream; unless next.defer, on exit bufs.x holds the stream and
// bufs.n holds next(x) (for kAddOnly, n is not written). Post-norm layers: the stream is
// {bufs.x} on entry and exit, and on exit bufs.n holds next(x) (not written for kAddOnly).
void decoder_layer_forward(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& bufs,
                           int64_t tokens, const AttentionInputs& attn, const NextNorm& next,
                           ResidualStream* stream);

// out = norm(x) (no residual add): BLOOM's embedding norm, and the final norm of a stage
// without layers.
void apply_norm(const LayerContext& lc, kernels::NormKind kind, const void* gamma, const void* beta,
                const void* x, void* out, int64_t rows, int64_t hidden);

// x += delta (+ bias) in place, then out = next(x) (fused); out may be null for kAddOnly.
void add_and_norm(const LayerContext& lc, const void* delta, void* x, const void* bias,
                  const NextNorm& next, void* out, int64_t rows, int64_t hidden);

}  // namespace layers
}  // namespace warpformer
