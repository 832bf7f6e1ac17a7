// Norms over rows of the residual stream, with the residual and bias adds fused in. The kind
// (LayerNorm, RMSNorm) comes from the caller, normally the LayerSpec's norm.
#pragma once

#include <cstdint>

#include "csrc/layers/layer_context.h"
#include "kernels/norms.h"

namespace warpformer {
namespace layers {

// x = input (+ bias) (+ residual); residual_out = x when given; out = norm(x) (kAddOnly: x).
// eps from the spec. out may be input or residual (the kernel reads a row before writing it).
void norm_rows(const LayerContext& lc, kernels::NormKind kind, const NormWeights& w,
               const void* input, const void* residual, void* residual_out, const void* bias,
               void* out, int64_t rows, int64_t hidden);

// What follows a block. defer (pre-norm blocks whose successor is a pre-norm block of the same
// stage): the block's last residual add is left pending in the ResidualStream for the next
// block's QKV product, which applies it together with its input norm. Otherwise the norm applied
// to the stream after this block (the final norm, or none), fused with its last residual add.
struct NextNorm {
  kernels::NormKind kind = kernels::NormKind::kAddOnly;
  NormWeights w;
  bool defer = false;
};

// out = norm(x) (no residual add): an embedding norm, or the final norm of a stage without
// blocks.
void apply_norm(const LayerContext& lc, kernels::NormKind kind, const NormWeights& w, const void* x,
                void* out, int64_t rows, int64_t hidden);

// x += delta (+ bias) in place, then out = next(x) (fused); out may be null for kAddOnly.
void add_and_norm(const LayerContext& lc, const void* delta, void* x, const void* bias,
                  const NextNorm& next, void* out, int64_t rows, int64_t hidden);

}  // namespace layers
}  // namespace warpformer
