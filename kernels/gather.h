// Row gather/scatter by index, used to pack padded batches into token rows and back, and to pick
// each sequence's last token. Rows are opaque bytes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace warpformer {
namespace kernels {

// dst[i] = src[src_rows[i]] for i < n_rows (each row row_bytes long; rows contiguous).
cudaError_t launch_gather_rows(void* dst,                // [n_rows, row_bytes]
                               const void* src,          // [*, row_bytes]
                               const int32_t* src_rows,  // [n_rows]
                               int64_t n_rows, int64_t row_bytes, cudaStream_t stream);

// dst[dst_rows[i]] = src[i] for i < n_rows; src's rows are src_stride bytes apart (0: row_bytes),
// so the first row_bytes of padded rows can be scattered without compacting them first.
cudaError_t launch_scatter_rows(void* dst,                // [*, row_bytes]
                                const void* src,          // [n_rows, src_stride]
                                const int32_t* dst_rows,  // [n_rows]
                                int64_t n_rows, int64_t row_bytes, cudaStream_t stream,
                                int64_t src_stride = 0);

// dst[r, c] = src[r] for r < n_rows, dst being [n_rows, columns] rows of row_bytes, at the column
// c = index[r] + offset - base[r] (base null: 0) computed on the device; rows whose c falls
// outside [0, columns) or whose skip[r] is nonzero (skip null: none) are left as they are. A
// per-row output place that the device state decides, so a launch replayed from a CUDA graph
// writes where the state says (a decode step's hidden state into the column of the token it
// predicts). src's rows are src_stride bytes apart (0: row_bytes).
cudaError_t launch_scatter_rows_to_columns(void* dst,             // [n_rows, columns, row_bytes]
                                           const void* src,       // [n_rows, src_stride]
                                           const int32_t* index,  // [n_rows]
                                           const int32_t* base,   // [n_rows] or null
                                           int32_t offset,
                                           const int32_t* skip,  // [n_rows] or null
                                           int64_t n_rows, int64_t columns, int64_t row_bytes,
                                           cudaStream_t stream, int64_t src_stride = 0);

// dst[r, t * row_bytes ...] = src[t * rows + r]: turns an all-gather of per-rank [rows, part]
// blocks ([ranks, rows, part]) into [rows, ranks * part] (vocab-parallel logits).
cudaError_t launch_interleave_rank_blocks(void* dst,        // [rows, ranks * row_bytes]
                                          const void* src,  // [ranks, rows, row_bytes]
                                          int64_t rows, int64_t ranks, int64_t row_bytes,
                                          cudaStream_t stream);

}  // namespace kernels
}  // namespace warpformer
