#include "csrc/layers/embedding.h"

#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "csrc/core/check.h"
#include "csrc/layers/norm.h"
#include "kernels/embedding.h"
#include "kernels/gather.h"

namespace warpformer {
namespace layers {

void embed(const LayerContext& lc, const EmbeddingWeights& w, const int32_t* ids,
           const int32_t* positions, int64_t tokens, int64_t seq_len, void* x, void* emb_scratch,
           void* pos_scratch, const PromptTable& prompt) {
  const int64_t h = lc.spec->hidden, e = w.embed_dim;
  const bool narrow = w.project_in != nullptr;
  void* emb_out = narrow ? emb_scratch : x;
  WF_DISPATCH_FLOATING(lc.dtype, "embed", [&] {
    using T = scalar_t;
    kernels::EmbeddingParams<T> p{};
    p.out = static_cast<T*>(emb_out);
    p.ids = ids;
    p.wte = static_cast<const T*>(w.wte);
    // Learned positions are added to the token embedding only when both have width h; narrower
    // word embeddings (OPT-350m) are projected first and their positions added after (below).
    p.wpe = narrow ? nullptr : static_cast<const T*>(w.wpe);
    p.positions = positions;
    p.errors = nullptr;
    p.tokens = tokens;
    p.hidden = static_cast<int>(e);
    p.vocab = static_cast<int>(w.vocab);
    p.max_positions = static_cast<int>(w.max_positions);
    p.seq_len = static_cast<int>(seq_len);
    p.scale = 1.f;
    p.extra = static_cast<const T*>(prompt.rows);
    p.extra_rows = static_cast<int>(prompt.count);
    WF_CUDA_CHECK(kernels::launch_embedding(p, lc.ctx->stream()));
    if (!narrow) return;
    lc.gemm->run(lc.dtype, emb_out, w.project_in, nullptr, x, tokens, h, e);
    if (w.wpe == nullptr) return;
    // x += wpe[positions]: an embedding lookup of the positions, then an add.
    kernels::EmbeddingParams<T> q{};
    q.out = static_cast<T*>(pos_scratch);
    q.ids = positions;
    q.wte = static_cast<const T*>(w.wpe);
    q.tokens = tokens;
    q.hidden = static_cast<int>(h);
    q.vocab = static_cast<int>(w.max_positions);
    q.scale = 1.f;
    WF_CUDA_CHECK(kernels::launch_embedding(q, lc.ctx->stream()));
    add_and_norm(lc, pos_scratch, x, nullptr, NextNorm{}, nullptr, tokens, h);
  });
  // In place: the norms kernel reads a row before it writes it.
  if (w.norm.gamma != nullptr) apply_norm(lc, lc.spec->norm, w.norm, x, x, tokens, h);
}

void lm_head(const LayerContext& lc, const LmHeadWeights& w, const void* hidden, int64_t rows,
             void* out, const LmHeadScratch& s) {
  const int64_t h = lc.spec->hidden, e = w.embed_dim, vl = w.local_vocab, tp = w.tp;
  const size_t es = dtype_size(lc.dtype);
  TORCH_CHECK(tp == 1 || (lc.comm != nullptr && lc.comm->size() == tp),
              "lm_head: tensor_para_size is ", tp,
              " but no tensor-parallel communicator of that size is attached "
              "(warpformer.distributed attaches it)");
  if (w.project_out == nullptr && tp == 1) {
    lc.gemm->run_transposed(lc.dtype, hidden, w.weight, w.bias, out, rows, vl, e);
    return;
  }
  // Chunks of at most s.rows rows through the scratch buffers: project_out, then this rank's
  // vocabulary slice, all-gathered and interleaved into [rows, tp * vl].
  for (int64_t r0 = 0; r0 < rows; r0 += s.rows) {
    const int64_t n = std::min(s.rows, rows - r0);
    const void* in = static_cast<const char*>(hidden) + r0 * h * es;
    if (w.project_out != nullptr) {
      lc.gemm->run(lc.dtype, in, w.project_out, nullptr, s.proj, n, e, h);
      in = s.proj;
    }
    void* dst = static_cast<char*>(out) + r0 * tp * vl * es;
    if (tp == 1) {
      lc.gemm->run_transposed(lc.dtype, in, w.weight, w.bias, dst, n, vl, e);
      continue;
    }
    lc.gemm->run_transposed(lc.dtype, in, w.weight, w.bias, s.local, n, vl, e);
    lc.comm->all_gather(s.local, s.gathered, n * vl, lc.dtype, lc.ctx->stream());
    WF_CUDA_CHECK(
        kernels::launch_interleave_rank_blocks(dst, s.gathered, n, tp, vl * es, lc.ctx->stream()));
  }
}

}  // namespace layers
}  // namespace warpformer
