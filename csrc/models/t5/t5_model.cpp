#include "csrc/models/t5/t5_model.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "csrc/core/carve.h"
#include "csrc/core/check.h"
#include "csrc/layers/attention.h"
#include "csrc/layers/linear.h"
#include "csrc/layers/norm.h"
#include "kernels/attention/attention.h"
#include "kernels/gather.h"
#include "kernels/sampling/beam_search.h"

namespace warpformer {
namespace t5 {
namespace {

// A stack's blocks on this rank: T5 (RMSNorm, pre-norm, no biases, relative bias, unscaled
// scores) or BART (LayerNorm, post-norm or pre-norm for mBART, learned positions).
layers::LayerSpec stack_spec(const T5Config& c, const T5StackConfig& s, bool decoder) {
  layers::LayerSpec l;
  l.hidden = s.d_model;
  l.heads = s.num_heads / c.tensor_para_size;
  l.kv_heads = l.heads;
  l.head_dim = s.d_kv;
  l.inter = s.d_ff / c.tensor_para_size;
  l.norm = c.is_bart() ? kernels::NormKind::kLayerNorm : kernels::NormKind::kRmsNorm;
  l.norm_eps = static_cast<float>(s.eps);
  l.residual =
      c.pre_layernorm() ? layers::ResidualOrder::kPreNorm : layers::ResidualOrder::kPostNorm;
  l.mlp = layers::MlpPlacement::kSequential;
  l.activation = s.activation;
  l.gated = s.gated;
  l.position =
      c.is_bart() ? layers::PositionEncoding::kLearned : layers::PositionEncoding::kRelative;
  l.attn_scale = c.is_bart() ? 0.f : 1.f;  // T5's initialisation folds 1/sqrt(d_kv) into Q
  l.cross_attention = decoder;
  return l;
}

}  // namespace

int32_t relative_position_bucket(int64_t distance, bool bidirectional, int64_t num_buckets,
                                 int64_t max_distance) {
  int64_t bucket = 0, n = 0;
  if (bidirectional) {
    num_buckets /= 2;
    if (distance > 0) bucket += num_buckets;
    n = distance < 0 ? -distance : distance;
  } else {
    n = distance < 0 ? -distance : 0;
  }
  const int64_t exact = num_buckets / 2;
  if (n < exact) return static_cast<int32_t>(bucket + n);
  // transformers computes this part in fp32 (the distance as float, the denominator a Python
  // float cast to fp32) and truncates; the same operations in the same order give its buckets.
  const float ratio = std::log(static_cast<float>(n) / static_cast<float>(exact)) /
                      static_cast<float>(std::log(static_cast<double>(max_distance) / exact));
  const auto large = exact + static_cast<int64_t>(ratio * static_cast<float>(num_buckets - exact));
  return static_cast<int32_t>(bucket + std::min(large, num_buckets - 1));
}

T5Model::T5Model(T5Config cfg, T5Weights weights, DType dtype, std::shared_ptr<CudaContext> ctx,
                 int64_t max_batch, int64_t max_seq_len, const EngineOptions& options,
                 Communicator* tp_comm)
    : cfg_(std::move(cfg)),
      enc_spec_(stack_spec(cfg_, cfg_.encoder, false)),
      dec_spec_(stack_spec(cfg_, cfg_.decoder, true)),
      options_(options),
      w_(std::move(weights)),
      dtype_(dtype),
      ctx_(std::move(ctx)),
      gemm_(std::make_unique<Gemm>(ctx_.get())),
      comm_(tp_comm),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len) {
  TORCH_CHECK(max_batch_ > 0, "T5Model: max_batch must be positive, got ", max_batch_);
  TORCH_CHECK(max_seq_len_ > 0, "T5Model: max_seq_len must be positive, got ", max_seq_len_);
  TORCH_CHECK(cfg_.pipeline_para_size == 1,
              "T5Model: pipeline parallelism is not supported for encoder-decoder models "
              "(pipeline_para_size must be 1, got ",
              cfg_.pipeline_para_size, ")");
  TORCH_CHECK(cfg_.encoder.d_model == cfg_.decoder.d_model, "T5Model: the encoder's d_model (",
              cfg_.encoder.d_model, ") differs from the decoder's (", cfg_.decoder.d_model, ")");
  enc_spec_.check();
  dec_spec_.check();
  if (cfg_.is_bart()) {
    for (const T5StackConfig* s : {&cfg_.encoder, &cfg_.decoder}) {
      TORCH_CHECK(max_seq_len_ <= s->max_pos_seq_len, "T5Model: max_seq_len (", max_seq_len_,
                  ") exceeds the learned position table (max_pos_seq_len = ", s->max_pos_seq_len,
                  ")");
    }
  }
  TORCH_CHECK(static_cast<int64_t>(w_.encoder.layers.size()) == cfg_.encoder.num_layers &&
                  static_cast<int64_t>(w_.decoder.layers.size()) == cfg_.decoder.num_layers &&
                  w_.cross_kv.size() == w_.decoder.layers.size(),
              "T5Model: got ", w_.encoder.layers.size(), " encoder and ", w_.decoder.layers.size(),
              " decoder layers of weights for ", cfg_.encoder.num_layers, " and ",
              cfg_.decoder.num_layers);
  // Weights are written only before the model is built.
  gemm_->set_static_weights(true);
  if (!cfg_.is_bart()) {
    make_position_bias(cfg_.encoder, w_.encoder.relative_bias, true, &enc_bias_);
    make_position_bias(cfg_.decoder, w_.decoder.relative_bias, false, &dec_bias_);
  }
  const int64_t rows = max_batch_ * kernels::kMaxBeamWidth;
  rows_ = DeviceBuffer(ctx_->allocator(), 2 * rows * sizeof(int32_t), ctx_->stream());
  d_row_entry_ = rows_.as<int32_t>();
  d_row_len_ = d_row_entry_ + rows;
}

T5Model::~T5Model() { ctx_->synchronize_own_stream(); }

void T5Model::make_position_bias(const T5StackConfig& stack, const float* relative_bias,
                                 bool bidirectional, DeviceBuffer* buf) {
  TORCH_CHECK(relative_bias != nullptr, "T5Model: missing the relative attention bias weights");
  const int64_t heads = stack.num_heads / cfg_.tensor_para_size, nb = stack.num_buckets;
  const int64_t m = stack.max_distance, span = 2 * m + 1;
  std::vector<float> weights(heads * nb);
  WF_CUDA_CHECK(cudaMemcpyAsync(weights.data(), relative_bias, weights.size() * sizeof(float),
                                cudaMemcpyDeviceToHost, ctx_->stream()));
  WF_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream()));
  std::vector<float> table(heads * span);
  for (int64_t d = -m; d <= m; ++d) {
    const int32_t bucket = relative_position_bucket(d, bidirectional, nb, m);
    for (int64_t h = 0; h < heads; ++h) table[h * span + d + m] = weights[h * nb + bucket];
  }
  *buf = DeviceBuffer(ctx_->allocator(), table.size() * sizeof(float), ctx_->stream());
  WF_CUDA_CHECK(cudaMemcpyAsync(buf->data(), table.data(), table.size() * sizeof(float),
                                cudaMemcpyHostToDevice, ctx_->stream()));
  WF_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream()));  // the host table dies here
}

void T5Model::set_tensor_parallel(Communicator* comm) {
  TORCH_CHECK(comm != nullptr && comm->size() == cfg_.tensor_para_size &&
                  comm->rank() == cfg_.tensor_para_rank,
              "T5Model: the tensor-parallel communicator must have size tensor_para_size (",
              cfg_.tensor_para_size, ") and this rank's tensor_para_rank (", cfg_.tensor_para_rank,
              ")");
  ctx_->synchronize_own_stream();
  comm_ = comm;
  ++buffer_generation_;
}

layers::LayerContext T5Model::context_for(const layers::LayerSpec& spec) {
  return layers::LayerContext{ctx_.get(), gemm_.get(), comm_, &spec, dtype_};
}

// ---- buffers ------------------------------------------------------------------------------

size_t T5Model::enc_layout(void* base, int64_t tokens, int64_t batch, int64_t seq,
                           layers::LayerBuffers* layer, void** k, void** v) const {
  const size_t es = dtype_size(dtype_);
  Carver c(base);
  const layers::LayerBuffers b = layers::carve_layer_buffers(enc_spec_, dtype_, tokens, &c);
  const size_t kv = static_cast<size_t>(batch) * enc_spec_.heads * seq * enc_spec_.head_dim * es;
  void* kp = c.take(kv);
  void* vp = c.take(kv);
  if (layer != nullptr) *layer = b;
  if (k != nullptr) *k = kp;
  if (v != nullptr) *v = vp;
  return c.used();
}

void T5Model::ensure_encoder(int64_t tokens, int64_t batch, int64_t seq) {
  if (tokens <= enc_tokens_ && batch <= enc_batch_ && seq <= enc_seq_) return;
  const int64_t t = grown(tokens, enc_tokens_, max_batch_ * max_seq_len_);
  const int64_t b = grown(batch, enc_batch_, max_batch_);
  const int64_t s = grown(seq, enc_seq_, max_seq_len_);
  enc_act_.reset();
  enc_tokens_ = enc_batch_ = enc_seq_ = 0;
  enc_act_ = DeviceBuffer(ctx_->allocator(),
                          enc_layout(nullptr, t, b, s, nullptr, nullptr, nullptr), ctx_->stream());
  enc_tokens_ = t;
  enc_batch_ = b;
  enc_seq_ = s;
}

void T5Model::ensure_memory(int64_t batch, int64_t seq) {
  if (batch <= mem_batch_ && seq <= mem_seq_) return;
  const int64_t b = grown(batch, mem_batch_, max_batch_);
  const int64_t s = grown(seq, mem_seq_, max_seq_len_);
  const size_t es = dtype_size(dtype_);
  const size_t bytes = static_cast<size_t>(cfg_.decoder.num_layers) * 2 * b * dec_spec_.heads * s *
                       dec_spec_.head_dim * es;
  memory_.reset();
  mem_batch_ = mem_seq_ = 0;
  ++buffer_generation_;  // captured steps baked the memory's address and size
  memory_ = DeviceBuffer(ctx_->allocator(), bytes, ctx_->stream());
  mem_batch_ = b;
  mem_seq_ = s;
}

void T5Model::ensure_kv(int64_t slots, int64_t seq) {
  TORCH_CHECK(seq <= max_seq_len_, "T5Model: decoder input length + output length = ", seq,
              " exceeds max_seq_len (", max_seq_len_, ") given at construction");
  const int64_t limit = max_batch_ * kernels::kMaxBeamWidth;
  TORCH_CHECK(slots <= limit, "T5Model: ", slots, " sequences exceed max_batch (", max_batch_,
              ") x the largest beam width");
  if (slots <= kv_slots_ && seq <= kv_seq_) return;
  const int64_t n = grown(slots, kv_slots_, limit), s = grown(seq, kv_seq_, max_seq_len_);
  const size_t bytes = static_cast<size_t>(cfg_.decoder.num_layers) * 2 * n * dec_spec_.heads * s *
                       dec_spec_.head_dim * dtype_size(dtype_);
  kv_.reset();
  kv_slots_ = kv_seq_ = 0;
  ++buffer_generation_;
  kv_ = DeviceBuffer(ctx_->allocator(), bytes, ctx_->stream());
  kv_slots_ = n;
  kv_seq_ = s;
}

size_t T5Model::dec_layout(void* base, int64_t tokens, int64_t rows, layers::LayerBuffers* layer,
                           DecScratch* scratch) const {
  const int64_t d = cfg_.decoder.d_model;
  const size_t es = dtype_size(dtype_);
  Carver c(base);
  const layers::LayerBuffers b = layers::carve_layer_buffers(dec_spec_, dtype_, tokens, &c);
  DecScratch sc{};
  sc.last_rows = c.take(rows * d * es);
  sc.kept = c.take(rows * d * es);
  sc.logits = c.take(rows * w_.lm_head.local_vocab * es);
  if (layer != nullptr) *layer = b;
  if (scratch != nullptr) *scratch = sc;
  return c.used();
}

void T5Model::ensure_decoder(int64_t tokens, int64_t rows) {
  if (tokens <= dec_tokens_ && rows <= dec_rows_) return;
  const int64_t limit = max_batch_ * kernels::kMaxBeamWidth;
  const int64_t t = grown(tokens, dec_tokens_, std::max(tokens, limit));
  const int64_t r = grown(rows, dec_rows_, limit);
  dec_act_.reset();
  dec_tokens_ = dec_rows_ = 0;
  ++buffer_generation_;
  dec_act_ =
      DeviceBuffer(ctx_->allocator(), dec_layout(nullptr, t, r, nullptr, nullptr), ctx_->stream());
  dec_tokens_ = t;
  dec_rows_ = r;
}

layers::LayerBuffers T5Model::dec_buffers() const {
  layers::LayerBuffers b{};
  dec_layout(dec_act_.data(), dec_tokens_, dec_rows_, &b, nullptr);
  return b;
}

T5Model::DecScratch T5Model::dec_scratch() const {
  DecScratch s{};
  dec_layout(dec_act_.data(), dec_tokens_, dec_rows_, nullptr, &s);
  return s;
}

void T5Model::upload_index(const generation::PromptIndex& index,
                           const std::vector<int32_t>& extra) {
  const int64_t ints = static_cast<int64_t>(index.host.size() + extra.size());
  if (ints > meta_ints_) {
    const int64_t n = grown(ints, meta_ints_, 2 * ints);
    meta_.reset();
    meta_ints_ = 0;
    meta_ = DeviceBuffer(ctx_->allocator(), n * sizeof(int32_t), ctx_->stream());
    meta_ints_ = n;
  }
  auto* base = meta_.as<int32_t>();
  WF_CUDA_CHECK(cudaMemcpyAsync(base, index.host.data(), index.host.size() * sizeof(int32_t),
                                cudaMemcpyHostToDevice, ctx_->stream()));
  if (!extra.empty()) {
    WF_CUDA_CHECK(cudaMemcpyAsync(base + index.host.size(), extra.data(),
                                  extra.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  ctx_->stream()));
  }
  // Pageable sources: the copies above have read them when they return.
  d_gather_ = base + index.gather;
  d_slot_ = base + index.slot;
  d_pos_ = base + index.pos;
  d_ids_ = base + index.ids;
  d_cu_ = base + index.cu;
  d_seq_slot_ = base + index.seq_slot;
  d_last_ = base + index.last;
  d_extra_ = base + index.host.size();
}

// ---- forward --------------------------------------------------------------------------------

void T5Model::run_stack(const layers::LayerSpec& spec, const T5StackWeights& w,
                        const layers::LayerBuffers& b, int64_t tokens, layers::AttentionInputs ai,
                        bool decoder) {
  const layers::LayerContext lc = context_for(spec);
  const int64_t n_layers = static_cast<int64_t>(w.layers.size());
  const size_t es = dtype_size(dtype_), head = spec.head_dim * es;
  const size_t layer_kv = static_cast<size_t>(kv_slots_) * spec.heads * kv_seq_ * head;
  const size_t layer_mem = static_cast<size_t>(mem_batch_) * spec.heads * mem_seq_ * head;
  layers::ResidualStream stream{b.x};
  for (int64_t l = 0; l < n_layers; ++l) {
    if (decoder) {
      ai.k_cache = static_cast<char*>(kv_.data()) + (2 * l) * layer_kv;
      ai.v_cache = static_cast<char*>(kv_.data()) + (2 * l + 1) * layer_kv;
      ai.cross.k = static_cast<const char*>(memory_.data()) + (2 * l) * layer_mem;
      ai.cross.v = static_cast<const char*>(memory_.data()) + (2 * l + 1) * layer_mem;
    }
    layers::NextNorm next;
    if (l + 1 < n_layers) {
      next.defer = spec.pre_norm();
    } else if (w.final_norm.gamma != nullptr) {
      next = {spec.norm, w.final_norm};
    }
    layers::decoder_layer_forward(lc, w.layers[l], b, tokens, ai, next, &stream);
  }
  // `n` holds the final hidden states whatever the last layer's form was.
  if (n_layers == 0 || w.final_norm.gamma == nullptr) {
    if (n_layers == 0 && w.final_norm.gamma != nullptr) {
      layers::apply_norm(lc, spec.norm, w.final_norm, b.x, b.n, tokens, spec.hidden);
    } else {
      WF_CUDA_CHECK(cudaMemcpyAsync(b.n, b.x, tokens * spec.hidden * es, cudaMemcpyDeviceToDevice,
                                    ctx_->stream()));
    }
  }
}

void T5Model::encode(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
                     void* out) {
  const OwnStreamScope scope(*ctx_);
  const auto batch = static_cast<int64_t>(lengths.size());
  TORCH_CHECK(batch >= 1 && batch <= max_batch_,
              "T5Model.encode: batch must be in [1, max_batch = ", max_batch_, "], got ", batch);
  TORCH_CHECK(seq >= 1 && seq <= max_seq_len_, "T5Model.encode: the input width ", seq,
              " exceeds max_seq_len (", max_seq_len_, ")");
  const std::vector<generation::PrefillGroup> groups =
      generation::plan_prefill_groups(lengths, std::numeric_limits<int64_t>::max());
  const int64_t tokens = groups.back().t1;
  const generation::PromptIndex index =
      generation::pack_prompt(groups, lengths, {}, seq, /*slot_stride=*/1, tokens);
  ensure_encoder(tokens, batch, seq);
  ensure_memory(batch, seq);
  upload_index(index, {});
  WF_CUDA_CHECK(
      kernels::launch_gather_rows(d_ids_, ids, d_gather_, tokens, sizeof(int32_t), ctx_->stream()));
  layers::LayerBuffers b{};
  void *k = nullptr, *v = nullptr;
  enc_layout(enc_act_.data(), enc_tokens_, enc_batch_, enc_seq_, &b, &k, &v);
  const layers::LayerContext lc = context_for(enc_spec_);
  layers::embed(lc, w_.encoder.embedding, d_ids_, d_pos_, tokens, seq, b.x, nullptr, nullptr);

  // Every layer's keys and values go to the same scratch (one layer at a time), entry b in
  // slot b; the attention sees the whole sequence.
  layers::AttentionInputs ai{};
  ai.k_cache = k;
  ai.v_cache = v;
  ai.num_slots = static_cast<int>(enc_batch_);
  ai.max_seq = static_cast<int>(enc_seq_);
  ai.token_slot = d_slot_;
  ai.token_pos = d_pos_;
  ai.position_bias = enc_bias_.as<float>();
  ai.bias_max_distance = static_cast<int>(cfg_.encoder.max_distance);
  ai.bidirectional = true;
  ai.cu_seqlens = d_cu_;
  ai.seq_slot = d_seq_slot_;
  ai.batch = static_cast<int>(batch);
  ai.max_seqlen = groups[0].max_len;
  run_stack(enc_spec_, w_.encoder, b, tokens, ai, /*decoder=*/false);

  // The cross-attention memory of every decoder layer: the encoder output's K/V products (into
  // the encoder's free QKV region: T5Config::from_json checks 2 * inner <= its width) scattered
  // to slot b, position i.
  const layers::LayerContext dc = context_for(dec_spec_);
  const size_t es = dtype_size(dtype_), head = dec_spec_.head_dim * es;
  const size_t layer_mem = static_cast<size_t>(mem_batch_) * dec_spec_.heads * mem_seq_ * head;
  for (size_t l = 0; l < w_.cross_kv.size(); ++l) {
    layers::Linear kv = w_.cross_kv[l];
    const void* bias = kv.bias;
    kv.bias = nullptr;  // added by the scatter
    layers::linear_forward(*gemm_, dtype_, kv, b.n, b.qkv, tokens);
    char* mem = static_cast<char*>(memory_.data()) + 2 * l * layer_mem;
    layers::write_cross_memory(dc, b.qkv, bias, mem, mem + layer_mem, static_cast<int>(mem_batch_),
                               static_cast<int>(mem_seq_), d_slot_, d_pos_, tokens);
  }
  enc_lengths_ = lengths;
  if (out != nullptr) {
    const size_t row = cfg_.encoder.d_model * es;
    WF_CUDA_CHECK(cudaMemsetAsync(out, 0, batch * seq * row, ctx_->stream()));
    WF_CUDA_CHECK(kernels::launch_scatter_rows(out, b.n, d_gather_, tokens, row, ctx_->stream()));
  }
}

int64_t T5Model::reserve(int64_t rows, int64_t total, const std::vector<int32_t>& lengths) {
  const auto batch = static_cast<int64_t>(lengths.size());
  TORCH_CHECK(batch >= 1 && batch == static_cast<int64_t>(enc_lengths_.size()),
              "T5Model: a generation session of ", batch, " entries follows an encode of ",
              enc_lengths_.size());
  TORCH_CHECK(rows % batch == 0, "T5Model: ", rows, " rows are not a whole number of beams of ",
              batch, " entries");
  const int64_t beam = rows / batch;
  ensure_kv(rows, total);
  const int64_t tokens = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  ensure_decoder(std::max(tokens, rows), std::max(rows, batch));
  // Each step row reads its entry's memory: slot r / beam, of the entry's encoded length.
  std::vector<int32_t> host(2 * rows);
  for (int64_t r = 0; r < rows; ++r) {
    host[r] = static_cast<int32_t>(r / beam);
    host[rows + r] = enc_lengths_[r / beam];
  }
  WF_CUDA_CHECK(cudaMemcpyAsync(d_row_entry_, host.data(), rows * sizeof(int32_t),
                                cudaMemcpyHostToDevice, ctx_->stream()));
  WF_CUDA_CHECK(cudaMemcpyAsync(d_row_len_, host.data() + rows, rows * sizeof(int32_t),
                                cudaMemcpyHostToDevice, ctx_->stream()));
  const size_t ws = layers::self_attention_workspace_bytes(dec_spec_, tokens, mem_seq_);
  if (ws > cross_ws_.size()) {
    cross_ws_.reset();
    cross_ws_ = DeviceBuffer(ctx_->allocator(), ws, ctx_->stream());
  }
  return kv_seq_;
}

size_t T5Model::step_workspace_bytes(int64_t rows) const {
  return std::max(layers::self_attention_workspace_bytes(dec_spec_, rows, kv_seq_),
                  layers::self_attention_workspace_bytes(dec_spec_, rows, mem_seq_));
}

void T5Model::prefill(const int32_t* ids, const std::vector<int32_t>& lengths,
                      const std::vector<int32_t>& past, int64_t seq, int64_t slot_stride,
                      void* hidden_out) {
  TORCH_CHECK(past.empty(), "T5Model: the decoder runs no interactive sessions");
  const std::vector<generation::PrefillGroup> groups =
      generation::plan_prefill_groups(lengths, std::numeric_limits<int64_t>::max());
  const int64_t tokens = groups.back().t1;
  const auto batch = static_cast<int64_t>(lengths.size());
  const generation::PromptIndex index =
      generation::pack_prompt(groups, lengths, {}, seq, slot_stride, tokens);
  // Each token's memory slot (its entry) and the entry's encoded length.
  std::vector<int32_t> extra(2 * tokens);
  for (int64_t b = 0, t = 0; b < batch; ++b) {
    for (int32_t i = 0; i < lengths[b]; ++i, ++t) {
      extra[t] = static_cast<int32_t>(b);
      extra[tokens + t] = enc_lengths_[b];
    }
  }
  upload_index(index, extra);
  WF_CUDA_CHECK(
      kernels::launch_gather_rows(d_ids_, ids, d_gather_, tokens, sizeof(int32_t), ctx_->stream()));
  const layers::LayerBuffers b = dec_buffers();
  const layers::LayerContext lc = context_for(dec_spec_);
  layers::embed(lc, w_.decoder.embedding, d_ids_, d_pos_, tokens, seq, b.x, nullptr, nullptr);

  layers::AttentionInputs ai{};
  ai.num_slots = static_cast<int>(kv_slots_);
  ai.max_seq = static_cast<int>(kv_seq_);
  ai.token_slot = d_slot_;
  ai.token_pos = d_pos_;
  ai.position_bias = dec_bias_.as<float>();
  ai.bias_max_distance = static_cast<int>(cfg_.decoder.max_distance);
  ai.cu_seqlens = d_cu_;
  ai.seq_slot = d_seq_slot_;
  ai.batch = static_cast<int>(batch);
  ai.max_seqlen = groups[0].max_len;
  ai.workspace = cross_ws_.as<float>();
  ai.workspace_bytes = cross_ws_.size();
  ai.cross.num_slots = static_cast<int>(mem_batch_);
  ai.cross.max_seq = static_cast<int>(mem_seq_);
  ai.cross.row_slot = d_extra_;
  ai.cross.lengths = d_extra_ + tokens;
  run_stack(dec_spec_, w_.decoder, b, tokens, ai, /*decoder=*/true);

  const size_t row = hidden_row_bytes();
  WF_CUDA_CHECK(
      kernels::launch_gather_rows(dec_scratch().kept, b.n, d_last_, batch, row, ctx_->stream()));
  if (hidden_out != nullptr) {
    WF_CUDA_CHECK(
        kernels::launch_scatter_rows(hidden_out, b.n, d_gather_, tokens, row, ctx_->stream()));
  }
}

void T5Model::prompt_logits(const int32_t* entry_of_row, int64_t rows) {
  const DecScratch sc = dec_scratch();
  WF_CUDA_CHECK(kernels::launch_gather_rows(sc.last_rows, sc.kept, entry_of_row, rows,
                                            hidden_row_bytes(), ctx_->stream()));
  layers::lm_head(context_for(dec_spec_), w_.lm_head, sc.last_rows, rows, sc.logits, {});
  final_hidden_ = sc.last_rows;
}

void T5Model::step(const generation::StepRows& in, int64_t r0, int64_t n, bool /*exchange*/) {
  const layers::LayerBuffers b = dec_buffers();
  const layers::LayerContext lc = context_for(dec_spec_);
  layers::embed(lc, w_.decoder.embedding, in.tokens + r0, in.positions + r0, n, kv_seq_, b.x,
                nullptr, nullptr);
  layers::AttentionInputs ai{};
  ai.num_slots = static_cast<int>(kv_slots_);
  ai.max_seq = static_cast<int>(kv_seq_);
  ai.token_slot = in.slots + r0;
  ai.token_pos = in.positions + r0;
  ai.position_bias = dec_bias_.as<float>();
  ai.bias_max_distance = static_cast<int>(cfg_.decoder.max_distance);
  ai.decode = true;
  ai.row_slot = in.slots + r0;
  ai.lengths = in.lengths + r0;
  ai.cache_indir = in.cache_indir != nullptr ? in.cache_indir + r0 * kv_seq_ : nullptr;
  // As GptModel::step: the fused QKV preparation pays while the blocks fit in one wave.
  ai.fused_prep = n * dec_spec_.heads <= 2 * int64_t{ctx_->props().multiProcessorCount};
  ai.workspace = in.workspace;
  ai.workspace_bytes = in.workspace_bytes;
  ai.cross.num_slots = static_cast<int>(mem_batch_);
  ai.cross.max_seq = static_cast<int>(mem_seq_);
  ai.cross.row_slot = d_row_entry_ + r0;
  ai.cross.lengths = d_row_len_ + r0;
  run_stack(dec_spec_, w_.decoder, b, n, ai, /*decoder=*/true);
  void* logits =
      static_cast<char*>(dec_scratch().logits) + r0 * w_.lm_head.local_vocab * dtype_size(dtype_);
  layers::lm_head(lc, w_.lm_head, b.n, n, logits, {});
  final_hidden_ = b.n;
}

}  // namespace t5
}  // namespace warpformer
