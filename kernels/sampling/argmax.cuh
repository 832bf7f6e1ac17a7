// Argmax of (value, index) pairs under the order (value desc, index asc), shared by the greedy
// step and beam search: ties go to the lowest index like torch.argmax, and NaN never wins (every
// comparison with it is false). The order is total on the other values, so a result does not
// depend on how the pairs were split over threads, warps or blocks. Included only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>

namespace warpformer {
namespace kernels {
namespace argmax {

// Index of "no candidate", after every real index. (-INFINITY, kNoIndex) is the bottom of the
// order: block_best pads the missing warps with it, so the padding never displaces a real pair.
constexpr int kNoIndex = INT_MAX;
// Shared-memory entries block_best needs in each of its two arrays (one per warp, one result).
constexpr int kBlockScratch = 33;

// (v, i) ranks before (ov, oi).
__device__ __forceinline__ bool better(float v, int i, float ov, int oi) {
  return v > ov || (v == ov && i < oi);
}

// (v, i) = the better of (v, i) and (ov, oi); a NaN ov is never taken.
__device__ __forceinline__ void keep_best(float& v, int& i, float ov, int oi) {
  if (better(ov, oi, v, i)) {
    v = ov;
    i = oi;
  }
}

// Warp-wide best; every lane gets it. Needs the whole warp and NaN-free v (a NaN held by a lane
// would make the butterfly's result depend on the lane).
__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    keep_best(v, i, __shfl_xor_sync(0xffffffffu, v, off), __shfl_xor_sync(0xffffffffu, i, off));
  }
}

// Block-wide best; every thread gets it. Every thread of the block (blockDim.x a multiple of 32)
// calls it; sv / si are kBlockScratch shared entries each, which consecutive calls may share.
__device__ __forceinline__ void block_best(float& v, int& i, float* sv, int* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  warp_best(v, i);
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < nwarps ? sv[lane] : -INFINITY;
    i = lane < nwarps ? si[lane] : kNoIndex;
    warp_best(v, i);
    if (lane == 0) {
      sv[kBlockScratch - 1] = v;
      si[kBlockScratch - 1] = i;
    }
  }
  __syncthreads();
  v = sv[kBlockScratch - 1];
  i = si[kBlockScratch - 1];
}

}  // namespace argmax
}  // namespace kernels
}  // namespace warpformer
