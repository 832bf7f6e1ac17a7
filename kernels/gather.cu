// Row gather/scatter (see gather.h). grid.y walks rows, grid.x x threads walk 16-byte (or 4-byte,
// or 1-byte when unaligned) words of a row.
#include "kernels/common.cuh"
#include "kernels/gather.h"

namespace warpformer {
namespace kernels {
namespace {

// Where row r moves (source and destination row, in rows of the strides), or false to leave it.
struct GatherIndex {
  const int32_t* index;
  __device__ bool operator()(int64_t r, int64_t* s, int64_t* d) const {
    *s = index[r];
    *d = r;
    return true;
  }
};
struct ScatterIndex {
  const int32_t* index;
  __device__ bool operator()(int64_t r, int64_t* s, int64_t* d) const {
    *s = r;
    *d = index[r];
    return true;
  }
};
// launch_scatter_rows_to_columns: column index[r] + offset - base[r] of destination row r.
struct ColumnIndex {
  const int32_t* index;
  const int32_t* base;
  const int32_t* skip;
  int32_t offset;
  int64_t columns;
  __device__ bool operator()(int64_t r, int64_t* s, int64_t* d) const {
    if (skip != nullptr && skip[r] != 0) return false;
    const int64_t c = static_cast<int64_t>(index[r]) + offset - (base != nullptr ? base[r] : 0);
    if (c < 0 || c >= columns) return false;
    *s = r;
    *d = r * columns + c;
    return true;
  }
};

template <typename W, typename Index>
__global__ void move_rows_kernel(char* dst, const char* src, const Index index, int64_t n_rows,
                                 int64_t words_per_row, int64_t src_stride, int64_t dst_stride) {
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) {
    int64_t s = 0, d = 0;
    if (!index(r, &s, &d)) continue;
    const W* srow = reinterpret_cast<const W*>(src) + s * src_stride;
    W* drow = reinterpret_cast<W*>(dst) + d * dst_stride;
    for (int64_t w = blockIdx.x * blockDim.x + threadIdx.x; w < words_per_row;
         w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      drow[w] = srow[w];
    }
  }
}

// Strides in bytes; the widest word (16, 4 or 2 bytes, else 1) that divides the row, both
// strides and both pointers' alignment moves the rows. `index_ok`: the index arrays are given.
template <typename Index>
cudaError_t launch(void* dst, const void* src, const Index& index, bool index_ok, int64_t n_rows,
                   int64_t row_bytes, int64_t src_stride, int64_t dst_stride, cudaStream_t stream) {
  if (n_rows < 0 || row_bytes <= 0 || src_stride < row_bytes || dst_stride < row_bytes ||
      dst == nullptr || src == nullptr || !index_ok) {
    return n_rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
  }
  if (n_rows == 0) return cudaSuccess;
  const unsigned gy = static_cast<unsigned>(n_rows < 65535 ? n_rows : 65535);
  auto go = [&](auto word) {
    using W = decltype(word);
    const int64_t size = static_cast<int64_t>(sizeof(W));
    const int64_t words = row_bytes / size;
    const int threads =
        words >= 256 ? 256 : static_cast<int>(ceil_div(static_cast<int>(words), 32) * 32);
    const int64_t gx = (words + threads - 1) / threads;
    const dim3 grid(static_cast<unsigned>(gx < 64 ? gx : 64), gy);
    move_rows_kernel<W, Index>
        <<<grid, threads, 0, stream>>>(static_cast<char*>(dst), static_cast<const char*>(src),
                                       index, n_rows, words, src_stride / size, dst_stride / size);
    return cudaGetLastError();
  };
  auto fits = [&](int bytes) {
    return row_bytes % bytes == 0 && src_stride % bytes == 0 && dst_stride % bytes == 0 &&
           aligned_to(dst, bytes) && aligned_to(src, bytes);
  };
  if (fits(16)) return go(uint4{});
  if (fits(4)) return go(uint32_t{});
  if (fits(2)) return go(uint16_t{});
  return go(char{});
}

template <typename W>
__global__ void interleave_kernel(char* dst, const char* src, int64_t rows, int64_t ranks,
                                  int64_t words) {
  for (int64_t i = blockIdx.y; i < rows * ranks; i += gridDim.y) {
    const int64_t r = i / ranks, t = i % ranks;
    const W* s = reinterpret_cast<const W*>(src) + (t * rows + r) * words;
    W* d = reinterpret_cast<W*>(dst) + i * words;
    for (int64_t w = blockIdx.x * blockDim.x + threadIdx.x; w < words;
         w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      d[w] = s[w];
    }
  }
}

}  // namespace

cudaError_t launch_interleave_rank_blocks(void* dst, const void* src, int64_t rows, int64_t ranks,
                                          int64_t row_bytes, cudaStream_t stream) {
  if (rows < 0 || ranks < 1 || row_bytes <= 0 || dst == nullptr || src == nullptr) {
    return rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  const int64_t n = rows * ranks;
  const unsigned gy = static_cast<unsigned>(n < 65535 ? n : 65535);
  auto go = [&](auto word) {
    using W = decltype(word);
    const int64_t words = row_bytes / static_cast<int64_t>(sizeof(W));
    const int threads = words >= 256 ? 256 : static_cast<int>((words + 31) / 32 * 32);
    const int64_t gx = (words + threads - 1) / threads;
    const dim3 grid(static_cast<unsigned>(gx < 64 ? gx : 64), gy);
    interleave_kernel<W><<<grid, threads, 0, stream>>>(
        static_cast<char*>(dst), static_cast<const char*>(src), rows, ranks, words);
    return cudaGetLastError();
  };
  if (row_bytes % 16 == 0 && aligned_to(dst, 16) && aligned_to(src, 16)) return go(uint4{});
  if (row_bytes % 4 == 0 && aligned_to(dst, 4) && aligned_to(src, 4)) return go(uint32_t{});
  return go(char{});
}

cudaError_t launch_gather_rows(void* dst, const void* src, const int32_t* src_rows, int64_t n_rows,
                               int64_t row_bytes, cudaStream_t stream) {
  return launch(dst, src, GatherIndex{src_rows}, src_rows != nullptr, n_rows, row_bytes, row_bytes,
                row_bytes, stream);
}

cudaError_t launch_scatter_rows(void* dst, const void* src, const int32_t* dst_rows, int64_t n_rows,
                                int64_t row_bytes, cudaStream_t stream, int64_t src_stride) {
  return launch(dst, src, ScatterIndex{dst_rows}, dst_rows != nullptr, n_rows, row_bytes,
                src_stride > 0 ? src_stride : row_bytes, row_bytes, stream);
}

cudaError_t launch_scatter_rows_to_columns(void* dst, const void* src, const int32_t* index,
                                           const int32_t* base, int32_t offset, const int32_t* skip,
                                           int64_t n_rows, int64_t columns, int64_t row_bytes,
                                           cudaStream_t stream, int64_t src_stride) {
  return launch(dst, src, ColumnIndex{index, base, skip, offset, columns},
                index != nullptr && columns >= 0, n_rows, row_bytes,
                src_stride > 0 ? src_stride : row_bytes, row_bytes, stream);
}

}  // namespace kernels
}  // namespace warpformer
