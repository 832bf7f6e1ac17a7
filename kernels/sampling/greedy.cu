// Greedy step (see greedy.h): blocks reduce (value, index) pairs of a range of a row's logits,
// the lowest index winning ties like torch.argmax; the row's last block (or its only one) then
// updates the row's generation state. The order of (value desc, index asc) is total, so the
// result does not depend on how the vocabulary is split.
#include <algorithm>
#include <cfloat>

#include "kernels/common.cuh"
#include "kernels/sampling/argmax.cuh"
#include "kernels/sampling/greedy.h"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 4096;  // vocabulary entries per block, about
constexpr int kMaxChunks = 256;
constexpr int kChunkAlign = 8;  // chunk lengths are multiples of 16 bytes of any dtype

using argmax::block_best;
using argmax::keep_best;

template <typename T>
__device__ void update_row(const GreedyStepParams<T>& p, int r, int idx) {
  // NaN never wins (comparisons with NaN are false), so a row of NaNs yields token 0.
  const int token = idx < p.vocab ? idx : 0;
  if (p.finished[r]) {
    p.next_tokens[r] = p.end_ids[r];
    return;
  }
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

// Grid (rows, chunks): block (r, c) scans entries [c * chunk_len, (c + 1) * chunk_len) of row r,
// 16 bytes per load where the row is 16-byte aligned. Rows are on x, whose limit is 2^31 - 1
// (y's is 65,535).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    greedy_step_kernel(const GreedyStepParams<T> p, int chunk_len) {
  constexpr int V = 16 / sizeof(T);
  wait_for_prior_kernels();
  const int r = blockIdx.x, c = blockIdx.y, chunks = gridDim.y;
  const T* row = p.logits + static_cast<int64_t>(r) * p.logits_stride;
  const int beg = c * chunk_len, end = min(p.vocab, beg + chunk_len);
  __shared__ float sv[argmax::kBlockScratch];
  __shared__ int si[argmax::kBlockScratch];
  float best = -FLT_MAX;
  int idx = argmax::kNoIndex;
  int scalar_from = beg;
  if (reinterpret_cast<uintptr_t>(row) % 16 == 0) {  // beg is a multiple of V
    const int vend = beg + (max(end - beg, 0) / V) * V;
    for (int v = beg + static_cast<int>(threadIdx.x) * V; v < vend; v += kThreads * V) {
      float x[V];
      load_vec<T, V>(row + v, x);
#pragma unroll
      for (int j = 0; j < V; ++j) keep_best(best, idx, x[j], v + j);
    }
    scalar_from = vend;
  }
  for (int v = scalar_from + static_cast<int>(threadIdx.x); v < end; v += kThreads) {
    keep_best(best, idx, to_float(row[v]), v);
  }
  block_best(best, idx, sv, si);
  if (chunks == 1) {
    if (threadIdx.x == 0) update_row(p, r, idx);
    return;
  }
  __shared__ bool last;
  if (threadIdx.x == 0) {
    p.partial_values[static_cast<int64_t>(r) * chunks + c] = best;
    p.partial_indices[static_cast<int64_t>(r) * chunks + c] = idx;
    __threadfence();  // the partial result is visible before the arrival is counted
    last = atomicAdd(&p.arrivals[r], 1u) == static_cast<unsigned>(chunks - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The row's last block reduces the partial results, read from L2 (__ldcg): L1 is not coherent
  // with the other blocks' writes.
  best = -FLT_MAX;
  idx = argmax::kNoIndex;
  for (int i = threadIdx.x; i < chunks; i += kThreads) {
    keep_best(best, idx, __ldcg(p.partial_values + static_cast<int64_t>(r) * chunks + i),
              __ldcg(p.partial_indices + static_cast<int64_t>(r) * chunks + i));
  }
  block_best(best, idx, sv, si);
  if (threadIdx.x == 0) {
    update_row(p, r, idx);
    p.arrivals[r] = 0;  // ready for the next launch
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

// Entries per block: about kChunk, at most kMaxChunks blocks per row, a multiple of kChunkAlign.
int chunk_len(int vocab, bool split) {
  const int chunks = split ? std::min(kMaxChunks, ceil_div(vocab, kChunk)) : 1;
  return ceil_div(ceil_div(vocab, chunks), kChunkAlign) * kChunkAlign;
}

}  // namespace

int greedy_step_chunks(int vocab) {
  return vocab <= 0 ? 1 : ceil_div(vocab, chunk_len(vocab, true));
}

template <typename T>
cudaError_t launch_greedy_step(const GreedyStepParams<T>& p, cudaStream_t stream) {
  if (p.rows < 0 || p.vocab <= 0 || p.output_stride <= 0) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const bool split =
      p.arrivals != nullptr && p.partial_values != nullptr && p.partial_indices != nullptr;
  const int len = chunk_len(p.vocab, split);  // split: greedy_step_chunks(vocab) blocks a row
  LaunchShape shape;
  shape.grid = dim3(static_cast<unsigned>(p.rows), static_cast<unsigned>(ceil_div(p.vocab, len)));
  shape.block = dim3(kThreads);
  return launch_kernel(shape, stream, greedy_step_kernel<T>, p, len);
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
