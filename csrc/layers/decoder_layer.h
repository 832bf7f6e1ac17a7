// The transformer block, written once for every family: the LayerSpec chooses pre- or post-norm,
// sequential or parallel MLP (with a shared or a separate norm), the norm kind, attention biases,
// rotary/ALiBi/relative bias, the activation, and a cross-attention sub-block (an encoder-decoder's
// decoder; its encoder runs the block with bidirectional attention). Tensor-parallel aware: the
// weights are this rank's shards and the row-parallel outputs go through the communicator's
// all-reduce (one for the parallel form, whose attention and MLP outputs are summed first).
#pragma once

#include <cstdint>

#include "csrc/core/carve.h"
#include "csrc/layers/attention.h"
#include "csrc/layers/layer_context.h"
#include "csrc/layers/linear.h"
#include "csrc/layers/norm.h"

namespace warpformer {
namespace layers {

// One block's weights on this rank (element type = the model dtype).
struct LayerWeights {
  NormWeights ln1;  // input norm
  Linear qkv;       // [hidden, qkv_width]: Q, then K, then V heads
  Linear dense;     // [q_width, hidden] attention output
  NormWeights ln2;  // post-attention norm (null gamma: the parallel form's shared norm)
  Linear fc1;       // [hidden, inter] (a gated MLP: the "up" product)
  Linear gate;      // [hidden, inter] a gated MLP's gate (act(x G) * (x U)); null weight otherwise
  Linear fc2;       // [inter, hidden]
  // LayerSpec::cross_attention: the cross-attention sub-block's norm (before it when pre-norm,
  // after its residual add when post-norm), query product [hidden, q_width] and output product
  // [q_width, hidden]; its K/V products run once per call (the model's write_cross_memory).
  NormWeights ln_cross;
  Linear cross_q;
  Linear cross_dense;
  // dense.bias + fc2.bias, for the parallel form's one residual add (null when neither exists)
  const void* residual_bias = nullptr;

  bool quantized() const {
    return qkv.quantized() || dense.quantized() || fc1.quantized() || gate.quantized() ||
           fc2.quantized() || cross_q.quantized() || cross_dense.quantized();
  }
  // Elements of the largest of the block's quantized weights (its dequantized size), 0 if none.
  int64_t largest_quantized() const;
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
// p, so the model may overlap those buffers (carve_layer_buffers does). x, n, y and p (o) must not
// overlap each other or the qkv/q/a/f region: a pending delta in p or o stays live into the
// next layer's QKV product, and the normalising GEMV reads x / y / p / o while writing x / y / n.
struct LayerBuffers {
  void* x;    // [tokens, h]   residual stream (see ResidualStream)
  void* n;    // [tokens, h]   normed rows (scratch; after the last layer its next(x))
  void* y;    // [y_rows, h]   the second residual-stream buffer (pre-norm: y_rows =
              // min(tokens, kGemvMaxRows)); post-norm: [tokens, h], ln1's output
  void* qkv;  // [tokens, spec.qkv_width()]
  void* q;    // [tokens, lh]
  void* a;    // [tokens, lh]  attention output
  void* p;    // [tokens, h]   attention projection (+ MLP output in the parallel form)
  void* f;    // [tokens, li]  MLP hidden (may share memory with qkv, q and a)
  void* fu;   // [tokens, li]  a gated MLP's up product (beside f in the same region), else null
  void* o;    // [tokens, h]   MLP output (may be the same buffer as p)
  // [min(tokens, kGemvMaxRows), li] the MLP hidden of a parallel-residual layer at decode sizes
  // (the parallel-MLP paired products, linear.h): written beside the attention and read together
  // with its output, so apart from qkv, q, a and the rest; null when the model has no such layers.
  void* fj;
  // [largest quantized weight] a quantized weight dequantized for a product the quantized GEMV
  // does not run (layers::linear_forward's scratch); null when the weights are not quantized.
  void* wq;
  int64_t y_rows;  // rows y holds (checked where a pre-norm layer moves the stream into it)
};

// The block's buffers for `tokens` rows carved from `carver`, overlapping where the block allows;
// quantized_elems: LayerWeights::largest_quantized() of the model's blocks (0: no wq).
LayerBuffers carve_layer_buffers(const LayerSpec& spec, DType dtype, int64_t tokens, Carver* carver,
                                 int64_t quantized_elems = 0);

// Runs one layer over `tokens` rows. `stream` is the residual stream on entry and is updated.
// Pre-norm layers: see ResidualStream; unless next.defer, on exit bufs.x holds the stream and
// bufs.n holds next(x) (for kAddOnly, n is not written). Post-norm layers: the stream is
// {bufs.x} on entry and exit, and on exit bufs.n holds next(x) (not written for kAddOnly).
void decoder_layer_forward(const LayerContext& lc, const LayerWeights& w, const LayerBuffers& bufs,
                           int64_t tokens, const AttentionInputs& attn, const NextNorm& next,
                           ResidualStream* stream);

}  // namespace layers
}  // namespace warpformer
