// Token embedding lookup plus optional learned position embedding.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace warpformer {
namespace kernels {

// Written by the embedding kernel when it meets an id it must not read. Each field holds the
// smallest offending token index, or kNoError. The kernel never reads outside the tables: an
// offending token's output row is written as zeros.
struct EmbeddingErrors {
  static constexpr int32_t kNoError = 0x7fffffff;
  int32_t bad_token;     // token index whose id is outside [0, vocab + extra_rows)
  int32_t bad_position;  // token index whose position is outside [0, max_positions)
};

template <typename T>
struct EmbeddingParams {
  T* out;                    // [tokens, hidden]
  const int32_t* ids;        // [tokens]
  const T* wte;              // [vocab, hidden]
  const T* wpe;              // [max_positions, hidden] or null
  const int32_t* positions;  // [tokens] or null: then position = (token index % seq_len)
  EmbeddingErrors* errors;   // device struct, initialised to kNoError by the caller; or null
  int64_t tokens;
  int hidden;
  int vocab;
  int max_positions;
  int seq_len;  // row length when positions are implicit
  float scale;  // multiplies the token embedding (1 for GPT-family models)
  // Prompt embeddings (FT's prompt tuning): ids vocab .. vocab + extra_rows - 1 read row
  // id - vocab of `extra` [extra_rows, hidden], taken as given (no scale), instead of wte.
  const T* extra = nullptr;
  int extra_rows = 0;
};

template <typename T>
cudaError_t launch_embedding(const EmbeddingParams<T>& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace warpformer
