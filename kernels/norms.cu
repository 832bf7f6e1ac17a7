// LayerNorm / RMSNorm with fused residual and bias adds (see norms.h for the contract).
//
// One block normalises one row. Rows of up to 512 * 8 vectors are held in registers between the
// statistics pass and the output pass, so the row is read from memory once; longer rows fall back
// to re-reading it (from residual_out when that was written, since it may alias an input). The
// statistics are fp32 sums of x - shift and of its squares, reduced together (norm::row_stats),
// with an exact second pass for the rare row that needs it.
#include "kernels/common.cuh"
#include "kernels/norm_math.cuh"
#include "kernels/norms.h"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kMaxThreads = 512;
constexpr int kTargetThreads = 128;

template <typename T, int VEC>
__device__ __forceinline__ void store_normed(const NormParams<T>& p, int64_t row_off, int col,
                                             const float (&x)[VEC], float mean, float rstd) {
  float y[VEC];
  norm::normalize<T, VEC>(p, col, x, mean, rstd, y);
  store_vec<T, VEC>(p.out + row_off + col, y);
}

// ITEMS > 0: each thread keeps ITEMS vectors of the row in registers. ITEMS == 0: re-read.
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kMaxThreads) norm_kernel(const NormParams<T> p) {
  wait_for_prior_kernels();
  if (p.rows <= kEarlyStartRows) start_next_kernel();  // decode-sized: a GEMV follows
  __shared__ float2 scratch[32];
  const int64_t row_off = static_cast<int64_t>(blockIdx.x) * p.hidden;
  const int nvec = p.hidden / VEC;
  const bool layer_norm = p.kind == NormKind::kLayerNorm;
  const float inv_n = 1.f / static_cast<float>(p.hidden);
  if (p.kind == NormKind::kAddOnly) {  // residual/bias add only (a layer with no norm after it)
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
      float x[VEC];
      norm::load_x<T, VEC>(p, row_off, v * VEC, x);
      if (p.residual_out != nullptr) store_vec<T, VEC>(p.residual_out + row_off + v * VEC, x);
      if (p.out != p.residual_out) store_vec<T, VEC>(p.out + row_off + v * VEC, x);
    }
    return;
  }

  // LayerNorm sums x - shift, the shift being the mean of the row's first vector
  // (norm::vector_mean).
  float sum = 0.f, sq = 0.f;
  if constexpr (ITEMS > 0) {
    float x[ITEMS][VEC];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * blockDim.x;
      if (v < nvec) norm::load_x<T, VEC>(p, row_off, v * VEC, x[i]);
    }
    // Thread 0's first vector starts the row and gives the shift, shared through shared memory
    // rather than read again from global memory by every thread (a round trip more).
    __shared__ float shift_s;
    const float shift =
        layer_norm ? norm::from_thread0([&] { return norm::vector_mean<VEC>(x[0]); }, &shift_s)
                   : 0.f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * blockDim.x;
      if (v < nvec) {
        // Each thread writes only the vectors it read: residual_out may alias an input.
        if (p.residual_out != nullptr) store_vec<T, VEC>(p.residual_out + row_off + v * VEC, x[i]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) norm::accumulate(sum, sq, x[i][j], shift);
      }
    }
    norm::RowStats st = norm::row_stats(layer_norm, shift, sum, sq, inv_n, p.eps, scratch);
    if (__builtin_expect(st.refine, 0)) {
      float sum2 = 0.f, sq2 = 0.f;
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        if (threadIdx.x + i * blockDim.x < nvec) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) norm::accumulate(sum2, sq2, x[i][j], st.mean);
        }
      }
      norm::refine_stats(st, sum2, sq2, inv_n, p.eps, scratch);
    }
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * blockDim.x;
      if (v < nvec) store_normed<T, VEC>(p, row_off, v * VEC, x[i], st.mean, st.rstd);
    }
  } else {
    // Row too long for registers. After the first pass x lives in residual_out if requested.
    // Every thread must use the same shift: read it before anyone writes residual_out.
    const float shift = layer_norm ? norm::first_vector_mean<T, VEC>(p, row_off) : 0.f;
    if (layer_norm && p.residual_out != nullptr) __syncthreads();
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
      float x[VEC];
      norm::load_x<T, VEC>(p, row_off, v * VEC, x);
      if (p.residual_out != nullptr) store_vec<T, VEC>(p.residual_out + row_off + v * VEC, x);
#pragma unroll
      for (int j = 0; j < VEC; ++j) norm::accumulate(sum, sq, x[j], shift);
    }
    // Each element is re-read by the thread that wrote it, so no barrier is needed for that.
    auto reload = [&](int v, float (&x)[VEC]) {
      if (p.residual_out != nullptr) {
        load_vec<T, VEC>(p.residual_out + row_off + v * VEC, x);
      } else {
        norm::load_x<T, VEC>(p, row_off, v * VEC, x);
      }
    };
    norm::RowStats st = norm::row_stats(layer_norm, shift, sum, sq, inv_n, p.eps, scratch);
    if (__builtin_expect(st.refine, 0)) {
      float sum2 = 0.f, sq2 = 0.f;
      for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
        float x[VEC];
        reload(v, x);
#pragma unroll
        for (int j = 0; j < VEC; ++j) norm::accumulate(sum2, sq2, x[j], st.mean);
      }
      norm::refine_stats(st, sum2, sq2, inv_n, p.eps, scratch);
    }
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
      float x[VEC];
      reload(v, x);
      store_normed<T, VEC>(p, row_off, v * VEC, x, st.mean, st.rstd);
    }
  }
}

template <typename T, int VEC>
cudaError_t launch_with_vec(const NormParams<T>& p, cudaStream_t stream) {
  const NormShape ns = norm_shape(p.hidden, VEC);
  const int items = ns.items, threads = ns.threads;
  LaunchShape shape;
  shape.grid = dim3(static_cast<unsigned>(p.rows));
  shape.block = dim3(static_cast<unsigned>(threads));
  switch (items) {
    case 1: return launch_kernel(shape, stream, norm_kernel<T, VEC, 1>, p);
    case 2: return launch_kernel(shape, stream, norm_kernel<T, VEC, 2>, p);
    case 4: return launch_kernel(shape, stream, norm_kernel<T, VEC, 4>, p);
    case 8: return launch_kernel(shape, stream, norm_kernel<T, VEC, 8>, p);
    default: return launch_kernel(shape, stream, norm_kernel<T, VEC, 0>, p);
  }
}

}  // namespace

NormShape norm_shape(int hidden, int vec) {
  // Favour several vectors per thread over wide blocks: a thread's loads are all issued before the
  // first reduction, so ITEMS vectors per thread put ITEMS times more bytes in flight per SM (one
  // vector per thread left the norms well short of the copy bandwidth: benchmarks/HISTORY.md,
  // "Figures moved from code comments (issue 50)").
  const int nvec = hidden / vec;
  int items = 1;
  while (items < 8 && ceil_div(nvec, items) > kTargetThreads) items *= 2;
  while (items <= 8 && ceil_div(nvec, items) > kMaxThreads) items *= 2;
  if (items > 8) items = 0;
  const int threads = items == 0 ? kMaxThreads : ceil_div(ceil_div(nvec, items), 32) * 32;
  return NormShape{threads, items};
}

template <typename T>
cudaError_t launch_norm(const NormParams<T>& p, cudaStream_t stream) {
  if (p.rows < 0 || p.rows > 0x7fffffff || p.hidden <= 0 || p.out == nullptr ||
      p.input == nullptr || (p.gamma == nullptr && p.kind != NormKind::kAddOnly)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  const bool vec_ok = p.hidden % kVec == 0 && aligned_to(p.out, 16) &&
                      aligned_to(p.residual_out, 16) && aligned_to(p.input, 16) &&
                      aligned_to(p.residual, 16) && aligned_to(p.input_bias, 16) &&
                      aligned_to(p.gamma, 16) && aligned_to(p.beta, 16);
  return vec_ok ? launch_with_vec<T, kVec>(p, stream) : launch_with_vec<T, 1>(p, stream);
}

template cudaError_t launch_norm<float>(const NormParams<float>&, cudaStream_t);
template cudaError_t launch_norm<__half>(const NormParams<__half>&, cudaStream_t);
template cudaError_t launch_norm<__nv_bfloat16>(const NormParams<__nv_bfloat16>&, cudaStream_t);

}  // namespace kernels
}  // namespace warpformer
