// The layers of a small decode step as one persistent kernel.
//
// At one or two rows a small model's decode step is a chain of latency-bound kernels: five per
// layer, each a few microseconds for a few megabytes of weights (benchmarks/README.md, "Where
// the time goes"). launch_decode_layers runs every layer of the step in one cooperative launch,
// one block per SM, in five phases per layer separated by grid-wide barriers:
//
//   A  qkv  = ln1(x) @ Wqkv            x = the residual stream, its pending adds applied
//   B  attention of every (row, head): bias, rotary, cache write, softmax(q K) V
//   C  p    = attn @ Wo
//   D  f    = act(ln2(x + p + bo) @ W1 + b1)
//   E  o    = f @ W2                   the next layer's A adds o + b2 to the stream
//
// Every block streams its share of each product's weight into shared memory (cp.async) two
// phases ahead of the phase that multiplies it, so the weight stream does not stop at the
// barriers, and each product's columns are split over the blocks in units of 4 x 16 bytes of
// every weight row of a k-range. A product's k-ranges leave fp32 partial sums that the phase
// reading them adds in a fixed order: the results are deterministic, and they round where the
// kernel-per-product step rounds (products to T, the stream to T, the norm's output to T), so
// they differ from it only in the order of the fp32 sums.
//
// Pre-norm LayerNorm models with sequential residual (GPT-2, OPT-1.3b and up, BLOOM, NeoX with
// use_parallel_residual off), 16-bit types, one tensor-parallel rank and pipeline stage;
// decode_layers_plan says whether a model's shapes fit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/activations.h"
#include "kernels/attention/attention.h"

namespace warpformer {
namespace kernels {

constexpr int kDecodeLayersMaxRows = 2;

// One layer's weights (element type T), as decoder_layer.h's LayerWeights: kernels [in, out].
template <typename T>
struct DecodeLayerWeights {
  const T* ln1_w;    // [h]
  const T* ln1_b;    // [h] or null
  const T* qkv_w;    // [h, 3 * heads * head_dim]
  const T* qkv_b;    // [3 * heads * head_dim] or null
  const T* dense_w;  // [heads * head_dim, h]
  const T* dense_b;  // [h] or null
  const T* ln2_w;    // [h]
  const T* ln2_b;    // [h] or null
  const T* fc1_w;    // [h, inter]
  const T* fc1_b;    // [inter] or null
  const T* fc2_w;    // [inter, h]
  const T* fc2_b;    // [h] or null
};

struct DecodeLayersShape {
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int head_dim = 0;
  int inter = 0;
  int elem_bytes = 2;  // sizeof(T)
};

// How the kernel splits the step over the GPU (decode_layers_plan). The k-split of each product
// (qkv, out, fc1, fc2) is chosen so that every block streams about the same number of bytes and
// holds at most one phase's share in a shared-memory stage.
struct DecodeLayersPlan {
  bool ok = false;
  const char* why = "";  // when !ok: the rule the shapes broke
  int blocks = 0;        // one per SM
  int ks[4] = {1, 1, 1, 1};
  size_t smem = 0;       // dynamic shared memory per block
  int max_seq = 0;       // the longest cache (positions) its attention scratch holds
};

// The plan for `shape` on `device`; plan.ok is false (plan.why says why) when the shapes do not
// fit the kernel: hidden (at most 2048), heads * head_dim and inter multiples of 128, a phase's
// share of any product over the blocks in one 64 KiB stage, head_dim a power of two from 8 to
// 256.
DecodeLayersPlan decode_layers_plan(const DecodeLayersShape& shape, int device);

// Bytes of the fp32 partial sums and the attention output for `rows` rows.
size_t decode_layers_workspace_bytes(const DecodeLayersPlan& plan, const DecodeLayersShape& shape,
                                     int rows);

template <typename T>
struct DecodeLayersParams {
  const DecodeLayerWeights<T>* layers;  // [shape.layers], device memory
  DecodeLayersShape shape;
  DecodeLayersPlan plan;
  int rows = 0;                         // 1..kDecodeLayersMaxRows
  float eps = 1e-5f;
  Activation act = Activation::kIdentity;
  // The residual stream [rows, h] enters in x (no pending adds) and leaves materialised in x;
  // y is the second stream buffer. n_out receives final(x): norm with final_gamma / final_beta,
  // or x itself when final_gamma is null.
  T* x = nullptr;
  T* y = nullptr;
  T* n_out = nullptr;
  const T* final_gamma = nullptr;
  const T* final_beta = nullptr;
  // KV cache: layer l's keys at kv + 2 l layer_kv, values at kv + (2 l + 1) layer_kv, each
  // [num_slots, heads, max_seq, head_dim]. The attention is launch_decode_attention_fused's: row
  // r's new token at position lengths[r] - 1 of slot row_slot[r] (or r), keys read through
  // cache_indir [rows, max_seq] when given; a row with length < 1 or an invalid slot gets zeros.
  T* kv = nullptr;
  int64_t layer_kv = 0;
  int num_slots = 0;
  int max_seq = 0;                      // <= plan.max_seq
  const int32_t* row_slot = nullptr;
  const int32_t* lengths = nullptr;
  const int32_t* cache_indir = nullptr;
  const float* alibi_slopes = nullptr;  // [heads] or null
  const float* rotary_inv_freq = nullptr;  // [rotary_dim / 2] (launch_rotary_inv_freq) or null
  int rotary_dim = 0;
  RotaryStyle rotary_style = RotaryStyle::kNone;
  float scale = 1.f;
  void* workspace = nullptr;            // decode_layers_workspace_bytes(plan, shape, rows)
  // Two counters, zero before the first launch; every launch leaves them zero. Launches sharing
  // the counters must not run at the same time (one stream).
  unsigned* barrier = nullptr;
  int experiment_sync = 0;
  int experiment_depth = 2;
};

// cudaErrorInvalidValue when the parameters break the rules above (nothing is launched).
template <typename T>
cudaError_t launch_decode_layers(const DecodeLayersParams<T>& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace warpformer
