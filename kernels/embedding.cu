// Token + position embedding gather (see embedding.h). One block row per token: grid.x covers the
// hidden vectors, grid.y the tokens. Ids and positions are bounds-checked on the device; a bad one
// is recorded (smallest token index wins) and its row zeroed, never read out of bounds.
#include <climits>

#include "kernels/common.cuh"
#include "kernels/embedding.h"

namespace warpformer {
namespace kernels {
namespace {

template <typename T, int VEC>
__global__ void embedding_kernel(const EmbeddingParams<T> p) {
  const int col = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (col >= p.hidden) return;
  for (int64_t t = blockIdx.y; t < p.tokens; t += gridDim.y) {
    const int32_t id = p.ids[t];
    const bool in_vocab = id >= 0 && id < p.vocab;
    const bool id_ok = in_vocab || (id >= p.vocab && id - p.vocab < p.extra_rows);
    int32_t pos = 0;
    bool pos_ok = true;
    if (p.wpe != nullptr) {
      pos = p.positions != nullptr ? p.positions[t] : static_cast<int32_t>(t % p.seq_len);
      pos_ok = pos >= 0 && pos < p.max_positions;
    }
    float x[VEC];
    if (id_ok && pos_ok) {
      if (in_vocab) {
        load_vec<T, VEC>(p.wte + static_cast<int64_t>(id) * p.hidden + col, x);
#pragma unroll
        for (int j = 0; j < VEC; ++j) x[j] *= p.scale;
      } else {
        load_vec<T, VEC>(p.extra + static_cast<int64_t>(id - p.vocab) * p.hidden + col, x);
      }
      if (p.wpe != nullptr) {
        float w[VEC];
        load_vec<T, VEC>(p.wpe + static_cast<int64_t>(pos) * p.hidden + col, w);
#pragma unroll
        for (int j = 0; j < VEC; ++j) x[j] += w[j];
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[j] = 0.f;
      if (p.errors != nullptr && col == 0) {
        const int32_t ti = t < INT_MAX ? static_cast<int32_t>(t) : INT_MAX - 1;
        if (!id_ok) atomicMin(&p.errors->bad_token, ti);
        if (!pos_ok) atomicMin(&p.errors->bad_position, ti);
      }
    }
    store_vec<T, VEC>(p.out + t * p.hidden + col, x);
  }
}

template <typename T, int VEC>
cudaError_t launch_vec(const EmbeddingParams<T>& p, cudaStream_t stream) {
  const int nvec = p.hidden / VEC;
  const int threads = nvec >= 256 ? 256 : ceil_div(nvec, 32) * 32;
  const dim3 grid(ceil_div(nvec, threads),
                  static_cast<unsigned>(p.tokens < 65535 ? p.tokens : 65535));
  embedding_kernel<T, VEC><<<grid, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t launch_embedding(const EmbeddingParams<T>& p, cudaStream_t stream) {
  if (p.tokens < 0 || p.hidden <= 0 || p.vocab <= 0 || p.out == nullptr || p.ids == nullptr ||
      p.wte == nullptr || (p.wpe != nullptr && p.max_positions <= 0) ||
      (p.wpe != nullptr && p.positions == nullptr && p.seq_len <= 0) || p.extra_rows < 0 ||
      (p.extra_rows > 0 && p.extra == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (p.tokens == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  const bool vec_ok = p.hidden % kVec == 0 && aligned_to(p.out, 16) && aligned_to(p.wte, 16) &&
                      aligned_to(p.wpe, 16) && aligned_to(p.extra, 16);
  return vec_ok ? launch_vec<T, kVec>(p, stream) : launch_vec<T, 1>(p, stream);
}

template cudaError_t launch_embedding<float>(const EmbeddingParams<float>&, cudaStream_t);
template cudaError_t launch_embedding<__half>(const EmbeddingParams<__half>&, cudaStream_t);
template cudaError_t launch_embedding<__nv_bfloat16>(const EmbeddingParams<__nv_bfloat16>&,
                                                     cudaStream_t);

}  // namespace kernels
}  // namespace warpformer
