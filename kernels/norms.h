// LayerNorm and RMSNorm over the last axis, optionally fused with the residual and bias adds that
// decoder layers put in front of a norm. Launchers take raw pointers and a stream; they return the
// launch status (cudaErrorInvalidValue for arguments they cannot handle) for the caller to check.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace warpformer {
namespace kernels {

// kAddOnly skips the normalisation: out[r] = x[r] (and residual_out[r] = x[r]); gamma unused.
enum class NormKind { kLayerNorm = 0, kRmsNorm = 1, kAddOnly = 2 };

// For each row r:
//   x[r]   = input[r] (+ input_bias) (+ residual[r])
//   out[r] = normalize(x[r]) * gamma (+ beta)         (fp32 statistics, shifted sums)
//   residual_out[r] = x[r]                            when residual_out is given
// residual_out may alias residual (in-place residual update of a pre-norm layer) or input.
// All row-major and contiguous. The 16-byte vector path is taken when hidden and every pointer
// allow it; any other case runs element by element.
template <typename T>
struct NormParams {
  T* out;               // [rows, hidden]
  T* residual_out;      // [rows, hidden] or null
  const T* input;       // [rows, hidden]
  const T* residual;    // [rows, hidden] or null
  const T* input_bias;  // [hidden] or null
  const T* gamma;       // [hidden] (null for kAddOnly)
  const T* beta;        // [hidden] or null (ignored by RMSNorm)
  int64_t rows;
  int hidden;
  float eps;
  NormKind kind;
};

template <typename T>
cudaError_t launch_norm(const NormParams<T>& p, cudaStream_t stream);

// The block launch_norm gives a row of `hidden` elements read `vec` at a time: `threads` threads
// (a multiple of 32), thread t summing vectors t, t + threads, ... of the row in that order and
// holding `items` of them in registers (items 0: the row is too long and is re-read). The GEMV's
// normalising prologue reproduces the same sums from it (kernels/gemv.h).
struct NormShape {
  int threads;
  int items;
};
NormShape norm_shape(int hidden, int vec);

}  // namespace kernels
}  // namespace warpformer
