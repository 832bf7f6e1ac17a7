#include "csrc/models/gpt/gpt_model.h"

#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <vector>

#include "csrc/core/check.h"
#include "kernels/attention/attention.h"
#include "kernels/embedding.h"
#include "kernels/gather.h"
#include "kernels/gemv.h"

namespace warpformer {
namespace gpt {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Carves aligned sub-buffers out of one allocation.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  void* take(size_t bytes) {
    void* p = base_ == nullptr ? nullptr : base_ + off_;
    off_ += align_up(bytes);
    return p;
  }
  size_t used() const { return off_; }

 private:
  char* base_;
  size_t off_ = 0;
};

// Grow policy: at least what is needed, at least 1.5x the previous size (fewer regrowths when
// calls creep upwards), at most the limit.
int64_t grown(int64_t need, int64_t have, int64_t limit) {
  if (need <= have) return have;
  return std::max(need, std::min(limit, have + have / 2));
}

}  // namespace

GptModel::GptModel(GptConfig cfg, GptWeights weights, DType dtype, std::shared_ptr<CudaContext> ctx,
                   int64_t max_batch, int64_t max_seq_len, const EngineOptions& options,
                   Communicator* tp_comm)
    : cfg_(std::move(cfg)),
      options_(options),
      w_(std::move(weights)),
      dtype_(dtype),
      ctx_(std::move(ctx)),
      gemm_(std::make_unique<Gemm>(ctx_.get())),
      comm_(tp_comm),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len) {
  TORCH_CHECK(max_batch_ > 0, "GptModel: max_batch must be positive, got ", max_batch_);
  prefill_group_tokens_ = prefill_group_size();
  // The weights are written only before the model is built; every forward starts with the
  // embedding (or a pipeline receive), never with a product, so no product's weight is written
  // by the kernel just before it.
  gemm_->set_static_weights(true);
  TORCH_CHECK(max_seq_len_ > 0, "GptModel: max_seq_len must be positive, got ", max_seq_len_);
  if (cfg_.has_positional_encoding) {
    TORCH_CHECK(max_seq_len_ <= cfg_.max_pos_seq_len, "GptModel: max_seq_len (", max_seq_len_,
                ") exceeds the position table (max_pos_seq_len = ", cfg_.max_pos_seq_len, ")");
  }
  TORCH_CHECK(static_cast<int64_t>(w_.layers.size()) == cfg_.end_layer() - cfg_.first_layer(),
              "GptModel: got ", w_.layers.size(), " layers of weights for a stage of ",
              cfg_.end_layer() - cfg_.first_layer());
  if (cfg_.use_attention_linear_bias) {
    const std::vector<float> all = kernels::alibi_slopes(static_cast<int>(cfg_.head_num));
    const int64_t lh = cfg_.local_heads();
    alibi_ = DeviceBuffer(ctx_->allocator(), lh * sizeof(float), ctx_->stream());
    WF_CUDA_CHECK(cudaMemcpyAsync(alibi_.data(), all.data() + cfg_.tensor_para_rank * lh,
                                  lh * sizeof(float), cudaMemcpyHostToDevice, ctx_->stream()));
  }
  if (cfg_.rotary_embedding_dim > 0) {
    const int rd = static_cast<int>(cfg_.rotary_embedding_dim);
    rotary_inv_freq_ = DeviceBuffer(ctx_->allocator(), rd / 2 * sizeof(float), ctx_->stream());
    WF_CUDA_CHECK(kernels::launch_rotary_inv_freq(
        rotary_inv_freq_.as<float>(), rd, static_cast<float>(cfg_.rotary_base), ctx_->stream()));
  }
}

void GptModel::ensure_kv(int64_t slots, int64_t seq_total) {
  // Beam search needs batch * beam rows; max_batch bounds the batch (checked by the caller).
  TORCH_CHECK(slots <= max_batch_ * kernels::kMaxBeamWidth, "GptModel: ", slots,
              " sequences exceed max_batch (", max_batch_, ") x the largest beam width");
  TORCH_CHECK(seq_total <= max_seq_len_, "GptModel: input length + output length = ", seq_total,
              " exceeds max_seq_len (", max_seq_len_, ") given at construction");
  if (slots <= kv_slots_ && seq_total <= kv_seq_) return;
  const int64_t new_slots = grown(slots, kv_slots_, max_batch_ * kernels::kMaxBeamWidth);
  const int64_t new_seq = grown(seq_total, kv_seq_, max_seq_len_);
  const int64_t layers = cfg_.end_layer() - cfg_.first_layer();
  const size_t bytes = static_cast<size_t>(layers) * 2 * new_slots * cfg_.local_heads() * new_seq *
                       cfg_.size_per_head * dtype_size(dtype_);
  kv_.reset();              // free first so the allocator can reuse the block
  kv_slots_ = kv_seq_ = 0;  // a failed allocation below must not leave stale sizes behind
  ++buffer_generation_;
  kv_ = DeviceBuffer(ctx_->allocator(), bytes, ctx_->stream());
  kv_slots_ = new_slots;
  kv_seq_ = new_seq;
}

void GptModel::ensure_activations(int64_t tokens, int64_t batch) {
  if (tokens <= act_tokens_ && batch <= act_batch_) return;
  const int64_t t =
      grown(tokens, act_tokens_, std::max<int64_t>(tokens, max_batch_ * max_seq_len_));
  const int64_t b = grown(batch, act_batch_, max_batch_ * kernels::kMaxBeamWidth);
  const size_t bytes = layout(nullptr, t, b, nullptr, nullptr);
  act_.reset();
  act_tokens_ = act_batch_ = 0;  // a failed allocation below must not leave stale sizes behind
  ++buffer_generation_;
  act_ = DeviceBuffer(ctx_->allocator(), bytes, ctx_->stream());
  act_tokens_ = t;
  act_batch_ = b;
}

size_t GptModel::layout(void* base, int64_t t, int64_t rows, layers::LayerBuffers* layer,
                        Scratch* scratch) const {
  const int64_t h = cfg_.hidden(), lh = cfg_.local_hidden(), li = cfg_.local_inter();
  const int64_t e = cfg_.embed_dim();
  const size_t es = dtype_size(dtype_);
  Carver c(base);
  layers::LayerBuffers b{};
  b.x = c.take(t * h * es);
  b.n = c.take(t * h * es);
  // Pre-norm layers move the stream into y only at up to kGemvMaxRows rows (ResidualStream);
  // post-norm layers hold ln1's output there.
  b.y_rows = cfg_.pre_layernorm ? std::min<int64_t>(t, kernels::kGemvMaxRows) : t;
  b.y = c.take(b.y_rows * h * es);
  b.p = c.take(t * h * es);
  // The MLP output is written after the attention projection was consumed (added into the
  // residual, or accumulated into in the parallel form), so they share one buffer.
  b.o = b.p;
  // qkv, q and the attention output are dead once the attention projection ran, before the
  // MLP hidden is written: one region serves both.
  const size_t attn_bytes = align_up(t * 3 * lh * es) + 2 * align_up(t * lh * es);
  char* region = static_cast<char*>(c.take(std::max(attn_bytes, align_up(t * li * es))));
  if (region != nullptr) {
    b.qkv = region;
    b.q = region + align_up(t * 3 * lh * es);
    b.a = region + align_up(t * 3 * lh * es) + align_up(t * lh * es);
    b.f = region;
  }
  // The MLP hidden of a parallel-residual layer at decode sizes (up to kGemvMaxRows rows): live
  // together with qkv and the attention output, so apart from them.
  b.fj = cfg_.parallel_residual && cfg_.pre_layernorm
             ? c.take(std::min<int64_t>(t, kernels::kGemvMaxRows) * li * es)
             : nullptr;
  Scratch sc{};
  sc.emb = cfg_.word_embed_proj_dim > 0 ? c.take(t * e * es) : nullptr;
  sc.last_rows = c.take(rows * std::max(h, e) * es);
  sc.proj = c.take(rows * std::max(h, e) * es);
  sc.last_logits = c.take(rows * cfg_.vocab_padded() * es);
  sc.tp_local = cfg_.tensor_para_size > 1 ? c.take(rows * cfg_.local_vocab() * es) : nullptr;
  sc.tp_gathered = cfg_.tensor_para_size > 1 ? c.take(rows * cfg_.vocab_padded() * es) : nullptr;
  if (layer != nullptr) *layer = b;
  if (scratch != nullptr) *scratch = sc;
  return c.used();
}

layers::LayerBuffers GptModel::buffers() const {
  layers::LayerBuffers b{};
  layout(act_.data(), act_tokens_, act_batch_, &b, nullptr);
  return b;
}

GptModel::Scratch GptModel::scratch() const {
  Scratch s{};
  layout(act_.data(), act_tokens_, act_batch_, nullptr, &s);
  return s;
}

layers::LayerContext GptModel::layer_context() {
  return layers::LayerContext{ctx_.get(), gemm_.get(), comm_, &cfg_, dtype_};
}

void GptModel::embed(const int32_t* token_ids, const int32_t* positions, int64_t tokens,
                     int64_t seq_len) {
  const layers::LayerBuffers b = buffers();
  const int64_t h = cfg_.hidden(), e = cfg_.embed_dim();
  void* emb_out = cfg_.word_embed_proj_dim > 0 ? scratch().emb : b.x;
  WF_DISPATCH_FLOATING(dtype_, "GptModel.embed", [&] {
    kernels::EmbeddingParams<scalar_t> p{};
    p.out = static_cast<scalar_t*>(emb_out);
    p.ids = token_ids;
    p.wte = static_cast<const scalar_t*>(w_.wte);
    // Learned positions are added to the token embedding only when both have width h; OPT-350m's
    // narrower word embeddings are projected first and its positions added after (below).
    const bool pos_here = w_.wpe != nullptr && cfg_.word_embed_proj_dim == 0;
    p.wpe = pos_here ? static_cast<const scalar_t*>(w_.wpe) : nullptr;
    p.positions = positions;
    p.errors = nullptr;  // ids were range-checked by the caller
    p.tokens = tokens;
    p.hidden = static_cast<int>(e);
    p.vocab = static_cast<int>(cfg_.vocab_size);
    p.max_positions = static_cast<int>(cfg_.max_pos_seq_len);
    p.seq_len = static_cast<int>(seq_len);
    p.scale = 1.f;
    WF_CUDA_CHECK(kernels::launch_embedding(p, ctx_->stream()));
    if (cfg_.word_embed_proj_dim > 0) {
      gemm_->run(dtype_, emb_out, w_.project_in, nullptr, b.x, tokens, h, e);
      if (w_.wpe != nullptr) {
        // x += wpe[positions]: an embedding lookup of the positions into n, then an add.
        kernels::EmbeddingParams<scalar_t> q{};
        q.out = static_cast<scalar_t*>(b.n);
        q.ids = positions;
        q.wte = static_cast<const scalar_t*>(w_.wpe);
        q.tokens = tokens;
        q.hidden = static_cast<int>(h);
        q.vocab = static_cast<int>(cfg_.max_pos_seq_len);
        q.scale = 1.f;
        WF_CUDA_CHECK(kernels::launch_embedding(q, ctx_->stream()));
        layers::add_and_norm(layer_context(), b.n, b.x, nullptr, layers::NextNorm{}, nullptr,
                             tokens, h);
      }
    }
  });
  if (cfg_.has_pre_decoder_layernorm) {
    const layers::LayerContext lc = layer_context();
    // In place: the norms kernel reads a row before it writes it.
    layers::apply_norm(lc, kernels::NormKind::kLayerNorm, w_.pre_ln_w, w_.pre_ln_b, b.x, b.x,
                       tokens, h);
  }
}

void GptModel::run_layers(int64_t tokens, const layers::AttentionInputs& base) {
  const layers::LayerContext lc = layer_context();
  const layers::LayerBuffers b = buffers();
  const int64_t h = cfg_.hidden();
  const int64_t n_local = static_cast<int64_t>(w_.layers.size());
  const size_t layer_kv = static_cast<size_t>(kv_slots_) * cfg_.local_heads() * kv_seq_ *
                          cfg_.size_per_head * dtype_size(dtype_);
  using kernels::NormKind;
  // Pre-norm layers normalise their own input (each layer's QKV product applies the previous
  // layer's last residual add and its input norm); post-norm layers end with the next norm.
  layers::ResidualStream stream{b.x};
  for (int64_t l = 0; l < n_local; ++l) {
    layers::AttentionInputs ai = base;
    ai.k_cache = static_cast<char*>(kv_.data()) + (2 * l) * layer_kv;
    ai.v_cache = static_cast<char*>(kv_.data()) + (2 * l + 1) * layer_kv;
    layers::NextNorm next;
    if (l + 1 < n_local) {
      if (cfg_.pre_layernorm) next.defer = true;
    } else if (cfg_.last_stage() && cfg_.has_post_decoder_layernorm) {
      next = {NormKind::kLayerNorm, w_.final_ln_w, w_.final_ln_b};
    }
    layers::decoder_layer_forward(lc, w_.layers[l], b, tokens, ai, next, &stream);
  }
  // Make `n` hold the final hidden states whatever the last layer's form was.
  const bool normed_in_n = n_local > 0 && cfg_.has_post_decoder_layernorm && cfg_.last_stage();
  if (!normed_in_n) {
    if (n_local == 0 && cfg_.has_post_decoder_layernorm && cfg_.last_stage()) {
      layers::apply_norm(lc, NormKind::kLayerNorm, w_.final_ln_w, w_.final_ln_b, b.x, b.n, tokens,
                         h);
    } else {
      WF_CUDA_CHECK(cudaMemcpyAsync(b.n, b.x, tokens * h * dtype_size(dtype_),
                                    cudaMemcpyDeviceToDevice, ctx_->stream()));
    }
  }
}

void GptModel::logits(const void* hidden, int64_t rows, void* out) {
  const int64_t h = cfg_.hidden(), e = cfg_.embed_dim();
  const int64_t vl = cfg_.local_vocab(), vp = cfg_.vocab_padded();
  const int64_t tp = cfg_.tensor_para_size;
  const size_t es = dtype_size(dtype_);
  TORCH_CHECK(tp == 1 || (comm_ != nullptr && comm_->size() == tp),
              "GptModel: tensor_para_size is ", tp,
              " but no tensor-parallel communicator of that "
              "size is attached (warpformer.distributed attaches it)");
  if (w_.project_out == nullptr && tp == 1) {
    gemm_->run_transposed(dtype_, hidden, w_.lm_head, w_.lm_head_b, out, rows, vl, e);
    return;
  }
  // Chunks of at most act_batch_ rows through the scratch buffers: project_out (OPT-350m), then
  // this rank's vocab slice, all-gathered and interleaved into [rows, vocab_padded].
  const Scratch sc = scratch();
  const int64_t chunk = act_batch_;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    const void* in = static_cast<const char*>(hidden) + r0 * h * es;
    if (w_.project_out != nullptr) {
      gemm_->run(dtype_, in, w_.project_out, nullptr, sc.proj, n, e, h);
      in = sc.proj;
    }
    void* dst = static_cast<char*>(out) + r0 * vp * es;
    if (tp == 1) {
      gemm_->run_transposed(dtype_, in, w_.lm_head, w_.lm_head_b, dst, n, vl, e);
      continue;
    }
    gemm_->run_transposed(dtype_, in, w_.lm_head, w_.lm_head_b, sc.tp_local, n, vl, e);
    comm_->all_gather(sc.tp_local, sc.tp_gathered, n * vl, dtype_, ctx_->stream());
    WF_CUDA_CHECK(kernels::launch_interleave_rank_blocks(dst, sc.tp_gathered, n, tp, vl * es,
                                                         ctx_->stream()));
  }
}

void GptModel::set_tensor_parallel(Communicator* comm) {
  attach(comm, "tensor", cfg_.tensor_para_size, cfg_.tensor_para_rank, &comm_);
}

// Attaches `comm` as the `kind`-parallel group in `*slot` once it has the group's size and this
// rank's rank, and cut prompts and steps as this instance would.
void GptModel::attach(Communicator* comm, const char* kind, int64_t size, int64_t rank,
                      Communicator** slot) {
  TORCH_CHECK(!session_.active, "GptModel: cannot attach a communicator during generation");
  TORCH_CHECK(comm != nullptr && comm->size() == size && comm->rank() == rank, "GptModel: the ",
              kind, "-parallel communicator must have size ", kind, "_para_size (", size,
              ") and this rank's ", kind, "_para_rank (", rank, "); got size ",
              comm ? comm->size() : 0, ", rank ", comm ? comm->rank() : -1);
  check_same_schedule(comm, kind);
  // No step graph may outlive the communicator it baked (nor run on it while it is replaced).
  if (decode_stream_ != nullptr) WF_CUDA_CHECK(cudaStreamSynchronize(decode_stream_));
  drop_graphs(/*unshared_only=*/false);
  *slot = comm;
  ++buffer_generation_;
}

int64_t GptModel::prefill_group_size() const {
  if (options_.prefill_tokens > 0) return options_.prefill_tokens;
  int64_t tokens = kPrefillGroupTokens;
  while (tokens < kMaxPrefillGroupTokens &&
         2 * tokens * activation_bytes_per_token() <= kPrefillActivationBytes) {
    tokens *= 2;
  }
  return tokens;
}

int64_t GptModel::activation_bytes_per_token() const {
  const int64_t h = cfg_.hidden(), lh = cfg_.local_hidden(), li = cfg_.local_inter();
  const int64_t emb = cfg_.word_embed_proj_dim > 0 ? cfg_.embed_dim() : 0;
  const int64_t words = (cfg_.pre_layernorm ? 3 : 4) * h + std::max(5 * lh, li) + emb;
  return words * static_cast<int64_t>(dtype_size(dtype_));
}

int64_t GptModel::plan_prefill(const std::vector<int32_t>& lengths) {
  int64_t total = 0;
  for (int32_t l : lengths) total += l;
  // As few groups as the size allows, each closed once it reaches total / groups tokens (or when
  // the next sequence would take it over the size).
  const int64_t size = prefill_group_tokens_;
  const int64_t n = total / size + (total % size != 0);
  const int64_t target = total / n + (total % n != 0);
  groups_.clear();
  PrefillGroup g;
  int64_t t = 0, most = 0;
  auto close = [&](int64_t next_b) {
    g.t1 = t;
    most = std::max(most, g.tokens());
    groups_.push_back(g);
    g = PrefillGroup{next_b, next_b, t, t, 0};
  };
  const int64_t batch = static_cast<int64_t>(lengths.size());
  for (int64_t b = 0; b < batch; ++b) {
    if (g.b1 > g.b0 && t + lengths[b] - g.t0 > size) close(b);
    g.b1 = b + 1;
    g.max_len = std::max(g.max_len, lengths[b]);
    t += lengths[b];
    if (t - g.t0 >= target && b + 1 < batch) close(b + 1);
  }
  close(batch);
  prompt_tokens_ = groups_.size() == 1 ? prompt_graph_tokens(total) : 0;
  return std::max(most, prompt_tokens_);
}

void GptModel::check_same_schedule(Communicator* comm, const char* kind) {
  if (comm == nullptr || comm->size() == 1) return;
  // Every rank must cut the prompt into the same groups: their sizes are collective counts.
  const int size = comm->size();
  const int32_t mine = static_cast<int32_t>(prefill_group_tokens_);
  DeviceBuffer buf(ctx_->allocator(), (1 + size) * sizeof(int32_t), ctx_->stream());
  auto* d = buf.as<int32_t>();
  WF_CUDA_CHECK(cudaMemcpyAsync(d, &mine, sizeof(mine), cudaMemcpyHostToDevice, ctx_->stream()));
  comm->all_gather(d, d + 1, 1, DType::kFloat32, ctx_->stream());  // 4-byte words, bit for bit
  std::vector<int32_t> all(size);
  WF_CUDA_CHECK(cudaMemcpyAsync(all.data(), d + 1, all.size() * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, ctx_->stream()));
  WF_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream()));
  for (int r = 0; r < size; ++r) {
    TORCH_CHECK(all[r] == mine, "GptModel: the ranks of the ", kind,
                "-parallel group "
                "disagree on the prefill group size (",
                mine, " tokens on rank ", comm->rank(), ", ", all[r], " on rank ", r,
                "); pass the same prefill_tokens on every rank");
  }
}

void GptModel::prefill(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
                       int64_t slot_stride, const std::function<void(const PrefillGroup&)>& done) {
  const int64_t batch = static_cast<int64_t>(lengths.size());
  const int64_t real = groups_.back().t1;
  const int64_t n_groups = static_cast<int64_t>(groups_.size());
  // A pass that runs as a prompt graph (plan_prefill) packs `tokens` tokens, the real ones then
  // padding: token 0's id at position 0, its KV-cache write skipped (slot -1); the attention's
  // sequences (cu) cover the real tokens only, and every other kernel treats rows on their own.
  const int64_t tokens = std::max(real, prompt_tokens_);
  // Host-side index arrays, uploaded in one copy.
  const size_t o_gather = 0, o_slot = tokens, o_pos = 2 * tokens, o_ids = 3 * tokens;
  const size_t o_cu = 4 * tokens, o_iota = o_cu + batch + n_groups, o_last = o_iota + batch;
  std::vector<int32_t> host(o_last + batch);
  int64_t t = 0;
  for (int64_t gi = 0; gi < n_groups; ++gi) {
    const PrefillGroup& g = groups_[gi];
    int32_t* cu = host.data() + o_cu + g.b0 + gi;  // the group's b1 - b0 + 1 entries
    for (int64_t b = g.b0; b < g.b1; ++b) {
      const auto slot = static_cast<int32_t>(b * slot_stride);
      cu[b - g.b0] = static_cast<int32_t>(t - g.t0);
      host[o_iota + b] = slot;  // seq_slot of the context attention
      for (int32_t i = 0; i < lengths[b]; ++i, ++t) {
        host[o_gather + t] = static_cast<int32_t>(b * seq + i);
        host[o_slot + t] = slot;
        host[o_pos + t] = i;
      }
      host[o_last + b] = static_cast<int32_t>(t - 1 - g.t0);
    }
    cu[g.b1 - g.b0] = static_cast<int32_t>(t - g.t0);
  }
  for (; t < tokens; ++t) {
    host[o_gather + t] = 0;
    host[o_slot + t] = -1;
    host[o_pos + t] = 0;
  }
  const int64_t ints = static_cast<int64_t>(host.size());
  if (ints > meta_ints_) {
    // Grown by half at least: prompt graphs are keyed by the block they read (PromptKey::meta).
    const int64_t n = grown(ints, meta_ints_, 2 * ints);
    meta_.reset();
    meta_ints_ = 0;
    meta_ = DeviceBuffer(ctx_->allocator(), n * sizeof(int32_t), ctx_->stream());
    meta_ints_ = n;
  }
  auto* base = meta_.as<int32_t>();
  WF_CUDA_CHECK(cudaMemcpyAsync(base, host.data(), ints * sizeof(int32_t), cudaMemcpyHostToDevice,
                                ctx_->stream()));
  d_gather_ = base + o_gather;
  d_slot_ = base + o_slot;
  d_pos_ = base + o_pos;
  d_ids_ = base + o_ids;
  d_cu_ = base + o_cu;
  d_iota_ = base + o_iota;
  d_last_ = base + o_last;

  if (cfg_.first_stage()) {
    WF_CUDA_CHECK(kernels::launch_gather_rows(d_ids_, ids, d_gather_, tokens, sizeof(int32_t),
                                              ctx_->stream()));
  }
  for (int64_t gi = 0; gi < n_groups; ++gi) {
    const PrefillGroup& g = groups_[gi];
    layers::AttentionInputs ai{};
    ai.num_slots = static_cast<int>(kv_slots_);
    ai.max_seq = static_cast<int>(kv_seq_);
    ai.token_slot = d_slot_ + g.t0;
    ai.token_pos = d_pos_ + g.t0;
    ai.alibi_slopes = alibi_.as<float>();
    ai.decode = false;
    ai.cu_seqlens = d_cu_ + g.b0 + gi;
    ai.seq_slot = d_iota_ + g.b0;
    ai.batch = static_cast<int>(g.b1 - g.b0);
    ai.max_seqlen = g.max_len;
    if (prompt_tokens_ > 0) {
      // One group on one GPU: the attention grid for the longest sequence rounded up to 64
      // queries (the tiles past a sequence's end return at once), so that prompts of other
      // lengths share the graph.
      ai.max_seqlen = (g.max_len + 63) / 64 * 64;
      run_prompt(tokens, seq, ai);
    } else {
      prompt_body(g.t0, g.tokens(), seq, ai);
    }
    if (cfg_.last_stage()) {
      done(g);
    } else {
      stage_send(g.tokens());
    }
  }
}

void GptModel::prompt_body(int64_t t0, int64_t tokens, int64_t seq,
                           const layers::AttentionInputs& ai) {
  if (cfg_.first_stage()) {
    embed(d_ids_ + t0, d_pos_ + t0, tokens, seq);
  } else {
    stage_recv(tokens);
  }
  run_layers(tokens, ai);
}

void GptModel::stage_recv(int64_t tokens) {
  TORCH_CHECK(pp_comm_ != nullptr, "GptModel: pipeline_para_size is ", cfg_.pipeline_para_size,
              " but no pipeline-parallel communicator is attached (warpformer.distributed "
              "attaches it)");
  pp_comm_->recv(buffers().x, tokens * cfg_.hidden() * dtype_size(dtype_),
                 static_cast<int>(cfg_.pipeline_para_rank - 1), ctx_->stream());
}

void GptModel::stage_send(int64_t tokens) {
  TORCH_CHECK(pp_comm_ != nullptr, "GptModel: pipeline_para_size is ", cfg_.pipeline_para_size,
              " but no pipeline-parallel communicator is attached (warpformer.distributed "
              "attaches it)");
  pp_comm_->send(buffers().x, tokens * cfg_.hidden() * dtype_size(dtype_),
                 static_cast<int>(cfg_.pipeline_para_rank + 1), ctx_->stream());
}

void GptModel::set_pipeline_parallel(Communicator* comm) {
  attach(comm, "pipeline", cfg_.pipeline_para_size, cfg_.pipeline_para_rank, &pp_comm_);
}

void GptModel::broadcast_from_last_stage(void* data, int64_t bytes) {
  if (pp_comm_ == nullptr || pp_comm_->size() == 1 || bytes == 0) return;
  pp_comm_->broadcast(data, bytes, static_cast<int>(cfg_.pipeline_para_size - 1), ctx_->stream());
}

void GptModel::forward(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
                       void* logits_out) {
  // On the model's own stream, as generation: calls made from different caller streams then
  // never run on the shared buffers at once (a forward on one stream while a generate queued
  // from another still ran would have read and written the same activations).
  const StreamScope scope(this);
  const int64_t batch = static_cast<int64_t>(lengths.size());
  ensure_kv(batch, seq);
  const int64_t group_tokens = plan_prefill(lengths);
  ensure_activations(group_tokens, batch);
  const int64_t v = cfg_.vocab_size, vp = cfg_.vocab_padded();
  const size_t es = dtype_size(dtype_);
  const size_t row_bytes = v * es;
  // The logits of at most kPrefillGroupTokens rows at a time, [rows, vp], scattered to their
  // places without the vocab padding: a larger group (or one long sequence) costs no more memory.
  // Only real tokens get logits: a prompt graph's padded rows are not counted.
  int64_t real_most = 0;
  for (const PrefillGroup& g : groups_) real_most = std::max(real_most, g.tokens());
  const int64_t chunk = std::min(real_most, kPrefillGroupTokens);
  DeviceBuffer packed;
  if (cfg_.last_stage()) {
    packed = DeviceBuffer(ctx_->allocator(), chunk * vp * es, ctx_->stream());
    WF_CUDA_CHECK(cudaMemsetAsync(logits_out, 0, batch * seq * row_bytes, ctx_->stream()));
  }
  const size_t hidden_bytes = cfg_.hidden() * es;
  prefill(ids, lengths, seq, 1, [&](const PrefillGroup& g) {
    for (int64_t r0 = 0; r0 < g.tokens(); r0 += chunk) {
      const int64_t n = std::min(chunk, g.tokens() - r0);
      logits(static_cast<const char*>(buffers().n) + r0 * hidden_bytes, n, packed.data());
      WF_CUDA_CHECK(kernels::launch_scatter_rows(logits_out, packed.data(), d_gather_ + g.t0 + r0,
                                                 n, row_bytes, ctx_->stream(), vp * es));
    }
  });
  // The last stage computed the logits; every stage returns them.
  broadcast_from_last_stage(logits_out, batch * seq * row_bytes);
}

GptModel::~GptModel() {
  drop_graphs(/*unshared_only=*/false);
  if (decode_stream_ != nullptr) {
    cudaStreamSynchronize(decode_stream_);
    cudaStreamDestroy(decode_stream_);
  }
  if (order_event_ != nullptr) cudaEventDestroy(order_event_);
  if (flag_event_ != nullptr) {
    cudaEventSynchronize(flag_event_);
    cudaEventDestroy(flag_event_);
  }
  if (host_flag_ != nullptr) cudaFreeHost(host_flag_);
}

}  // namespace gpt
}  // namespace warpformer
