// Greedy step (see greedy.h): one block per row reduces (value, index) pairs with the lowest index
// winning ties, like torch.argmax; thread 0 then updates the row's generation state.
#include <cfloat>

#include "kernels/common.cuh"
#include "kernels/sampling/greedy.h"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) greedy_step_kernel(const GreedyStepParams<T> p) {
  const int r = blockIdx.x;
  const T* row = p.logits + static_cast<int64_t>(r) * p.logits_stride;
  float best = -FLT_MAX;
  int idx = 0x7fffffff;
  for (int v = threadIdx.x; v < p.vocab; v += blockDim.x) {
    const float x = to_float(row[v]);
    // NaN never wins (comparisons with NaN are false), so a row of NaNs yields index 0 below.
    better(best, idx, x, v);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, off);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
    better(best, idx, ov, oi);
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    best = lane < nw ? sv[lane] : -FLT_MAX;
    idx = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, off);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
      better(best, idx, ov, oi);
    }
    if (lane == 0) {
      const int token = idx < p.vocab ? idx : 0;
      if (p.finished[r]) {
        p.next_tokens[r] = p.end_ids[r];
      } else {
        const int pos = p.cur_pos[r] + 1;
        p.next_tokens[r] = token;
        if (pos < p.output_stride) {
          p.output_ids[static_cast<int64_t>(r) * p.output_stride + pos] = token;
          p.cur_pos[r] = pos;
          p.attn_len[r] = pos + 1;
          p.seq_lengths[r] = pos + 1;
        }
        if (token == p.end_ids[r] || pos + 1 >= p.output_stride) p.finished[r] = 1;
      }
    }
  }
}

__global__ void all_finished_kernel(const int32_t* __restrict__ finished, int rows,
                                    int32_t* __restrict__ flag) {
  __shared__ int any_open;
  if (threadIdx.x == 0) any_open = 0;
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    if (!finished[r]) any_open = 1;
  }
  __syncthreads();
  if (threadIdx.x == 0) flag[0] = any_open ? 0 : 1;
}

}  // namespace

template <typename T>
cudaError_t launch_greedy_step(const GreedyStepParams<T>& p, cudaStream_t stream) {
  if (p.rows < 0 || p.vocab <= 0 || p.output_stride <= 0) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  greedy_step_kernel<T><<<p.rows, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_all_finished(const int32_t* finished, int rows, int32_t* flag,
                                cudaStream_t stream) {
  all_finished_kernel<<<1, 256, 0, stream>>>(finished, rows, flag);
  return cudaGetLastError();
}

template cudaError_t launch_greedy_step<float>(const GreedyStepParams<float>&, cudaStream_t);
template cudaError_t launch_greedy_step<__half>(const GreedyStepParams<__half>&, cudaStream_t);
template cudaError_t launch_greedy_step<__nv_bfloat16>(const GreedyStepParams<__nv_bfloat16>&,
                                                       cudaStream_t);

}  // namespace kernels
}  // namespace warpformer
