// Counter-based random numbers for sampling: Philox4x32-10 (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", SC 2011). A draw is a pure function of (key, counter), so a row's
// random number depends only on its own seed and the position being generated: no generator state
// is stored between steps, results do not depend on which other rows share the batch, and the
// step can be replayed inside a CUDA graph.
//
// Usable from host and device code (the host version lets C++ tests reproduce a draw).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace warpformer {
namespace kernels {

struct PhiloxOut {
  uint32_t v[4];
};

namespace philox_detail {

constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

__host__ __device__ __forceinline__ void mul_hi_lo(uint32_t a, uint32_t b, uint32_t& hi,
                                                   uint32_t& lo) {
  const uint64_t prod = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(prod >> 32);
  lo = static_cast<uint32_t>(prod);
}

__host__ __device__ __forceinline__ void round(uint32_t (&c)[4], uint32_t k0, uint32_t k1) {
  uint32_t hi0, lo0, hi1, lo1;
  mul_hi_lo(kMul0, c[0], hi0, lo0);
  mul_hi_lo(kMul1, c[2], hi1, lo1);
  const uint32_t n0 = hi1 ^ c[1] ^ k0;
  const uint32_t n2 = hi0 ^ c[3] ^ k1;
  c[0] = n0;
  c[1] = lo1;
  c[2] = n2;
  c[3] = lo0;
}

}  // namespace philox_detail

// Philox4x32 with 10 rounds: four independent 32-bit words from a 128-bit counter and a 64-bit key.
__host__ __device__ __forceinline__ PhiloxOut philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2,
                                                            uint32_t c3, uint64_t key) {
  uint32_t c[4] = {c0, c1, c2, c3};
  uint32_t k0 = static_cast<uint32_t>(key);
  uint32_t k1 = static_cast<uint32_t>(key >> 32);
  philox_detail::round(c, k0, k1);
#pragma unroll
  for (int i = 1; i < 10; ++i) {
    k0 += philox_detail::kWeyl0;
    k1 += philox_detail::kWeyl1;
    philox_detail::round(c, k0, k1);
  }
  PhiloxOut out;
#pragma unroll
  for (int i = 0; i < 4; ++i) out.v[i] = c[i];
  return out;
}

// Sub-stream tag of the token sampler, so that other users of Philox (dropout-like noise, beam
// search tie breaking) can draw from the same (seed, position) without correlating with it.
constexpr uint32_t kSamplerStream = 0x53414d50u;  // "SAMP"

// Uniform double in [0, 1) with 53 random bits for row seed `seed` at generation position
// `position` (the index in the output sequence of the token being drawn).
__host__ __device__ __forceinline__ double sampling_uniform(uint64_t seed, int64_t position) {
  const uint64_t pos = static_cast<uint64_t>(position);
  const PhiloxOut r = philox4x32_10(static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32),
                                    kSamplerStream, 0u, seed);
  const uint64_t bits = (static_cast<uint64_t>(r.v[0] >> 5) << 26) | (r.v[1] >> 6);  // 27 + 26
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);                     // 2^-53
}

}  // namespace kernels
}  // namespace warpformer
