#include "csrc/torch/gpt_class.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "csrc/models/gpt/gpt_weights.h"
#include "csrc/torch/ops.h"
#include "csrc/torch/tensor_utils.h"

namespace warpformer {
namespace {

constexpr const char* kOp = "GptModel";

// True when `t` (contiguous) is the first rows of a storage that goes on for at least `rows` rows.
bool storage_holds_rows(const at::Tensor& t, int64_t rows) {
  const int64_t row_bytes = t.numel() / std::max<int64_t>(1, t.size(0)) * t.element_size();
  return t.is_contiguous() && (t.storage_offset() * t.element_size() + rows * row_bytes) <=
                                  static_cast<int64_t>(t.storage().nbytes());
}

// The tensors this rank needs and their per-rank shapes, from the model's weight table: this
// stage's layers, and the model-level tensors its stage needs (gpt_weights.h).
struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  bool optional;
  std::string dtype;  // "" (the model's), "int8" or "uint8" (quantized kernels, zero points)
};

std::vector<Spec> rank_specs(const gpt::GptConfig& c) {
  std::vector<Spec> s;
  for (const gpt::WeightEntry& w : gpt::weight_table(c)) {
    const bool wanted = w.layer >= 0
                            ? w.layer >= c.first_layer() && w.layer < c.end_layer()
                            : (c.first_stage() && w.stage.find("first") != std::string::npos) ||
                                  (c.last_stage() && w.stage.find("last") != std::string::npos);
    if (wanted) s.push_back({w.name, w.shard_shape(c.tensor_para_size), w.optional, w.dtype});
  }
  return s;
}

}  // namespace

GptModelHolder::GptModelHolder(const std::string& config,
                               c10::Dict<std::string, at::Tensor> weights,
                               const std::string& options)
    : config_json_(config),
      given_(weights),
      options_(ModelOptions::from_json(options, "GptModel options")) {
  const std::string& dtype = options_.dtype;
  gpt::GptConfig cfg = gpt::GptConfig::from_json(
      config, options_.tensor_para_rank, options_.pipeline_para_size, options_.pipeline_para_rank);
  // The head is a transposed product ([vocab, hidden]) the quantized kernels do not cover.
  TORCH_CHECK(!cfg.quant_lm_head, kOp,
              ": quant_lm_head: the engine runs the lm_head in the model's dtype; convert "
              "without --quant-lm-head (or use backend='reference')");
  const std::vector<Spec> specs = rank_specs(cfg);
  const bool need_wte =
      cfg.first_stage() || (cfg.last_stage() && !weights.contains("lm_head.weight"));

  // Presence, kind and shape of every weight first (these checks need no GPU), then devices.
  std::vector<std::pair<std::string, at::Tensor>> chosen;
  auto check = [&](const std::string& name, const std::vector<int64_t>& shape,
                   const std::string& stored = "") {
    const at::Tensor& t = weights.at(name);
    if (stored.empty()) {
      TORCH_CHECK(t.is_floating_point(), kOp, ": weight '", name,
                  "' must be a floating tensor, got ", t.scalar_type());
    } else {
      const c10::ScalarType want = stored == "int8" ? at::kChar : at::kByte;
      TORCH_CHECK(t.scalar_type() == want, kOp, ": weight '", name, "' must be ", stored,
                  " (weight_quant = ", cfg.weight_quant, "), got ", t.scalar_type());
    }
    TORCH_CHECK(t.sizes().vec() == shape, kOp, ": weight '", name, "' must have shape ",
                shape_str(shape), " for tensor_para_size ", cfg.tensor_para_size, ", got ",
                shape_str(t.sizes().vec()));
    chosen.emplace_back(name, t);
  };
  for (const Spec& s : specs) {
    if (!weights.contains(s.name)) {
      TORCH_CHECK(s.optional, kOp, ": missing weight '", s.name, "' (shape ", shape_str(s.shape),
                  ") for model_variant ", cfg.model_variant, ", layers ", cfg.first_layer(), "..",
                  cfg.end_layer() - 1);
      continue;
    }
    check(s.name, s.shape, s.dtype);
  }
  if (need_wte && !cfg.first_stage()) {
    TORCH_CHECK(weights.contains("wte"), kOp,
                ": missing weight 'wte' (needed by the tied lm_head)");
    check("wte", {cfg.vocab_size, cfg.embed_dim()});
  }
  // The first floating weight gives the default dtype and the device (every stage has norms).
  auto first_float = std::find_if(chosen.begin(), chosen.end(),
                                  [](const auto& c) { return c.second.is_floating_point(); });
  TORCH_CHECK(first_float != chosen.end(), kOp, ": no floating weight among the weights given");
  const std::string& ref_name = first_float->first;
  const at::Tensor& ref = first_float->second;
  // Arguments before devices: a bad dtype string is reported wherever the weights live.
  const DType dt = dtype.empty() ? to_dtype(ref.scalar_type(), kOp, ref_name.c_str())
                                 : parse_dtype(dtype, "GptModel: dtype");
  TORCH_CHECK(!cfg.quantized() || dt != DType::kFloat32, kOp, ": weight_quant = ", cfg.weight_quant,
              " serves float16 and bfloat16 models; got dtype float32");
  TORCH_CHECK(ref.is_cuda(), kOp, ": weight '", ref_name, "' must be a CUDA tensor, got device ",
              ref.device(), " (load weights with device='cuda')");
  device_ = ref.device().index();
  const c10::ScalarType st = to_scalar_type(dt);
  for (const auto& [name, t] : chosen) {
    TORCH_CHECK(t.is_cuda() && t.device().index() == device_, kOp, ": weight '", name, "' is on ",
                t.device(), " but '", ref_name, "' is on cuda:", device_,
                "; all weights must be on one GPU");
    at::Tensor own = t.is_floating_point() ? t.to(st).contiguous() : t.contiguous();
    // The quantized kernels load 16 bytes at a time: a view at another offset is copied.
    if (reinterpret_cast<std::uintptr_t>(own.data_ptr()) % 16 != 0) own = own.clone();
    owned_[name] = own;
  }

  auto ptr = [&](const std::string& name) -> const void* {
    auto it = owned_.find(name);
    return it == owned_.end() ? nullptr : it->second.data_ptr();
  };
  gpt::GptWeights w;
  layers::EmbeddingWeights& emb = w.embedding;
  emb.wte = ptr("wte");
  emb.wpe = ptr("wpe");
  emb.project_in = ptr("project_in.weight");
  if (cfg.has_pre_decoder_layernorm) {
    emb.norm = {ptr("pre_decoder_layernorm.weight"), ptr("pre_decoder_layernorm.bias")};
  }
  emb.vocab = cfg.vocab_size;
  emb.max_positions = cfg.max_pos_seq_len;
  emb.embed_dim = cfg.embed_dim();
  if (cfg.has_post_decoder_layernorm) {
    w.final_norm = {ptr("final_layernorm.weight"), ptr("final_layernorm.bias")};
  }
  layers::LmHeadWeights& head_w = w.lm_head;
  head_w.project_out = ptr("project_out.weight");
  head_w.embed_dim = cfg.embed_dim();
  head_w.local_vocab = cfg.local_vocab();
  head_w.tp = cfg.tensor_para_size;
  if (cfg.last_stage()) {
    // The head multiplies local_vocab() rows: this rank's slice of the vocabulary, padded to a
    // multiple of 8. On one GPU a tensor whose storage already holds the padding rows past its
    // vocab_size (load_weights allocates it so) is used in place: the padding logits are never
    // read, so those rows need no particular values. Otherwise the rows are copied, with zeros,
    // and the full tensor is dropped unless the embedding still reads it (a tied head on the
    // first stage): what stays alive of it is the caller's own tensor, not a converted copy.
    const int64_t vl = cfg.local_vocab(), start = cfg.tensor_para_rank * vl;
    const int64_t n = std::max<int64_t>(0, std::min(vl, cfg.vocab_size - start));
    const std::string head_name = owned_.count("lm_head.weight") ? "lm_head.weight" : "wte";
    const at::Tensor head = owned_.at(head_name);
    const bool one_gpu = cfg.tensor_para_size == 1;
    const bool pad_bias = owned_.count("lm_head.bias") && (!one_gpu || vl != cfg.vocab_size);
    const bool copy_head = !one_gpu || (vl != cfg.vocab_size && !storage_holds_rows(head, vl));
    // This rank's rows [start, start + n) of `full` (the head or its bias) in a zeroed tensor of
    // vl rows, in the head's dtype.
    auto local_rows = [&](const at::Tensor& full) {
      std::vector<int64_t> shape = full.sizes().vec();
      shape[0] = vl;
      at::Tensor local = at::zeros(shape, head.options());
      if (n > 0) local.narrow(0, 0, n).copy_(full.narrow(0, start, n));
      return local;
    };
    head_w.weight = head.data_ptr();
    head_w.bias = ptr("lm_head.bias");
    if (copy_head) {
      const at::Tensor local = local_rows(head);
      owned_["lm_head.local"] = local;
      head_w.weight = local.data_ptr();
      if (head_name == "lm_head.weight" || !cfg.first_stage()) {
        owned_.erase(head_name);
        if (head_name == "wte") emb.wte = nullptr;
      }
    }
    if (pad_bias) {
      const at::Tensor lb = local_rows(owned_.at("lm_head.bias"));
      owned_["lm_head.bias.local"] = lb;
      owned_.erase("lm_head.bias");
      head_w.bias = lb.data_ptr();
    }
  }
  for (int64_t n = cfg.first_layer(); n < cfg.end_layer(); ++n) {
    const std::string p = "layers." + std::to_string(n) + ".";
    const int64_t h = cfg.hidden(), lh = cfg.local_hidden(), li = cfg.local_inter();
    auto linear = [&](const std::string& name, int64_t in, int64_t out) {
      layers::Linear l;
      const std::string weight = p + name + ".weight";
      l.weight = ptr(weight);
      l.bias = ptr(p + name + ".bias");
      l.in = in;
      l.out = out;
      if (cfg.quantized()) {
        l.format =
            cfg.weight_quant == "int8" ? layers::WeightFormat::kInt8 : layers::WeightFormat::kInt4;
        l.scales = ptr(weight + gpt::kScaleSuffix);
        l.zeros = ptr(weight + gpt::kZeroSuffix);
        l.group = cfg.weight_quant == "int4" ? cfg.quant_group_size : 0;
      }
      return l;
    };
    layers::LayerWeights lw;
    lw.ln1 = {ptr(p + "input_layernorm.weight"), ptr(p + "input_layernorm.bias")};
    lw.qkv = linear("attention.query_key_value", h,
                    (cfg.local_heads() + 2 * cfg.local_kv_heads()) * cfg.size_per_head);
    lw.dense = linear("attention.dense", lh, h);
    lw.ln2 = {ptr(p + "post_attention_layernorm.weight"), ptr(p + "post_attention_layernorm.bias")};
    lw.fc1 = linear("mlp.dense_h_to_4h", h, li);
    if (cfg.use_gated_activation) lw.gate = linear("mlp.gate", h, li);
    lw.fc2 = linear("mlp.dense_4h_to_h", li, h);
    if (cfg.parallel_residual) {
      // One residual add carries both row-parallel biases: precompute their sum (none when
      // neither exists).
      at::Tensor rb;
      for (const char* name : {"mlp.dense_4h_to_h.bias", "attention.dense.bias"}) {
        auto it = owned_.find(p + name);
        if (it == owned_.end()) continue;
        rb = rb.defined() ? rb.add_(it->second) : it->second.clone();
      }
      if (rb.defined()) {
        owned_[p + "residual_bias"] = rb;
        lw.residual_bias = rb.data_ptr();
      }
    }
    w.layers.push_back(lw);
  }

  const c10::cuda::CUDAGuard guard(device_);
  auto ctx = std::make_shared<CudaContext>(static_cast<int>(device_),
                                           c10::cuda::getCurrentCUDAStream(device_).stream(),
                                           torch_cuda_allocator());
  model_ =
      std::make_unique<gpt::GptModel>(std::move(cfg), std::move(w), dt, std::move(ctx),
                                      options_.max_batch, options_.max_seq_len, options_.engine);
  generation_ = std::make_unique<generation::Session>(model_.get(), options_.engine.cuda_graphs);
  // GEMM algorithms: the tuning file given, else $WARPFORMER_GEMM_CONFIG, else heuristics.
  const std::string tuning = options_.tuning_file();
  if (!tuning.empty()) {
    // The Python loader turns a note about an unused file into a warning (gemm_tuning_note()).
    if (!model_->gemm().load_tuning(tuning, &gemm_note_)) TORCH_WARN(gemm_note_);
  }
}

GptModelHolder::Prompt GptModelHolder::check_inputs(const char* op, const at::Tensor& input_ids,
                                                    const at::Tensor& input_lengths,
                                                    int64_t extra_len, int64_t table_rows) const {
  PromptLimits limits;
  limits.max_batch = model_->max_batch();
  limits.max_seq_len = model_->max_seq_len();
  limits.vocab = model_->vocab_size();
  limits.device = device_;
  limits.table_rows = table_rows;
  return check_prompt(op, input_ids, input_lengths, extra_len, limits);
}

at::Tensor GptModelHolder::forward(const at::Tensor& input_ids, const at::Tensor& input_lengths) {
  return forward_windowed(input_ids, input_lengths, 0);
}

at::Tensor GptModelHolder::forward_windowed(const at::Tensor& input_ids,
                                            const at::Tensor& input_lengths, int64_t window,
                                            int64_t table_rows) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  const char* op = "GptModel.forward";
  TORCH_CHECK(!generation_->active(), op,
              ": a generation session is running (it owns the KV cache); call decode_finish()");
  check_parallel_ready(op);
  const Prompt p = check_inputs(op, input_ids, input_lengths, 0, table_rows);
  const c10::cuda::CUDAGuard guard(device_);
  model_->context().set_stream(c10::cuda::getCurrentCUDAStream(device_).stream());
  const at::Tensor ids =
      input_ids.is_cuda() ? input_ids.contiguous() : upload_together({p.host_ids}, device_)[0];
  at::Tensor logits = at::empty({ids.size(0), ids.size(1), model_->vocab_size()},
                                ids.options().dtype(to_scalar_type(model_->dtype())));
  model_->set_attention_window(window);
  model_->forward(ids.data_ptr<int32_t>(), p.lengths, ids.size(1), logits.data_ptr());
  return logits;
}

std::tuple<at::Tensor, at::Tensor> GptModelHolder::generate(const at::Tensor& input_ids,
                                                            const at::Tensor& input_lengths,
                                                            int64_t output_len, int64_t end_id) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  const char* op = "GptModel.generate";
  TORCH_CHECK(!generation_->active(), op,
              ": a generation session is running; call decode_finish() first");
  TORCH_CHECK(output_len >= 1, op, ": output_len must be >= 1, got ", output_len);
  const int64_t vocab = model_->vocab_size();
  TORCH_CHECK(end_id < vocab, op, ": end_id ", end_id, " is outside the vocabulary [0, ", vocab,
              ")");
  check_parallel_ready(op);
  const Prompt p = check_inputs(op, input_ids, input_lengths, output_len);
  const c10::cuda::CUDAGuard guard(device_);
  model_->context().set_stream(c10::cuda::getCurrentCUDAStream(device_).stream());
  const int64_t batch = input_ids.size(0), seq = input_ids.size(1), total = seq + output_len;
  const auto eid = static_cast<int32_t>(end_id >= 0 ? end_id : model_->config().end_id);
  // output_ids (the prompt, then end ids, also over each row's padding), the sequence lengths
  // (the prompt lengths until tokens are added), the end ids and, for CPU inputs, the ids:
  // built on the host and sent with one copy.
  const at::Tensor end_ids = at::full({batch}, eid, at::TensorOptions().dtype(at::kInt));
  const at::Tensor lengths =
      at::from_blob(const_cast<int32_t*>(p.lengths.data()), {batch, 1}, at::kInt);
  std::vector<at::Tensor> host = {prompt_then_end_ids(p, end_ids.data_ptr<int32_t>(), 1, total),
                                  lengths, end_ids};
  if (!input_ids.is_cuda()) host.push_back(p.host_ids);
  const std::vector<at::Tensor> dev = upload_together(host, device_);
  const at::Tensor ids = input_ids.is_cuda() ? input_ids.contiguous() : dev[3];
  model_->set_attention_window(0);
  generation_->generate_greedy(ids.data_ptr<int32_t>(), p.lengths, seq, output_len,
                               dev[2].data_ptr<int32_t>(), dev[0].data_ptr<int32_t>(),
                               dev[1].data_ptr<int32_t>());
  return {dev[0], dev[1]};
}

void GptModelHolder::check_parallel_ready(const char* op) const {
  const auto& c = model_->config();
  TORCH_CHECK(c.tensor_para_size == 1 || tp_comm_, op, ": tensor_para_size is ", c.tensor_para_size,
              " but no tensor-parallel communicator is attached (load the "
              "model with warpformer.distributed.load_gpt_model or warpformer.GPT)");
  TORCH_CHECK(c.pipeline_para_size == 1 || pp_comm_, op, ": pipeline_para_size is ",
              c.pipeline_para_size,
              " but no pipeline-parallel communicator is attached (load the "
              "model with warpformer.distributed.load_gpt_model or warpformer.GPT)");
}

void GptModelHolder::attach_pipeline_parallel(const c10::intrusive_ptr<NcclCommHolder>& comm) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  TORCH_CHECK(comm->device() == device_,
              "GptModel.attach_pipeline_parallel: the communicator is "
              "on cuda:",
              comm->device(), " but the model is on cuda:", device_);
  attach(comm, [this](Communicator* c) { model_->set_pipeline_parallel(c); });
  pp_comm_ = comm;
}

void GptModelHolder::attach_tensor_parallel(const c10::intrusive_ptr<NcclCommHolder>& comm) {
  const std::lock_guard<std::recursive_mutex> lock(call_mu_);
  TORCH_CHECK(comm->device() == device_,
              "GptModel.attach_tensor_parallel: the communicator is on "
              "cuda:",
              comm->device(), " but the model is on cuda:", device_);
  attach(comm, [this](Communicator* c) { model_->set_tensor_parallel(c); });
  tp_comm_ = comm;
}

void GptModelHolder::attach(const c10::intrusive_ptr<NcclCommHolder>& comm,
                            const std::function<void(Communicator*)>& install) {
  // A session sized its state for the groups it started with (e.g. the pipeline micro-batches).
  TORCH_CHECK(!generation_->active(), "GptModel: cannot attach a communicator during generation");
  install(comm->get());  // validates, waits for the model's stream, then installs
  // No step graph may outlive the communicator it baked.
  generation_->drop_graphs(/*unshared_only=*/false);
}

GptModelHolder::State GptModelHolder::get_state() const {
  return State{config_json_, given_, options_.to_json()};
}

namespace ops {

std::string gpt_weight_table(const std::string& config) {
  // The format's table: no engine-only rule (a model the kernels cannot run still converts and
  // runs on the reference backend).
  const gpt::GptConfig c = gpt::GptConfig::from_json(config, 0, 1, 0, /*engine=*/false);
  return gpt::weight_table_json(gpt::weight_table(c));
}

}  // namespace ops
}  // namespace warpformer
