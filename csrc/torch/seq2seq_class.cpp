#include "csrc/torch/seq2seq_class.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <string>
#include <vector>

#include "csrc/models/t5/t5_weights.h"
#include "csrc/torch/generation_options.h"
#include "csrc/torch/tensor_utils.h"

namespace warpformer {
namespace {

constexpr const char* kOp = "Seq2SeqModel";
constexpr const char* kDecodeOp = "Seq2SeqModel.decode";

}  // namespace

Seq2SeqModelHolder::Seq2SeqModelHolder(const std::string& config,
                                       c10::Dict<std::string, at::Tensor> weights,
                                       const std::string& options)
    : config_json_(config),
      given_(weights),
      options_(ModelOptions::from_json(options, "Seq2SeqModel options")) {
  TORCH_CHECK(options_.pipeline_para_size == 1, kOp,
              ": pipeline parallelism is not supported for encoder-decoder models "
              "(pipeline_para_size must be 1, got ",
              options_.pipeline_para_size, ")");
  t5::T5Config cfg = t5::T5Config::from_json(config, options_.tensor_para_rank);
  const int64_t tp = cfg.tensor_para_size;
  const std::vector<t5::WeightEntry> table = t5::weight_table(cfg);

  // Presence, kind and shape of every weight first (no GPU needed), then devices.
  at::Tensor ref;  // the first weight: the default dtype and the device
  std::string ref_name;
  for (const t5::WeightEntry& e : table) {
    TORCH_CHECK(weights.contains(e.name), kOp, ": missing weight '", e.name, "' (shape ",
                shape_str(e.shard_shape(tp)), ")");
    const at::Tensor t = weights.at(e.name);
    TORCH_CHECK(t.is_floating_point(), kOp, ": weight '", e.name,
                "' must be a floating tensor, got ", t.scalar_type());
    TORCH_CHECK(t.sizes().vec() == e.shard_shape(tp), kOp, ": weight '", e.name,
                "' must have shape ", shape_str(e.shard_shape(tp)), " for tensor_para_size ", tp,
                ", got ", shape_str(t.sizes().vec()));
    if (!ref.defined()) {
      ref = t;
      ref_name = e.name;
    }
  }
  TORCH_CHECK(ref.defined(), kOp, ": the weight table is empty");
  const DType dt = options_.dtype.empty() ? to_dtype(ref.scalar_type(), kOp, ref_name.c_str())
                                          : parse_dtype(options_.dtype, "Seq2SeqModel: dtype");
  TORCH_CHECK(ref.is_cuda(), kOp, ": weight '", ref_name, "' must be a CUDA tensor, got device ",
              ref.device(), " (load weights with device='cuda')");
  device_ = ref.device().index();
  const c10::ScalarType st = to_scalar_type(dt);
  for (const t5::WeightEntry& e : table) {
    const at::Tensor t = weights.at(e.name);
    TORCH_CHECK(t.is_cuda() && t.device().index() == device_, kOp, ": weight '", e.name, "' is on ",
                t.device(), " but '", ref_name, "' is on cuda:", device_,
                "; all weights must be on one GPU");
    owned_[e.name] = t.to(st).contiguous();
  }
  const c10::cuda::CUDAGuard guard(device_);

  // Tensors by role (nullptr / undefined when the family has none).
  auto tensor = [&](const std::string& stack, int64_t layer, const std::string& role) {
    const t5::WeightEntry* e = models::find_weight(table, stack, layer, role);
    return e == nullptr ? at::Tensor() : owned_.at(e->name);
  };
  auto keep = [&](const std::string& name, const at::Tensor& t) -> const void* {
    if (!t.defined()) return nullptr;
    owned_[name] = t.contiguous();
    return owned_[name].data_ptr();
  };
  auto ptr = [](const at::Tensor& t) -> const void* {
    return t.defined() ? t.data_ptr() : nullptr;
  };
  // Columns of several [in, out] kernels (or [out] biases) side by side: the fused products.
  auto joined = [](const std::vector<at::Tensor>& parts) -> at::Tensor {
    for (const at::Tensor& p : parts) {
      if (!p.defined()) return at::Tensor();
    }
    return at::cat(parts, parts[0].dim() - 1);
  };
  auto linear = [](const void* w, const void* b, int64_t in, int64_t out) {
    layers::Linear l;
    l.weight = w;
    l.bias = b;
    l.in = in;
    l.out = out;
    return l;
  };
  auto norm = [&](const std::string& stack, int64_t layer, const std::string& role) {
    return layers::NormWeights{ptr(tensor(stack, layer, role)),
                               ptr(tensor(stack, layer, role + "_bias"))};
  };

  t5::T5Weights w;
  const int64_t d = cfg.d_model();
  const int64_t vocab_rows = (cfg.vocab_size + 7) / 8 * 8;  // the head's rows padded (GptModel)
  for (const char* stack_name : {"encoder", "decoder"}) {
    const std::string s = stack_name;
    const bool decoder = s == "decoder";
    const t5::T5StackConfig& sc = decoder ? cfg.decoder : cfg.encoder;
    t5::T5StackWeights& sw = decoder ? w.decoder : w.encoder;
    const int64_t inner = sc.local_inner(tp), ff = sc.local_ff(tp);
    layers::EmbeddingWeights& emb = sw.embedding;
    emb.wte = ptr(tensor(s, -1, "embedding"));
    emb.vocab = cfg.vocab_size;
    emb.embed_dim = d;
    if (cfg.is_bart()) {
      emb.wpe = ptr(tensor(s, -1, "positions"));
      emb.max_positions = sc.max_pos_seq_len;
      emb.norm = norm(s, -1, "embedding_norm");
    } else {
      // The bias table in fp32 from the weights as given (the model reads it once, at
      // construction, into its fp32 distance table).
      const std::string name = models::weight_name(table, s, -1, "positions");
      sw.relative_bias = static_cast<const float*>(
          keep(s + ".relative_bias.fp32", weights.at(name).to(at::kFloat)));
    }
    if (cfg.pre_layernorm()) sw.final_norm = norm(s, -1, "final_norm");
    for (int64_t l = 0; l < sc.num_layers; ++l) {
      const std::string p = s + "." + std::to_string(l) + ".";
      auto role = [&](const std::string& r) { return tensor(s, l, r); };
      layers::LayerWeights lw;
      lw.ln1 = norm(s, l, "self_norm");
      at::Tensor qkv, qkv_bias;
      if (decoder) {  // [d, 3, inner]: Q, K, V heads side by side already
        qkv = role("self_qkv").reshape({d, 3 * inner});
        qkv_bias = role("self_qkv_bias");
        if (qkv_bias.defined()) qkv_bias = qkv_bias.reshape({3 * inner});
      } else {
        qkv = joined({role("self_q"), role("self_k"), role("self_v")});
        qkv_bias = joined({role("self_q_bias"), role("self_k_bias"), role("self_v_bias")});
      }
      lw.qkv = linear(keep(p + "qkv", qkv), keep(p + "qkv_bias", qkv_bias), d, 3 * inner);
      lw.dense = linear(ptr(role("self_o")), ptr(role("self_o_bias")), inner, d);
      lw.ln2 = norm(s, l, "ffn_norm");
      if (sc.gated) {  // HF: act(x wi_0) * (x wi_1); the block's gate is the activated product
        lw.gate = linear(ptr(role("ffn_in")), ptr(role("ffn_in_bias")), d, ff);
        lw.fc1 = linear(ptr(role("ffn_gate")), ptr(role("ffn_gate_bias")), d, ff);
      } else {
        lw.fc1 = linear(ptr(role("ffn_in")), ptr(role("ffn_in_bias")), d, ff);
      }
      lw.fc2 = linear(ptr(role("ffn_out")), ptr(role("ffn_out_bias")), ff, d);
      if (decoder) {
        lw.ln_cross = norm(s, l, "cross_norm");
        lw.cross_q = linear(ptr(role("cross_q")), ptr(role("cross_q_bias")), d, inner);
        lw.cross_dense = linear(ptr(role("cross_o")), ptr(role("cross_o_bias")), inner, d);
        const at::Tensor kv = joined({role("cross_k"), role("cross_v")});
        const at::Tensor kv_bias = joined({role("cross_k_bias"), role("cross_v_bias")});
        w.cross_kv.push_back(
            linear(keep(p + "cross_kv", kv), keep(p + "cross_kv_bias", kv_bias), d, 2 * inner));
      }
      sw.layers.push_back(lw);
    }
  }
  // The head [vocab, d] (and BART's final_logits_bias) with its rows padded to a multiple of 8,
  // zeros past the vocabulary (nothing reads their logits).
  auto padded_rows = [&](const at::Tensor& t) {
    if (!t.defined() || t.size(0) == vocab_rows) return t;
    std::vector<int64_t> shape = t.sizes().vec();
    shape[0] = vocab_rows;
    at::Tensor out = at::zeros(shape, t.options());
    out.narrow(0, 0, t.size(0)).copy_(t);
    return out;
  };
  // T5 with tied embeddings scales the decoder output by d_model ** -0.5 before the head:
  // folded into the head's copy, so that the final hidden states stay HF's.
  at::Tensor head_rows = tensor("", -1, "lm_head");
  if (!cfg.is_bart() && cfg.tie_word_embeddings) {
    head_rows = head_rows.to(at::kFloat).mul(1.0 / std::sqrt(static_cast<double>(d))).to(st);
  }
  layers::LmHeadWeights& head = w.lm_head;
  head.weight = keep("lm_head.padded", padded_rows(head_rows));
  head.bias = keep("logits_bias.padded", padded_rows(tensor("", -1, "logits_bias")));
  head.embed_dim = d;
  head.local_vocab = vocab_rows;
  head.tp = 1;  // replicated: every rank computes every logit

  auto ctx = std::make_shared<CudaContext>(static_cast<int>(device_),
                                           c10::cuda::getCurrentCUDAStream(device_).stream(),
                                           torch_cuda_allocator());
  model_ = std::make_unique<t5::T5Model>(std::move(cfg), std::move(w), dt, std::move(ctx),
                                         options_.max_batch, options_.max_seq_len, options_.engine);
  generation_ = std::make_unique<generation::Session>(model_.get(), options_.engine.cuda_graphs);
  const std::string tuning = options_.tuning_file();
  if (!tuning.empty()) {
    std::string note;
    if (!model_->gemm().load_tuning(tuning, &note)) TORCH_WARN(note);
  }
}

PromptInput Seq2SeqModelHolder::check_inputs(const char* op, const at::Tensor& input_ids,
                                             const at::Tensor& input_lengths) const {
  PromptLimits limits;
  limits.max_batch = model_->max_batch();
  limits.max_seq_len = model_->max_seq_len();
  limits.vocab = model_->vocab_size();
  limits.device = device_;
  return check_prompt(op, input_ids, input_lengths, 0, limits);
}

void Seq2SeqModelHolder::check_parallel_ready(const char* op) const {
  const int64_t tp = model_->config().tensor_para_size;
  TORCH_CHECK(tp == 1 || tp_comm_, op, ": tensor_para_size is ", tp,
              " but no tensor-parallel communicator is attached (load the model with "
              "warpformer.Seq2Seq under mpirun or torchrun)");
}

at::Tensor Seq2SeqModelHolder::run_encoder(const char* op, const PromptInput& p,
                                           const at::Tensor& input_ids, bool keep) {
  model_->context().set_stream(c10::cuda::getCurrentCUDAStream(device_).stream());
  const at::Tensor ids =
      input_ids.is_cuda() ? input_ids.contiguous() : upload_together({p.host_ids}, device_)[0];
  // T5's activations can exceed the fp16 range (FT issue #554: Flan-T5 XL), which turns the
  // encoder output into inf / NaN and every token into garbage: in fp16 the output is kept and
  // checked, and such a model is refused rather than answered.
  const bool check = model_->dtype() == DType::kFloat16;
  at::Tensor out;
  if (keep || check) {
    out = at::empty(
        {ids.size(0), ids.size(1), model_->config().d_model()},
        at::TensorOptions().device(at::kCUDA, device_).dtype(to_scalar_type(model_->dtype())));
  }
  model_->encode(ids.data_ptr<int32_t>(), p.lengths, ids.size(1),
                 out.defined() ? out.data_ptr() : nullptr);
  TORCH_CHECK(!check || at::isfinite(out).all().item<bool>(), op,
              ": the encoder's activations overflow float16 (values past +-65504 became inf / "
              "NaN, as T5 v1.1 / Flan-T5 checkpoints are known to do); load the model with "
              "dtype bfloat16 or float32");
  return out;
}

at::Tensor Seq2SeqModelHolder::encode(const at::Tensor& input_ids,
                                      const at::Tensor& input_lengths) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  const char* op = "Seq2SeqModel.encode";
  // The encoder rewrites the cross-attention memory a running generation reads.
  TORCH_CHECK(!generation_->active(), op,
              ": a generation session is running; call decode_finish() first");
  check_parallel_ready(op);
  const PromptInput p = check_inputs(op, input_ids, input_lengths);
  const c10::cuda::CUDAGuard guard(device_);
  return run_encoder(op, p, input_ids, /*keep=*/true);
}

void Seq2SeqModelHolder::decode_start(const at::Tensor& input_ids, const at::Tensor& input_lengths,
                                      int64_t output_len,
                                      const c10::Dict<std::string, at::Tensor>& options) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  TORCH_CHECK(!generation_->active(), kDecodeOp,
              ": a generation session is running; call decode_finish() first");
  TORCH_CHECK(output_len >= 1, kDecodeOp, ": output_len must be >= 1, got ", output_len);
  TORCH_CHECK(1 + output_len <= model_->max_seq_len(), kDecodeOp,
              ": 1 + output_len = ", 1 + output_len, " exceeds max_seq_len (",
              model_->max_seq_len(),
              ") of this model instance (the decoder starts from decoder_start_token_id)");
  check_parallel_ready(kDecodeOp);
  const PromptInput prompt = check_inputs(kDecodeOp, input_ids, input_lengths);
  const int64_t batch = input_ids.size(0);
  const t5::T5Config& cfg = model_->config();
  const c10::Dict<std::string, at::Tensor> g =
      ops::generation_options(options, batch, cfg.vocab_size, cfg.eos_token_id);
  // What only a decoder-only model's prompt means.
  TORCH_CHECK(g.at("session").item<int64_t>() == 0, kDecodeOp,
              ": option 'session': interactive sessions serve decoder-only models");
  TORCH_CHECK(!g.contains("prompt_table"), kDecodeOp,
              ": option 'prompt_table': prompt embeddings serve decoder-only models");
  TORCH_CHECK(g.at("memory_len").item<int64_t>() == 0, kDecodeOp,
              ": option 'memory_len' must be 0 for an encoder-decoder model");
  TORCH_CHECK(g.at("return_context_embeddings").item<int64_t>() == 0, kDecodeOp,
              ": option 'return_context_embeddings': use encode() for the encoder output");
  TORCH_CHECK(g.at("return_cum_log_probs").item<int64_t>() != 2, kDecodeOp,
              ": option 'return_cum_log_probs' must be 0 or 1 for an encoder-decoder model (2 adds "
              "the prompt's log probs; the decoder's prompt is its start token)");

  const c10::cuda::CUDAGuard guard(device_);
  run_encoder(kDecodeOp, prompt, input_ids, /*keep=*/false);
  // The decoder's prompt: decoder_start_token_id in every row.
  PromptInput start;
  start.host_ids = at::full({batch, 1}, static_cast<int32_t>(cfg.decoder_start_token_id),
                            at::TensorOptions().dtype(at::kInt));
  start.lengths.assign(batch, 1);
  GenerationCall s;
  prepare_call(g, start, start.host_ids, output_len, cfg.d_model(), model_->dtype(), device_, &s);
  generation_->start(s.ids.data_ptr<int32_t>(), start.lengths, 1, output_len, s.opt, s.out);
  call_ = std::move(s);
}

CallDriver Seq2SeqModelHolder::driver() {
  return CallDriver{generation_.get(), model_.get(), device_,
                    "Seq2SeqModel",    &call_,       [](const GenerationCall&, bool) {}};
}

at::Tensor Seq2SeqModelHolder::decode_step(int64_t max_steps) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  return driver().step(max_steps);
}

c10::Dict<std::string, at::Tensor> Seq2SeqModelHolder::decode_finish() {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  return driver().finish();
}

c10::Dict<std::string, at::Tensor> Seq2SeqModelHolder::decode(
    const at::Tensor& input_ids, const at::Tensor& input_lengths, int64_t output_len,
    const c10::Dict<std::string, at::Tensor>& options) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  decode_start(input_ids, input_lengths, output_len, options);
  driver().run_steps(output_len);  // the outputs are read from decode_finish's dict
  return decode_finish();
}

void Seq2SeqModelHolder::attach_tensor_parallel(const c10::intrusive_ptr<NcclCommHolder>& comm) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  TORCH_CHECK(comm->device() == device_,
              "Seq2SeqModel.attach_tensor_parallel: the communicator "
              "is on cuda:",
              comm->device(), " but the model is on cuda:", device_);
  TORCH_CHECK(!generation_->active(),
              "Seq2SeqModel: cannot attach a communicator during generation");
  model_->set_tensor_parallel(comm->get());
  generation_->drop_graphs(/*unshared_only=*/false);
  tp_comm_ = comm;
}

}  // namespace warpformer
