// Bias add + activation, plain and gated (GLU), over row-major [rows, cols] tensors.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace warpformer {
namespace kernels {

enum class Activation {
  kIdentity = 0,
  kGeluErf = 1,   // x * Phi(x), exact (erf)
  kGeluTanh = 2,  // tanh approximation (GPT-2 "gelu_new", BLOOM, GPT-J; FT's "Gelu")
  kRelu = 3,
  kSilu = 4,
};

// out[r, c] = act(in[r, c] + bias[c]).  out may alias in (in-place). bias may be null.
template <typename T>
cudaError_t launch_bias_act(T* out,         // [rows, cols]
                            const T* in,    // [rows, cols]
                            const T* bias,  // [cols] or null
                            int64_t rows, int cols, Activation act, cudaStream_t stream);

// Gated form: out[r, c] = act(in[r, c] + bias[c]) * (in[r, cols + c] + bias[cols + c]).
// The first half of each input row is the gate, the second the linear ("up") part.
template <typename T>
cudaError_t launch_gated_act(T* out,         // [rows, cols]
                             const T* in,    // [rows, 2 * cols]
                             const T* bias,  // [2 * cols] or null
                             int64_t rows, int cols, Activation act, cudaStream_t stream);

// out[r, c] = a[r, c] * b[r, c] (out may be a): a gated MLP's act(x G) times x U, each already
// rounded to T as transformers rounds them.
template <typename T>
cudaError_t launch_mul(T* out, const T* a, const T* b, int64_t elements, cudaStream_t stream);

}  // namespace kernels
}  // namespace warpformer
