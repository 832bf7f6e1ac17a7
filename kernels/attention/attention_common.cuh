// Device helpers shared by the attention kernels: the head-size switch, rotary frequencies and
// the safe exponent used by the online softmax. Included only from kernels/attention/*.cu.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/attention/attention.h"
#include "kernels/common.cuh"

namespace warpformer {
namespace kernels {
namespace attn {

// inv_freq_i = 1 / base^(2i / rotary_dim), rounded like HF's fp32 computation:
// exponent = float(2i) / float(rotary_dim), power rounded once to fp32, then an IEEE fp32 division.
__device__ __forceinline__ float rotary_inv_freq(int i, int rotary_dim, float base) {
  const float expo = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
  const float power = static_cast<float>(pow(static_cast<double>(base), static_cast<double>(expo)));
  return __fdiv_rn(1.0f, power);
}

// The two elements (a, b) of pair j of a head: rotary pairs for j < rot_half (see RotaryStyle),
// then the remaining dims two by two (copied unchanged). Returns whether the pair is rotated.
__device__ __forceinline__ bool rotary_pair(int j, int rot_half, bool interleaved, int& a, int& b) {
  if (j < rot_half) {
    a = interleaved ? 2 * j : j;
    b = interleaved ? 2 * j + 1 : j + rot_half;
    return true;
  }
  a = 2 * rot_half + 2 * (j - rot_half);
  b = a + 1;
  return false;
}

// x[x_off] (+ bias[b_off]) in fp32: how both QKV preparations (qkv_prep and the fused decode
// attention) read an element of the QKV product, so that they round alike.
template <typename T>
__device__ __forceinline__ float load_biased(const T* __restrict__ x, const T* __restrict__ bias,
                                             int64_t x_off, int b_off) {
  float v = to_float(x[x_off]);
  if (bias != nullptr) v += to_float(bias[b_off]);
  return v;
}

// VEC elements x[off ..] (+ bias[off ..]) in fp32, element for element as load_biased rounds them;
// x + off and bias + off must be 16-byte aligned.
template <typename T, int VEC>
__device__ __forceinline__ void load_biased_vec(const T* __restrict__ x, const T* __restrict__ bias,
                                                int64_t off, float (&out)[VEC]) {
  load_vec<T, VEC>(x + off, out);
  if (bias != nullptr) {
    float b[VEC];
    load_vec<T, VEC>(bias + off, b);
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] += b[e];
  }
}

// (x, y) -> (x cos - y sin, y cos + x sin), every product and sum rounded separately (no FMA
// contraction), so that the QKV-prep kernel and the fused decode attention round alike.
__device__ __forceinline__ void rotate(float x, float y, float c, float s, float& ox, float& oy) {
  ox = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
  oy = __fadd_rn(__fmul_rn(y, c), __fmul_rn(x, s));
}

// cos/sin of position `pos` for the rot_half frequencies, spread over the block's threads (the
// caller synchronises before reading them).
// inv_freq: the model's frequency table (launch_rotary_inv_freq, then any scaling), or null to
// form the unscaled frequencies here; mscale: the factor on cos and sin (yarn's attention factor).
__device__ __forceinline__ void rotary_table(int pos, int rot_half, int rotary_dim, float base,
                                             float* cos_s, float* sin_s,
                                             const float* inv_freq = nullptr, float mscale = 1.f) {
  for (int i = threadIdx.x; i < rot_half; i += blockDim.x) {
    // fp32 angle from one fp32 multiply, as HF's `position.float() * inv_freq`.
    const float f = inv_freq != nullptr ? inv_freq[i] : rotary_inv_freq(i, rotary_dim, base);
    const float angle = static_cast<float>(pos) * f;
    float s, c;
    sincosf(angle, &s, &c);
    cos_s[i] = __fmul_rn(c, mscale);
    sin_s[i] = __fmul_rn(s, mscale);
  }
}

// Sliding window (window > 0): whether key position k lies before the window of query position q
// (q - window < k <= q is inside).
__device__ __forceinline__ bool outside_window(int window, int k, int q) {
  return window > 0 && k <= q - window;
}

// The first key tile (of `tile` keys) a block of queries starting at position q0 needs: 0, or
// with a window the tile holding q0's first visible key.
__device__ __forceinline__ int first_key_tile(int window, int q0, int tile) {
  return window > 0 ? max(0, q0 - window + 1) / tile * tile : 0;
}

// exp(x - m) that is 0 (not NaN) when both are -inf.
__device__ __forceinline__ float exp_shifted(float x, float m) {
  return m == -INFINITY ? 0.f : __expf(x - m);
}

}  // namespace attn
}  // namespace kernels
}  // namespace warpformer

// Run the body with HEAD_DIM bound to the runtime head size (kAttentionHeadDims); unsupported
// sizes return cudaErrorInvalidValue from the enclosing lambda.
#define WF_HEAD_DIM_CASE(D, HEAD_DIM, ...) \
  case D: {                                \
    constexpr int HEAD_DIM = D;            \
    return __VA_ARGS__();                  \
  }
#define WF_HEAD_DIM_SWITCH(DIM, HEAD_DIM, ...)     \
  [&]() -> cudaError_t {                           \
    switch (DIM) {                                 \
      WF_HEAD_DIM_CASE(32, HEAD_DIM, __VA_ARGS__)  \
      WF_HEAD_DIM_CASE(48, HEAD_DIM, __VA_ARGS__)  \
      WF_HEAD_DIM_CASE(64, HEAD_DIM, __VA_ARGS__)  \
      WF_HEAD_DIM_CASE(80, HEAD_DIM, __VA_ARGS__)  \
      WF_HEAD_DIM_CASE(96, HEAD_DIM, __VA_ARGS__)  \
      WF_HEAD_DIM_CASE(112, HEAD_DIM, __VA_ARGS__) \
      WF_HEAD_DIM_CASE(128, HEAD_DIM, __VA_ARGS__) \
      WF_HEAD_DIM_CASE(144, HEAD_DIM, __VA_ARGS__) \
      WF_HEAD_DIM_CASE(160, HEAD_DIM, __VA_ARGS__) \
      WF_HEAD_DIM_CASE(192, HEAD_DIM, __VA_ARGS__) \
      WF_HEAD_DIM_CASE(224, HEAD_DIM, __VA_ARGS__) \
      WF_HEAD_DIM_CASE(256, HEAD_DIM, __VA_ARGS__) \
      default: return cudaErrorInvalidValue;       \
    }                                              \
  }()
