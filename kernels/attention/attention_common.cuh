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
__device__ __forceinline__ void load_biased_vec(const T* __restrict__ x,
                                                const T* __restrict__ bias, int64_t off,
                                                float (&out)[VEC]) {
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
__device__ __forceinline__ void rotary_table(int pos, int rot_half, int rotary_dim, float base,
                                             float* cos_s, float* sin_s) {
  for (int i = threadIdx.x; i < rot_half; i += blockDim.x) {
    // fp32 angle from one fp32 multiply, as HF's `position.float() * inv_freq`.
    const float angle = static_cast<float>(pos) * rotary_inv_freq(i, rotary_dim, base);
    float s, c;
    sincosf(angle, &s, &c);
    cos_s[i] = c;
    sin_s[i] = s;
  }
}

// Elements d .. d + VEC - 1 of one token's q or k head row (src; bias: the same head's bias or
// null) as launch_qkv_prep prepares them, in fp32 before the rounding to T: the bias added, then
// the rotary of position `pos` with the frequencies inv_freq (launch_rotary_inv_freq). d is a
// multiple of VEC and the elements are 16-byte aligned; for the half-split style rot_half is a
// multiple of VEC, so the vector and its partner rot_half away lie on opposite sides. Same
// arithmetic as qkv_prep_kernel, so the rounded values are bit-identical to what it writes.
template <typename T, int VEC>
__device__ __forceinline__ void prepared_vec(const T* __restrict__ src, const T* __restrict__ bias,
                                             int d, int pos, int rot_half, bool interleaved,
                                             const float* __restrict__ inv_freq,
                                             float (&x)[VEC]) {
  load_biased_vec<T, VEC>(src, bias, d, x);
  if (d >= 2 * rot_half) return;
  if (interleaved) {
#pragma unroll
    for (int e = 0; e < VEC; e += 2) {
      const int j = (d + e) / 2;
      if (j < rot_half) {
        float sn, cs;
        sincosf(static_cast<float>(pos) * inv_freq[j], &sn, &cs);
        rotate(x[e], x[e + 1], cs, sn, x[e], x[e + 1]);
      }
    }
    return;
  }
  const bool low = d < rot_half;  // the pair's first half; its partner is rot_half further on
  float y[VEC];
  load_biased_vec<T, VEC>(src, bias, low ? d + rot_half : d - rot_half, y);
  const int j0 = low ? d : d - rot_half;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    float sn, cs, ox, oy;
    sincosf(static_cast<float>(pos) * inv_freq[j0 + e], &sn, &cs);
    if (low) {
      rotate(x[e], y[e], cs, sn, ox, oy);
      x[e] = ox;
    } else {
      rotate(y[e], x[e], cs, sn, ox, oy);
      x[e] = oy;
    }
  }
}

// exp(x - m) that is 0 (not NaN) when both are -inf.
__device__ __forceinline__ float exp_shifted(float x, float m) {
  return m == -INFINITY ? 0.f : __expf(x - m);
}

}  // namespace attn
}  // namespace kernels
}  // namespace warpformer

// Run the body with HEAD_DIM bound to the runtime head size; unsupported sizes return
// cudaErrorInvalidValue from the enclosing lambda.
#define WF_HEAD_DIM_SWITCH(DIM, HEAD_DIM, ...)                      \
  [&]() -> cudaError_t {                                            \
    switch (DIM) {                                                  \
      case 64: {                                                    \
        constexpr int HEAD_DIM = 64;                                \
        return __VA_ARGS__();                                       \
      }                                                             \
      case 80: {                                                    \
        constexpr int HEAD_DIM = 80;                                \
        return __VA_ARGS__();                                       \
      }                                                             \
      case 96: {                                                    \
        constexpr int HEAD_DIM = 96;                                \
        return __VA_ARGS__();                                       \
      }                                                             \
      case 128: {                                                   \
        constexpr int HEAD_DIM = 128;                               \
        return __VA_ARGS__();                                       \
      }                                                             \
      case 256: {                                                   \
        constexpr int HEAD_DIM = 256;                               \
        return __VA_ARGS__();                                       \
      }                                                             \
      default: return cudaErrorInvalidValue;                        \
    }                                                               \
  }()
