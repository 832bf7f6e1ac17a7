#include "csrc/layers/norm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "csrc/core/check.h"

namespace warpformer {
namespace layers {

void norm_rows(const LayerContext& lc, kernels::NormKind kind, const NormWeights& w,
               const void* input, const void* residual, void* residual_out, const void* bias,
               void* out, int64_t rows, int64_t hidden) {
  if (rows == 0) return;
  WF_DISPATCH_FLOATING(lc.dtype, "norm_rows", [&] {
    using T = scalar_t;
    kernels::NormParams<T> p{};
    p.out = static_cast<T*>(out);
    p.residual_out = static_cast<T*>(residual_out);
    p.input = static_cast<const T*>(input);
    p.residual = static_cast<const T*>(residual);
    p.input_bias = static_cast<const T*>(bias);
    p.gamma = static_cast<const T*>(w.gamma);
    p.beta = static_cast<const T*>(w.beta);
    p.rows = rows;
    p.hidden = static_cast<int>(hidden);
    p.eps = lc.spec->norm_eps;
    p.kind = kind;
    WF_CUDA_CHECK(kernels::launch_norm(p, lc.ctx->stream()));
  });
}

void apply_norm(const LayerContext& lc, kernels::NormKind kind, const NormWeights& w, const void* x,
                void* out, int64_t rows, int64_t hidden) {
  norm_rows(lc, kind, w, x, nullptr, nullptr, nullptr, out, rows, hidden);
}

void add_and_norm(const LayerContext& lc, const void* delta, void* x, const void* bias,
                  const NextNorm& next, void* out, int64_t rows, int64_t hidden) {
  norm_rows(lc, next.kind, next.w, delta, x, x, bias, out != nullptr ? out : x, rows, hidden);
}

}  // namespace layers
}  // namespace warpformer
