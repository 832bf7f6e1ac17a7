#include "csrc/models/gpt/gpt_model.h"

#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "csrc/core/carve.h"
#include "csrc/core/check.h"
#include "csrc/generation/prompt_plan.h"
#include "kernels/attention/attention.h"
#include "kernels/embedding.h"
#include "kernels/gather.h"
#include "kernels/gemv.h"
#include "kernels/sampling/beam_search.h"

namespace warpformer {
namespace gpt {
GptModel::GptModel(GptConfig cfg, GptWeights weights, DType dtype, std::shared_ptr<CudaContext> ctx,
                   int64_t max_batch, int64_t max_seq_len, const EngineOptions& options,
                   Communicator* tp_comm)
    : cfg_(std::move(cfg)),
      spec_(layer_spec(cfg_)),
      options_(options),
      w_(std::move(weights)),
      dtype_(dtype),
      ctx_(std::move(ctx)),
      gemm_(std::make_unique<Gemm>(ctx_.get())),
      comm_(tp_comm),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len) {
  TORCH_CHECK(max_batch_ > 0, "GptModel: max_batch must be positive, got ", max_batch_);
  spec_.check();
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
  // transformers' dynamic scaling changes the frequencies once a sequence passes the original
  // context (and only for the positions after that); up to it, it is the unscaled rotary, which
  // is what the engine runs.
  TORCH_CHECK(cfg_.rope_scaling_type != "dynamic" ||
                  max_seq_len_ <= cfg_.rope_scaling_original_max_position,
              "GptModel: rope_scaling_type dynamic runs as the unscaled rotary, equal to "
              "transformers' up to rope_scaling_original_max_position = ",
              cfg_.rope_scaling_original_max_position, "; max_seq_len (", max_seq_len_,
              ") exceeds it: use max_seq_len <= ", cfg_.rope_scaling_original_max_position,
              " or backend='reference'");
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
    const std::string& kind = cfg_.rope_scaling_type;
    if (kind == "linear" || kind == "llama3" || kind == "yarn") {
      kernels::RotaryScaling r;
      r.kind = kind == "linear"   ? kernels::RotaryScaling::kLinear
               : kind == "llama3" ? kernels::RotaryScaling::kLlama3
                                  : kernels::RotaryScaling::kYarn;
      r.factor = static_cast<float>(cfg_.rope_scaling_factor);
      r.low_freq_factor = static_cast<float>(cfg_.rope_scaling_low_freq_factor);
      r.high_freq_factor = static_cast<float>(cfg_.rope_scaling_high_freq_factor);
      r.original_max_position = static_cast<float>(cfg_.rope_scaling_original_max_position);
      r.base = static_cast<float>(cfg_.rotary_base);
      if (r.kind == kernels::RotaryScaling::kYarn) {
        // transformers' correction range, in double as Python computes it: the pairs whose
        // wavelength turns beta_fast .. beta_slow times over the original context.
        const double base = cfg_.rotary_base, orig = static_cast<double>(r.original_max_position);
        const auto correction = [&](double rotations) {
          return rd * std::log(orig / (rotations * 2 * M_PI)) / (2 * std::log(base));
        };
        double lo = correction(cfg_.rope_scaling_beta_fast);
        double hi = correction(cfg_.rope_scaling_beta_slow);
        if (cfg_.rope_scaling_truncate) {
          lo = std::floor(lo);
          hi = std::ceil(hi);
        }
        lo = std::max(lo, 0.0);
        hi = std::min(hi, static_cast<double>(rd - 1));
        if (lo == hi) hi += 0.001;
        r.ramp_low = static_cast<float>(lo);
        r.ramp_span = static_cast<float>(hi - lo);
      }
      WF_CUDA_CHECK(
          kernels::launch_rotary_scale(rotary_inv_freq_.as<float>(), rd, r, ctx_->stream()));
    }
  }
}

void GptModel::set_attention_window(int64_t window) {
  TORCH_CHECK(window >= 0, "GptModel: memory_len must be >= 0 (0: no window), got ", window);
  if (window == call_window_) return;
  call_window_ = window;
  ++buffer_generation_;  // the attention kernels' window is baked into captured graphs
}

void GptModel::ensure_kv(int64_t slots, int64_t seq_total) {
  TORCH_CHECK(seq_total <= max_seq_len_, "GptModel: input length + output length = ", seq_total,
              " exceeds max_seq_len (", max_seq_len_, ") given at construction");
  if (view_base_ >= 0) {  // a held range: sized by hold_slots
    TORCH_CHECK(slots <= held_.at(view_base_) && seq_total <= kv_seq_, "GptModel: ", slots,
                " rows of input width + output length = ", seq_total, " exceed the session's ",
                held_.at(view_base_), " rows of ", kv_seq_, " positions");
    return;
  }
  // Beam search needs batch * beam rows; max_batch bounds the batch (checked by the caller).
  const int64_t limit = max_batch_ * kernels::kMaxBeamWidth;
  TORCH_CHECK(slots <= limit, "GptModel: ", slots, " sequences exceed max_batch (", max_batch_,
              ") x the largest beam width");
  shared_slots_ = std::max(shared_slots_, slots);
  const int64_t need = held_end_ + slots;
  if (need <= kv_slots_ && seq_total <= kv_seq_) return;
  grow_kv(grown(need, kv_slots_, held_end_ + limit), grown(seq_total, kv_seq_, max_seq_len_));
}

void GptModel::grow_kv(int64_t new_slots, int64_t new_seq) {
  const int64_t layers = cfg_.end_layer() - cfg_.first_layer();
  const size_t es = dtype_size(dtype_), head_row = cfg_.size_per_head * es;
  const int64_t kvh = cfg_.local_kv_heads();
  const size_t bytes = static_cast<size_t>(layers) * 2 * new_slots * kvh * new_seq * head_row;
  DeviceBuffer old;
  if (held_end_ > 0) {
    old = std::move(kv_);  // the held slots' contents move over
  } else {
    kv_.reset();  // free first so the allocator can reuse the block
  }
  const int64_t old_slots = kv_slots_, old_seq = kv_seq_;
  kv_slots_ = kv_seq_ = 0;  // a failed allocation below must not leave stale sizes behind
  ++buffer_generation_;
  try {
    kv_ = DeviceBuffer(ctx_->allocator(), bytes, ctx_->stream());
  } catch (...) {
    if (held_end_ > 0) {  // keep the held slots as they were
      kv_ = std::move(old);
      kv_slots_ = old_slots;
      kv_seq_ = old_seq;
    }
    throw;
  }
  if (held_end_ > 0 && old_seq > 0) {
    // Per layer and K/V: the held slots' [kv_heads, seq, head_dim] blocks, one head row of
    // old_seq positions per copied row, into rows of new_seq positions.
    for (int64_t kv = 0; kv < 2 * layers; ++kv) {
      const char* src =
          static_cast<const char*>(old.data()) + kv * old_slots * kvh * old_seq * head_row;
      char* dst = static_cast<char*>(kv_.data()) + kv * new_slots * kvh * new_seq * head_row;
      WF_CUDA_CHECK(cudaMemcpy2DAsync(dst, new_seq * head_row, src, old_seq * head_row,
                                      old_seq * head_row, held_end_ * kvh, cudaMemcpyDeviceToDevice,
                                      ctx_->stream()));
    }
  }
  kv_slots_ = new_slots;
  kv_seq_ = new_seq;
}

int64_t GptModel::hold_slots(int64_t rows, int64_t max_len) {
  TORCH_CHECK(view_base_ < 0, "GptModel: a session is running in held slots");
  TORCH_CHECK(rows >= 1 && rows <= max_batch_, "GptModel: a session's batch must be in [1, ",
              "max_batch = ", max_batch_, "], got ", rows);
  TORCH_CHECK(max_len >= 1 && max_len <= max_seq_len_,
              "GptModel: a session's max_len must be in [1, max_seq_len = ", max_seq_len_,
              "], got ", max_len);
  const OwnStreamScope scope(*ctx_);
  // The first gap between held ranges that fits, else the end of the held ones.
  int64_t first = 0;
  for (const auto& [base, n] : held_) {
    if (base - first >= rows) break;
    first = base + n;
  }
  const int64_t end = std::max(held_end_, first + rows);
  // Room for the held slots (their contents kept) with the slots the shared range has served
  // above them.
  if (end + shared_slots_ > kv_slots_ || max_len > kv_seq_) {
    grow_kv(std::max(kv_slots_, end + shared_slots_), std::max(kv_seq_, max_len));
  }
  held_[first] = rows;
  if (end != held_end_) ++buffer_generation_;  // the shared range moved
  held_end_ = end;
  return first;
}

void GptModel::release_slots(int64_t first) {
  TORCH_CHECK(view_base_ < 0, "GptModel: a session is running in held slots");
  TORCH_CHECK(held_.erase(first) == 1, "GptModel: no held slots start at ", first);
  const int64_t end = held_.empty() ? 0 : held_.rbegin()->first + held_.rbegin()->second;
  if (end != held_end_) ++buffer_generation_;
  held_end_ = end;
}

void GptModel::use_slots(int64_t first) {
  TORCH_CHECK(first < 0 || held_.count(first) == 1, "GptModel: no held slots start at ", first);
  // Captured graphs bake one range's cache addresses; their keys hold the range (cache_view).
  view_base_ = first < 0 ? -1 : first;
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
  const int64_t h = cfg_.hidden(), e = cfg_.embed_dim();
  const size_t es = dtype_size(dtype_);
  Carver c(base);
  // Every block has the same shapes: the first one's largest quantized weight sizes the
  // dequantizing scratch of all.
  const int64_t quantized = w_.layers.empty() ? 0 : w_.layers.front().largest_quantized();
  const layers::LayerBuffers b = layers::carve_layer_buffers(spec_, dtype_, t, &c, quantized);
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
  return layers::LayerContext{ctx_.get(), gemm_.get(), comm_, &spec_, dtype_};
}

void GptModel::embed(const int32_t* token_ids, const int32_t* positions, int64_t tokens,
                     int64_t seq_len) {
  const layers::LayerBuffers b = buffers();
  layers::embed(layer_context(), w_.embedding, token_ids, positions, tokens, seq_len, b.x,
                scratch().emb, b.n, prompt_table_);
}

void GptModel::run_layers(int64_t tokens, const layers::AttentionInputs& base) {
  const layers::LayerContext lc = layer_context();
  const layers::LayerBuffers b = buffers();
  const int64_t h = cfg_.hidden();
  const int64_t n_local = static_cast<int64_t>(w_.layers.size());
  const size_t slot_kv = static_cast<size_t>(cfg_.local_kv_heads()) * kv_seq_ * cfg_.size_per_head *
                         dtype_size(dtype_);
  const size_t layer_kv = kv_slots_ * slot_kv;
  const size_t view = slot_base() * slot_kv;  // the current range's first slot
  using kernels::NormKind;
  // The narrower of the model's sliding window and the call's (0: none); a window past the
  // int range sees everything, as none does.
  const int64_t w = cfg_.sliding_window > 0 && call_window_ > 0
                        ? std::min(cfg_.sliding_window, call_window_)
                        : std::max(cfg_.sliding_window, call_window_);
  const int window = static_cast<int>(std::min<int64_t>(w, INT32_MAX));
  // Pre-norm layers normalise their own input (each layer's QKV product applies the previous
  // layer's last residual add and its input norm); post-norm layers end with the next norm.
  layers::ResidualStream stream{b.x};
  for (int64_t l = 0; l < n_local; ++l) {
    layers::AttentionInputs ai = base;
    ai.window = window;
    ai.k_cache = static_cast<char*>(kv_.data()) + (2 * l) * layer_kv + view;
    ai.v_cache = static_cast<char*>(kv_.data()) + (2 * l + 1) * layer_kv + view;
    layers::NextNorm next;
    if (l + 1 < n_local) {
      if (cfg_.pre_layernorm) next.defer = true;
    } else if (cfg_.last_stage() && cfg_.has_post_decoder_layernorm) {
      next = {spec_.norm, w_.final_norm};
    }
    layers::decoder_layer_forward(lc, w_.layers[l], b, tokens, ai, next, &stream);
  }
  // Make `n` hold the final hidden states whatever the last layer's form was.
  const bool normed_in_n = n_local > 0 && cfg_.has_post_decoder_layernorm && cfg_.last_stage();
  if (!normed_in_n) {
    if (n_local == 0 && cfg_.has_post_decoder_layernorm && cfg_.last_stage()) {
      layers::apply_norm(lc, spec_.norm, w_.final_norm, b.x, b.n, tokens, h);
    } else {
      WF_CUDA_CHECK(cudaMemcpyAsync(b.n, b.x, tokens * h * dtype_size(dtype_),
                                    cudaMemcpyDeviceToDevice, ctx_->stream()));
    }
  }
}

void GptModel::lm_head(const void* hidden, int64_t rows, void* out) {
  const Scratch sc = scratch();
  layers::lm_head(layer_context(), w_.lm_head, hidden, rows, out,
                  layers::LmHeadScratch{sc.proj, sc.tp_local, sc.tp_gathered, act_batch_});
}

void GptModel::set_tensor_parallel(Communicator* comm) {
  attach(comm, "tensor", cfg_.tensor_para_size, cfg_.tensor_para_rank, &comm_);
}

// Attaches `comm` as the `kind`-parallel group in `*slot` once it has the group's size and this
// rank's rank, and cut prompts and steps as this instance would.
void GptModel::attach(Communicator* comm, const char* kind, int64_t size, int64_t rank,
                      Communicator** slot) {
  TORCH_CHECK(comm != nullptr && comm->size() == size && comm->rank() == rank, "GptModel: the ",
              kind, "-parallel communicator must have size ", kind, "_para_size (", size,
              ") and this rank's ", kind, "_para_rank (", rank, "); got size ",
              comm ? comm->size() : 0, ", rank ", comm ? comm->rank() : -1);
  // Every rank must cut the prompt into the same groups: their sizes are collective counts.
  generation::check_ranks_agree(comm, *ctx_, static_cast<int32_t>(prefill_group_tokens_), kind,
                                "prefill group size in tokens",
                                "pass the same prefill_tokens on every rank");
  // No step graph may outlive the communicator it baked (nor run on it while it is replaced).
  ctx_->synchronize_own_stream();
  prompt_graphs_.clear();
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
  // The attention region (QKV of the K/V heads, q, out) or the MLP hidden (twice when gated).
  const int64_t qkv = (cfg_.local_heads() + 2 * cfg_.local_kv_heads()) * cfg_.size_per_head;
  const int64_t region = std::max(qkv + 2 * lh, (cfg_.use_gated_activation ? 2 : 1) * li);
  const int64_t words = (cfg_.pre_layernorm ? 3 : 4) * h + region + emb;
  return words * static_cast<int64_t>(dtype_size(dtype_));
}

int64_t GptModel::plan_prefill(const std::vector<int32_t>& lengths) {
  groups_ = generation::plan_prefill_groups(lengths, prefill_group_tokens_);
  int64_t most = 0;
  for (const PrefillGroup& g : groups_) most = std::max(most, g.tokens());
  prompt_tokens_ = groups_.size() == 1 ? prompt_graph_tokens(groups_[0].tokens()) : 0;
  return std::max(most, prompt_tokens_);
}

void GptModel::run_prefill(const int32_t* ids, const std::vector<int32_t>& lengths,
                           const std::vector<int32_t>& past, int64_t seq, int64_t slot_stride,
                           const std::function<void(const PrefillGroup&)>& done) {
  const int64_t real = groups_.back().t1;
  const int64_t n_groups = static_cast<int64_t>(groups_.size());
  // A pass that runs as a prompt graph (plan_prefill) packs `tokens` tokens, the real ones then
  // padding; the attention's sequences (cu) cover the real tokens only, and every other kernel
  // treats rows on their own.
  const int64_t tokens = std::max(real, prompt_tokens_);
  const generation::PromptIndex index =
      generation::pack_prompt(groups_, lengths, past, seq, slot_stride, tokens);
  const std::vector<int32_t>& host = index.host;
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
  d_gather_ = base + index.gather;
  d_slot_ = base + index.slot;
  d_pos_ = base + index.pos;
  d_ids_ = base + index.ids;
  d_cu_ = base + index.cu;
  d_iota_ = base + index.seq_slot;
  d_last_ = base + index.last;
  d_past_ = base + index.past;

  if (cfg_.first_stage()) {
    WF_CUDA_CHECK(kernels::launch_gather_rows(d_ids_, ids, d_gather_, tokens, sizeof(int32_t),
                                              ctx_->stream()));
  }
  for (int64_t gi = 0; gi < n_groups; ++gi) {
    const PrefillGroup& g = groups_[gi];
    layers::AttentionInputs ai{};
    ai.num_slots = static_cast<int>(view_slots());
    ai.max_seq = static_cast<int>(kv_seq_);
    ai.token_slot = d_slot_ + g.t0;
    ai.token_pos = d_pos_ + g.t0;
    ai.alibi_slopes = alibi_.as<float>();
    ai.rotary_inv_freq = rotary_inv_freq_.as<float>();  // scaled rotary: the model's table
    ai.decode = false;
    ai.cu_seqlens = d_cu_ + g.b0 + gi;
    ai.seq_slot = d_iota_ + g.b0;
    ai.seq_past = d_past_ + g.b0;
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
  pp_comm_->send(buffers().n, tokens * cfg_.hidden() * dtype_size(dtype_),
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
  const OwnStreamScope scope(*ctx_);
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
  run_prefill(ids, lengths, {}, seq, 1, [&](const PrefillGroup& g) {
    for (int64_t r0 = 0; r0 < g.tokens(); r0 += chunk) {
      const int64_t n = std::min(chunk, g.tokens() - r0);
      lm_head(static_cast<const char*>(buffers().n) + r0 * hidden_bytes, n, packed.data());
      WF_CUDA_CHECK(kernels::launch_scatter_rows(logits_out, packed.data(), d_gather_ + g.t0 + r0,
                                                 n, row_bytes, ctx_->stream(), vp * es));
    }
  });
  // The last stage computed the logits; every stage returns them.
  broadcast_from_last_stage(logits_out, batch * seq * row_bytes);
}

GptModel::~GptModel() {
  prompt_graphs_.clear();
  ctx_->synchronize_own_stream();  // before the buffers go back to the allocator
}

}  // namespace gpt
}  // namespace warpformer
