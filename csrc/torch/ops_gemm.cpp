// Torch ops over the cuBLASLt Gemm of csrc/core: a plain matmul in the engine's weight layout (for
// tests) and the per-shape algorithm timing that `warpformer gemm-tune` uses.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cfloat>
#include <cmath>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "csrc/core/activation.h"
#include "csrc/core/check.h"
#include "csrc/core/gemm.h"
#include "csrc/layers/linear.h"
#include "csrc/torch/ops.h"
#include "csrc/torch/tensor_utils.h"
#include "kernels/gemv.h"

namespace warpformer {
namespace ops {
namespace {

// A contiguous tensor at a 16-byte aligned address (a copy of a misaligned view), as the
// engine's buffers are: cuBLASLt's plans and the GEMV's vector loads assume it.
at::Tensor aligned_contiguous(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return reinterpret_cast<std::uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

GemmEpilogue parse_epilogue(const std::string& s, const char* op) {
  GemmEpilogue e = GemmEpilogue::kNone;
  TORCH_CHECK(parse_gemm_epilogue(s, &e), op, ": epilogue must be one of ", gemm_epilogue_names(),
              "; got '", s, "'");
  return e;
}

struct GemmArgs {
  GemmKey key;
  at::Tensor in, w, bias;
};

// input [m, k]; weight [k, n] (or [n, k] when transposed); bias [n] for the bias epilogues.
GemmArgs check_gemm(const char* op, const at::Tensor& input, const at::Tensor& weight,
                    const OptTensor& bias, bool transposed, const std::string& epilogue,
                    bool accumulate) {
  check_floating(input, op, "input");
  check_dim(input, 2, op, "input");
  check_dtype(weight, input.scalar_type(), op, "weight", "the dtype of input");
  check_dim(weight, 2, op, "weight");
  const int64_t m = input.size(0), k = input.size(1);
  const int64_t n = transposed ? weight.size(0) : weight.size(1);
  check_size(weight, transposed ? 1 : 0, k, op, "weight", "input.shape[1]");
  const GemmEpilogue epi = parse_epilogue(epilogue, op);
  TORCH_CHECK(epi == GemmEpilogue::kNone || bias.has_value(), op, ": epilogue '", epilogue,
              "' needs a bias");
  if (bias.has_value()) {
    check_dtype(*bias, input.scalar_type(), op, "bias", "the dtype of input");
    check_dim(*bias, 1, op, "bias");
    check_size(*bias, 0, n, op, "bias", "the output width");
  }
  TORCH_CHECK(m > 0 && n > 0 && k > 0, op, ": empty matrices (m=", m, ", n=", n, ", k=", k, ")");
  check_cuda(input, op, "input");
  check_cuda(weight, op, "weight", input, "input");
  if (bias.has_value()) check_cuda(*bias, op, "bias", input, "input");
  GemmArgs a;
  a.key = GemmKey{m, n, k, to_dtype(input.scalar_type(), op, "input"), epi, accumulate, transposed};
  a.in = aligned_contiguous(input);
  a.w = weight.contiguous();
  if (bias.has_value()) a.bias = bias->contiguous();
  return a;
}

// A context per call: its workspace is reserved whole up front, since a call may be captured
// into a CUDA graph (benchmarks time the op that way), where it could not grow.
std::shared_ptr<CudaContext> context_for(const at::Tensor& t) {
  return std::make_shared<CudaContext>(t.device().index(), current_stream(t),
                                       torch_cuda_allocator(), Gemm::kMaxWorkspaceBytes);
}

// An epilogue of the gemm ops: every one runs through the activation after the bias, like the
// engine's MLP. (The tuner's gemm_benchmark keeps cuBLASLt's own epilogue set.)
struct OpEpilogue {
  const char* name;
  kernels::Activation act;
  bool bias;
};

const OpEpilogue* parse_op_epilogue(const std::string& epilogue, const char* op) {
  using A = kernels::Activation;
  static constexpr OpEpilogue kEpilogues[] = {
      {"none", A::kIdentity, false},          {"bias", A::kIdentity, true},
      {"bias_gelu_tanh", A::kGeluTanh, true}, {"bias_gelu_erf", A::kGeluErf, true},
      {"bias_relu", A::kRelu, true},          {"bias_silu", A::kSilu, true}};
  const OpEpilogue* found = nullptr;
  for (const OpEpilogue& e : kEpilogues) {
    if (epilogue == e.name) found = &e;
  }
  TORCH_CHECK(found != nullptr, op,
              ": epilogue must be one of none, bias, bias_gelu_tanh, bias_gelu_erf, bias_relu, "
              "bias_silu; got '",
              epilogue, "'");
  return found;
}

}  // namespace

at::Tensor gemm(const at::Tensor& input, const at::Tensor& weight, const OptTensor& bias,
                bool transposed, const std::string& epilogue, const std::string& backend,
                const OptTensor& residual) {
  const char* op = "warpformer.gemm";
  const OpEpilogue* epi = parse_op_epilogue(epilogue, op);
  const kernels::Activation act = epi->act;
  const std::string lt_epilogue = epi->bias ? "bias" : "none";
  TORCH_CHECK(
      backend == "auto" || backend == "gemv" || backend == "gemv_static" || backend == "cublaslt",
      op, ": backend must be one of auto, gemv, gemv_static, cublaslt; got '", backend, "'");
  const bool gemv_only = backend == "gemv" || backend == "gemv_static";
  TORCH_CHECK(epilogue != "none" || !bias.has_value(), op,
              ": a bias was given with epilogue 'none'; use epilogue 'bias' to add it");
  GemmArgs a = check_gemm(op, input, weight, bias, transposed, lt_epilogue, false);
  TORCH_CHECK(!transposed || act == kernels::Activation::kIdentity, op,
              ": transposed weights support the none and bias epilogues only");
  const c10::cuda::CUDAGuard guard(input.device());
  auto ctx = context_for(a.in);
  Gemm g(ctx.get());
  if (backend == "cublaslt") g.set_gemv_policy(Gemm::GemvPolicy::kNever);
  if (gemv_only) {
    const int64_t vec = 16 / static_cast<int64_t>(dtype_size(a.key.dtype));
    TORCH_CHECK(a.key.m <= kernels::kGemvMaxRows, op, ": backend '", backend,
                "' needs input.shape[0] <= ", kernels::kGemvMaxRows, ", got ", a.key.m);
    TORCH_CHECK(a.key.k % vec == 0 && (transposed || a.key.n % vec == 0), op, ": backend '",
                backend, "' needs k", transposed ? "" : " and n", " to be multiples of ", vec,
                " (16 bytes of ", dtype_name(a.key.dtype), "), got k=", a.key.k, ", n=", a.key.n);
    g.set_gemv_policy(Gemm::GemvPolicy::kAlways);
    // The engine's path: the weight is read before the kernel ahead has finished, which the
    // caller promises does not write it.
    g.set_static_weights(backend == "gemv_static");
  }
  at::Tensor out;
  if (residual.has_value()) {
    TORCH_CHECK(!transposed, op, ": residual is supported with [k, n] weights only");
    check_dtype(*residual, input.scalar_type(), op, "residual", "the dtype of input");
    check_cuda(*residual, op, "residual", input, "input");
    TORCH_CHECK(
        residual->dim() == 2 && residual->size(0) == a.key.m && residual->size(1) == a.key.n, op,
        ": residual must have shape [", a.key.m, ", ", a.key.n, "], got ", residual->sizes());
    out = residual->clone(at::MemoryFormat::Contiguous);
  } else {
    out = at::empty({a.key.m, a.key.n}, a.in.options());
  }
  const float beta = residual.has_value() ? 1.f : 0.f;
  const void* bp = a.bias.defined() ? a.bias.data_ptr() : nullptr;
  if (transposed) {
    g.run_transposed(a.key.dtype, a.in.data_ptr(), a.w.data_ptr(), bp, out.data_ptr(), a.key.m,
                     a.key.n, a.key.k);
  } else {
    g.run_act(a.key.dtype, a.in.data_ptr(), a.w.data_ptr(), bp, out.data_ptr(), a.key.m, a.key.n,
              a.key.k, act, beta);
  }
  return out;
}

namespace {

// norm_gemm's arguments, checked, made contiguous, and described as the product's input (x and
// norm(x) outputs not yet set).
struct NormGemmArgs {
  at::Tensor input, norm_weight, weight;
  OptTensor residual, input_bias, norm_bias, bias;
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::kFloat32;
  kernels::Activation act = kernels::Activation::kIdentity;
  GemmNormedInput in;
};

OptTensor contiguous(const OptTensor& t) {
  return t.has_value() ? OptTensor(t->contiguous()) : OptTensor();
}

// The product operand pair of a norm_gemm-like op: weight [k, n] and bias [n] of input's dtype.
void check_norm_product(const char* op, const at::Tensor& input, const at::Tensor& weight,
                        const OptTensor& bias, const char* weight_name, const char* bias_name,
                        const char* n_name) {
  const int64_t k = input.size(1);
  check_dtype(weight, input.scalar_type(), op, weight_name, "the dtype of input");
  check_dim(weight, 2, op, weight_name);
  check_size(weight, 0, k, op, weight_name, "input.shape[1]");
  if (bias.has_value()) {
    check_dtype(*bias, input.scalar_type(), op, bias_name, "the dtype of input");
    check_dim(*bias, 1, op, bias_name);
    check_size(*bias, 0, weight.size(1), op, bias_name, n_name);
  }
}

// more_checks: the caller's further dtype and shape checks, run before the device checks (so
// that every dtype or shape error is reported alike with or without a GPU).
NormGemmArgs check_norm_gemm(const char* op, const at::Tensor& input, const OptTensor& residual,
                             const OptTensor& input_bias, const at::Tensor& norm_weight,
                             const OptTensor& norm_bias, const std::string& norm, double eps,
                             const at::Tensor& weight, const OptTensor& bias,
                             const std::string& activation,
                             const std::function<void()>& more_checks = {}) {
  TORCH_CHECK(norm == "layer_norm" || norm == "rms_norm", op,
              ": norm must be one of layer_norm, rms_norm; got '", norm, "'");
  TORCH_CHECK(norm == "layer_norm" || !norm_bias.has_value(), op,
              ": norm_bias is for layer_norm only (rms_norm has no bias)");
  TORCH_CHECK(eps >= 0.0 && eps <= FLT_MAX, op, ": eps must be >= 0 and finite in float32, got ",
              eps);
  NormGemmArgs a;
  a.act = parse_activation(activation, (std::string(op) + ": activation").c_str());
  check_floating(input, op, "input");
  check_dim(input, 2, op, "input");
  a.m = input.size(0);
  a.k = input.size(1);
  if (residual.has_value()) check_norm_residual(op, input, *residual);
  check_norm_vector(op, input, input_bias, "input_bias", "input.shape[1]");
  check_norm_vector(op, input, norm_weight, "norm_weight", "input.shape[1]");
  check_norm_vector(op, input, norm_bias, "norm_bias", "input.shape[1]");
  check_norm_product(op, input, weight, bias, "weight", "bias", "weight.shape[1]");
  a.n = weight.size(1);
  TORCH_CHECK(a.m > 0 && a.n > 0 && a.k > 0, op, ": empty matrices (m=", a.m, ", n=", a.n,
              ", k=", a.k, ")");
  if (more_checks) more_checks();
  const OptTensor* all[] = {&residual, &input_bias, &norm_bias, &bias};
  const char* names[] = {"residual", "input_bias", "norm_bias", "bias"};
  check_cuda(input, op, "input");
  check_cuda(norm_weight, op, "norm_weight", input, "input");
  check_cuda(weight, op, "weight", input, "input");
  for (size_t i = 0; i < 4; ++i) {
    if (all[i]->has_value()) check_cuda(**all[i], op, names[i], input, "input");
  }
  a.input = input.contiguous();
  a.residual = contiguous(residual);
  a.input_bias = contiguous(input_bias);
  a.norm_weight = norm_weight.contiguous();
  a.norm_bias = contiguous(norm_bias);
  a.weight = weight.contiguous();
  a.bias = contiguous(bias);
  a.dtype = to_dtype(input.scalar_type(), op, "input");
  a.in.kind = norm == "layer_norm" ? kernels::NormKind::kLayerNorm : kernels::NormKind::kRmsNorm;
  a.in.input = a.input.data_ptr();
  a.in.residual = ptr_or_null<void>(a.residual);
  a.in.input_bias = ptr_or_null<void>(a.input_bias);
  a.in.gamma = a.norm_weight.data_ptr();
  a.in.beta = ptr_or_null<void>(a.norm_bias);
  a.in.eps = static_cast<float>(eps);
  return a;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_gemm(
    const at::Tensor& input, const OptTensor& residual, const OptTensor& input_bias,
    const at::Tensor& norm_weight, const OptTensor& norm_bias, const std::string& norm, double eps,
    const at::Tensor& weight, const OptTensor& bias, const std::string& activation,
    const std::string& backend) {
  const char* op = "warpformer.norm_gemm";
  TORCH_CHECK(backend == "fused" || backend == "unfused", op,
              ": backend must be one of fused, unfused; got '", backend, "'");
  NormGemmArgs a = check_norm_gemm(op, input, residual, input_bias, norm_weight, norm_bias, norm,
                                   eps, weight, bias, activation);
  const c10::cuda::CUDAGuard guard(input.device());
  const int64_t m = a.m, n = a.n, k = a.k;
  at::Tensor out = at::empty({m, n}, a.input.options());
  at::Tensor x = at::empty({m, k}, a.input.options());
  at::Tensor normed = at::empty({m, k}, a.input.options());
  a.in.residual_out = x.data_ptr();
  a.in.out = normed.data_ptr();
  a.in.keep_out = true;
  auto ctx = context_for(a.input);
  Gemm gemm(ctx.get());
  gemm.set_gemv_policy(Gemm::GemvPolicy::kAlways);  // both backends: the GEMV where it can run
  gemm.set_norm_fusion(backend == "fused");
  const void* w = a.weight.data_ptr();
  const void* b = ptr_or_null<void>(a.bias);
  if (backend == "fused") {
    const bool ok = gemm.fuses_norm(a.dtype, a.in, w, b, out.data_ptr(), m, n, k, a.act);
    TORCH_CHECK(ok, op, ": backend 'fused' cannot run m=", m, ", n=", n, ", k=", k, " in ",
                dtype_name(a.dtype), ": it needs at most ", kernels::kGemvMaxRows,
                " rows, k and n multiples of 16 bytes, 16-byte aligned tensors, a row short "
                "enough for one norms block, and the block's share of k plus its reduction "
                "arrays within 48 KiB of shared memory; use backend 'unfused'");
  }
  gemm.run_normed(a.dtype, a.in, w, b, out.data_ptr(), m, n, k, a.act);
  return {out, x, normed};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_gemm_pair(
    const at::Tensor& input, const OptTensor& residual, const OptTensor& input_bias,
    const at::Tensor& norm_weight, const OptTensor& norm_bias, const std::string& norm, double eps,
    const at::Tensor& weight, const OptTensor& bias, const std::string& activation,
    const at::Tensor& weight2, const OptTensor& bias2, const std::string& activation2,
    const OptTensor& norm_weight2, const OptTensor& norm_bias2, const std::string& backend) {
  const char* op = "warpformer.norm_gemm_pair";
  TORCH_CHECK(backend == "joined" || backend == "separate", op,
              ": backend must be one of joined, separate; got '", backend, "'");
  kernels::Activation act2 = kernels::Activation::kIdentity;
  NormGemmArgs a = check_norm_gemm(
      op, input, residual, input_bias, norm_weight, norm_bias, norm, eps, weight, bias, activation,
      [&] {
        act2 = parse_activation(activation2, "warpformer.norm_gemm_pair: activation2");
        check_norm_product(op, input, weight2, bias2, "weight2", "bias2", "weight2.shape[1]");
        TORCH_CHECK(norm_weight2.has_value() || !norm_bias2.has_value(), op,
                    ": norm_bias2 needs norm_weight2 (without it the second product uses the "
                    "first's norm)");
        TORCH_CHECK(norm == "layer_norm" || !norm_bias2.has_value(), op,
                    ": norm_bias2 is for layer_norm only (rms_norm has no bias)");
        check_norm_vector(op, input, norm_weight2, "norm_weight2", "input.shape[1]");
        check_norm_vector(op, input, norm_bias2, "norm_bias2", "input.shape[1]");
        TORCH_CHECK(weight2.size(1) > 0, op, ": empty matrix weight2 (n2=0)");
      });
  const int64_t n2 = weight2.size(1);
  check_cuda(weight2, op, "weight2", input, "input");
  const OptTensor* all[] = {&bias2, &norm_weight2, &norm_bias2};
  const char* names[] = {"bias2", "norm_weight2", "norm_bias2"};
  for (size_t i = 0; i < 3; ++i) {
    if (all[i]->has_value()) check_cuda(**all[i], op, names[i], input, "input");
  }
  const c10::cuda::CUDAGuard guard(input.device());
  const int64_t m = a.m, k = a.k;
  const at::Tensor w2 = weight2.contiguous();
  const OptTensor b2 = contiguous(bias2), g2 = contiguous(norm_weight2);
  const OptTensor nb2 = contiguous(norm_bias2);
  at::Tensor out = at::empty({m, a.n}, a.input.options());
  at::Tensor out2 = at::empty({m, n2}, a.input.options());
  at::Tensor x = at::empty({m, k}, a.input.options());
  at::Tensor normed = at::empty({m, k}, a.input.options());  // scratch of unfused products
  a.in.residual_out = x.data_ptr();
  a.in.out = normed.data_ptr();
  layers::PairedProduct first{a.weight.data_ptr(), ptr_or_null<void>(a.bias), out.data_ptr(), a.n,
                              a.act};
  layers::PairedProduct second{w2.data_ptr(), ptr_or_null<void>(b2), out2.data_ptr(), n2, act2};
  auto ctx = context_for(a.input);
  Gemm gemm(ctx.get());
  gemm.set_gemv_policy(Gemm::GemvPolicy::kAlways);
  if (backend == "joined") {
    const layers::NormWeights norm2{ptr_or_null<void>(g2), ptr_or_null<void>(nb2)};
    const bool ran = layers::normed_pair(gemm, a.dtype, a.in, first, second, norm2, m, k);
    TORCH_CHECK(ran, op, ": backend 'joined' cannot run m=", m, ", n=", a.n, ", n2=", n2, ", k=", k,
                " in ", dtype_name(a.dtype), ": it needs at most ", kernels::kGemvMaxRows,
                " rows, k, n and n2 multiples of 16 bytes, 16-byte aligned tensors, a row short "
                "enough for one norms block, and the block's share of k plus its reduction "
                "arrays within 48 KiB of shared memory; use backend 'separate'");
    return {out, out2, x};
  }
  // Each product as norm_gemm's fused backend runs it where it can (else a norms kernel first).
  gemm.run_normed(a.dtype, a.in, first.weight, first.bias, out.data_ptr(), m, a.n, k, a.act);
  GemmNormedInput in2 = a.in;
  if (g2.has_value()) {
    in2.gamma = g2->data_ptr();
    in2.beta = ptr_or_null<void>(nb2);
  }
  in2.residual_out = nullptr;  // written by the first product
  gemm.run_normed(a.dtype, in2, second.weight, second.bias, out2.data_ptr(), m, n2, k, act2);
  return {out, out2, x};
}

at::Tensor gemm_sum(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& input2,
                    const at::Tensor& weight2, const std::string& backend) {
  const char* op = "warpformer.gemm_sum";
  TORCH_CHECK(backend == "joined" || backend == "joined_ready" || backend == "separate", op,
              ": backend must be one of joined, joined_ready, separate; got '", backend, "'");
  check_floating(input, op, "input");
  check_dim(input, 2, op, "input");
  check_dtype(input2, input.scalar_type(), op, "input2", "the dtype of input");
  check_dim(input2, 2, op, "input2");
  check_size(input2, 0, input.size(0), op, "input2", "input.shape[0]");
  const int64_t m = input.size(0), k = input.size(1), k2 = input2.size(1);
  for (const auto& [w, name] : {std::pair{&weight, "weight"}, std::pair{&weight2, "weight2"}}) {
    check_dtype(*w, input.scalar_type(), op, name, "the dtype of input");
    check_dim(*w, 2, op, name);
  }
  const int64_t n = weight.size(1);
  check_size(weight, 0, k, op, "weight", "input.shape[1]");
  check_size(weight2, 0, k2, op, "weight2", "input2.shape[1]");
  check_size(weight2, 1, n, op, "weight2", "weight.shape[1]");
  TORCH_CHECK(m > 0 && n > 0 && k > 0 && k2 > 0, op, ": empty matrices (m=", m, ", n=", n,
              ", k=", k, ", k2=", k2, ")");
  check_cuda(input, op, "input");
  check_cuda(weight, op, "weight", input, "input");
  check_cuda(input2, op, "input2", input, "input");
  check_cuda(weight2, op, "weight2", input, "input");
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor x = input.contiguous(), w = weight.contiguous();
  const at::Tensor x2 = input2.contiguous(), w2 = weight2.contiguous();
  at::Tensor out = at::empty({m, n}, x.options());
  const DType dtype = to_dtype(input.scalar_type(), op, "input");
  auto ctx = context_for(x);
  Gemm gemm(ctx.get());
  gemm.set_gemv_policy(Gemm::GemvPolicy::kAlways);
  if (backend == "separate") {
    gemm.run(dtype, x.data_ptr(), w.data_ptr(), nullptr, out.data_ptr(), m, n, k);
    gemm.run(dtype, x2.data_ptr(), w2.data_ptr(), nullptr, out.data_ptr(), m, n, k2,
             GemmEpilogue::kNone, 1.f);
    return out;
  }
  const bool fits = layers::joins_sum(gemm, dtype, x.data_ptr(), w.data_ptr(), k, x2.data_ptr(),
                                      w2.data_ptr(), k2, out.data_ptr(), m, n);
  TORCH_CHECK(fits, op, ": backend '", backend, "' cannot run m=", m, ", n=", n, ", k=", k,
              ", k2=", k2, " in ", dtype_name(dtype), ": it needs at most ", kernels::kGemvMaxRows,
              " rows, k, k2 and n multiples of 16 bytes and 16-byte aligned tensors; use backend "
              "'separate'");
  const bool joined =
      layers::product_sum(gemm, dtype, x.data_ptr(), w.data_ptr(), k, x2.data_ptr(), w2.data_ptr(),
                          k2, out.data_ptr(), m, n, backend == "joined_ready");
  TORCH_CHECK(joined, op, ": internal error: the joined launch did not run");
  return out;
}

at::Tensor gemm_benchmark(const at::Tensor& input, const at::Tensor& weight, const OptTensor& bias,
                          bool transposed, const std::string& epilogue, bool accumulate,
                          int64_t max_algos, int64_t reps) {
  const char* op = "warpformer.gemm_benchmark";
  TORCH_CHECK(max_algos >= 1 && max_algos <= 64, op, ": max_algos must be in [1, 64], got ",
              max_algos);
  TORCH_CHECK(reps >= 1 && reps <= 1000, op, ": reps must be in [1, 1000], got ", reps);
  // weight [k, n] ([n, k] transposed), or copies of it stacked [copies, k, n] that the timed
  // launches take in turn (a weight read from DRAM rather than from L2). Each copy must be
  // contiguous; the copies may be further apart (the tuner aligns each to 256 bytes).
  TORCH_CHECK(weight.dim() == 2 || (weight.dim() == 3 && weight.size(0) >= 1), op,
              ": weight must be 2-D, or 3-D [copies, ...] with at least one copy; got shape ",
              weight.sizes());
  at::Tensor copies = weight.dim() == 3 ? weight : weight.unsqueeze(0);
  const bool overlap = copies.size(0) > 1 && copies.stride(0) < copies[0].numel();
  if (!copies[0].is_contiguous() || overlap) copies = copies.contiguous();
  GemmArgs a = check_gemm(op, input, copies[0], bias, transposed, epilogue, accumulate);
  std::vector<const void*> weights;
  for (int64_t c = 0; c < copies.size(0); ++c) weights.push_back(copies[c].data_ptr());
  const c10::cuda::CUDAGuard guard(input.device());
  auto ctx = context_for(a.in);
  Gemm g(ctx.get());
  at::Tensor out = at::randn({a.key.m, a.key.n}, a.in.options());
  const std::vector<float> t =
      g.benchmark(a.key, a.in.data_ptr(), weights, a.bias.defined() ? a.bias.data_ptr() : nullptr,
                  out.data_ptr(), static_cast<int>(max_algos), static_cast<int>(reps));
  at::Tensor res =
      at::empty({static_cast<int64_t>(t.size())}, at::TensorOptions().dtype(at::kFloat));
  std::copy(t.begin(), t.end(), res.data_ptr<float>());
  return res;
}

namespace {

// A quantized weight's tensors checked against the rules of docs/FORMAT.md and the GEMV's
// (kernels::gemv_quant_supported), as a Linear without pointers; dtypes and shapes only.
layers::Linear check_quant_weight(const char* op, const at::Tensor& weight, const at::Tensor& scale,
                                  const OptTensor& zero, int64_t group_size) {
  layers::Linear lin;
  check_dim(weight, 2, op, "weight");
  TORCH_CHECK(weight.scalar_type() == at::kChar || weight.scalar_type() == at::kByte, op,
              ": weight must be int8 (int8 format) or uint8 (int4, two rows a byte), got ",
              weight.scalar_type());
  TORCH_CHECK(scale.scalar_type() == at::kHalf || scale.scalar_type() == at::kBFloat16, op,
              ": scale must be float16 or bfloat16 (quantized weights serve 16-bit models), got ",
              scale.scalar_type());
  const bool int8 = weight.scalar_type() == at::kChar;
  lin.format = int8 ? layers::WeightFormat::kInt8 : layers::WeightFormat::kInt4;
  lin.in = int8 ? weight.size(0) : 2 * weight.size(0);
  lin.out = weight.size(1);
  TORCH_CHECK(lin.out > 0 && lin.out % 16 == 0, op,
              ": weight.shape[1] (the output width) must be a positive multiple of 16, got ",
              lin.out);
  TORCH_CHECK(lin.in > 0 && lin.in % 8 == 0, op, ": the input width (weight.shape[0]",
              int8 ? "" : " * 2", ") must be a positive multiple of 8, got ", lin.in);
  if (int8) {
    TORCH_CHECK(!zero.has_value(), op, ": int8 weights are symmetric; zero must be None");
    check_dim(scale, 1, op, "scale");
    check_size(scale, 0, lin.out, op, "scale", "weight.shape[1] (one scale per output column)");
  } else {
    TORCH_CHECK(group_size > 0 && group_size % 2 == 0 && lin.in % group_size == 0, op,
                ": group_size must be a positive even number that divides the input width ", lin.in,
                ", got ", group_size);
    lin.group = group_size;
    check_dim(scale, 2, op, "scale");
    check_size(scale, 0, lin.in / group_size, op, "scale", "input width / group_size");
    check_size(scale, 1, lin.out, op, "scale", "weight.shape[1]");
    if (zero.has_value()) {
      TORCH_CHECK(zero->scalar_type() == at::kByte, op, ": zero must be uint8, got ",
                  zero->scalar_type());
      check_dim(*zero, 2, op, "zero");
      check_size(*zero, 0, lin.in / group_size, op, "zero", "scale.shape[0]");
      check_size(*zero, 1, lin.out, op, "zero", "weight.shape[1]");
    }
  }
  return lin;
}

// check_quant_weight's tensors on one CUDA device (after every other check of the op).
void check_quant_devices(const char* op, const at::Tensor& weight, const at::Tensor& scale,
                         const OptTensor& zero) {
  check_cuda(weight, op, "weight");
  check_cuda(scale, op, "scale", weight, "weight");
  if (zero.has_value()) check_cuda(*zero, op, "zero", weight, "weight");
}

}  // namespace

at::Tensor gemm_quant(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& scale,
                      const OptTensor& zero, const OptTensor& bias, int64_t group_size,
                      const std::string& epilogue, const std::string& backend) {
  const char* op = "warpformer.gemm_quant";
  const OpEpilogue* epi = parse_op_epilogue(epilogue, op);
  TORCH_CHECK(backend == "auto" || backend == "gemv" || backend == "dequant", op,
              ": backend must be one of auto, gemv, dequant; got '", backend, "'");
  TORCH_CHECK(epi->bias == bias.has_value(), op, ": epilogue '", epilogue, "' ",
              epi->bias ? "needs a bias" : "takes no bias; use epilogue 'bias' to add it");
  check_dim(input, 2, op, "input");
  layers::Linear lin = check_quant_weight(op, weight, scale, zero, group_size);
  check_dtype(input, scale.scalar_type(), op, "input", "the dtype of scale");
  check_size(input, 1, lin.in, op, "input", "the weight's input width");
  const int64_t m = input.size(0);
  TORCH_CHECK(m > 0, op, ": input has no rows");
  TORCH_CHECK(backend != "gemv" || m <= kernels::kGemvMaxRows, op,
              ": backend 'gemv' needs input.shape[0] <= ", kernels::kGemvMaxRows, ", got ", m);
  if (bias.has_value()) {
    check_dtype(*bias, input.scalar_type(), op, "bias", "the dtype of input");
    check_dim(*bias, 1, op, "bias");
    check_size(*bias, 0, lin.out, op, "bias", "weight.shape[1]");
  }
  check_quant_devices(op, weight, scale, zero);
  check_cuda(input, op, "input", weight, "weight");
  if (bias.has_value()) check_cuda(*bias, op, "bias", weight, "weight");
  const at::Tensor w = aligned_contiguous(weight), sc = aligned_contiguous(scale);
  const OptTensor z = zero.has_value() ? OptTensor(aligned_contiguous(*zero)) : OptTensor();
  const OptTensor b = contiguous(bias);
  const at::Tensor in = aligned_contiguous(input);
  lin.weight = w.data_ptr();
  lin.scales = sc.data_ptr();
  lin.zeros = z.has_value() ? z->data_ptr() : nullptr;
  lin.bias = b.has_value() ? b->data_ptr() : nullptr;
  const c10::cuda::CUDAGuard guard(input.device());
  auto ctx = context_for(in);
  Gemm g(ctx.get());
  if (backend == "dequant") g.set_gemv_policy(Gemm::GemvPolicy::kNever);
  const DType dtype = to_dtype(in.scalar_type(), op, "input");
  at::Tensor out = at::empty({m, lin.out}, in.options());
  at::Tensor scratch;
  if (!layers::linear_gemv(g, dtype, lin, in.data_ptr(), out.data_ptr(), m)) {
    TORCH_CHECK(backend != "gemv", op, ": backend 'gemv' cannot run this product (it needs ",
                "the input width a multiple of 16, for int4 a group_size that is one too, and ",
                "a GPU of compute capability 8.0 or newer)");
    scratch = at::empty({lin.in, lin.out}, in.options());
  }
  layers::linear_forward(g, dtype, lin, in.data_ptr(), out.data_ptr(), m, epi->act, 0.f,
                         scratch.defined() ? scratch.data_ptr() : nullptr);
  return out;
}

at::Tensor dequantize_weight(const at::Tensor& weight, const at::Tensor& scale,
                             const OptTensor& zero, int64_t group_size) {
  const char* op = "warpformer.dequantize_weight";
  layers::Linear lin = check_quant_weight(op, weight, scale, zero, group_size);
  check_quant_devices(op, weight, scale, zero);
  const at::Tensor w = aligned_contiguous(weight), sc = aligned_contiguous(scale);
  const OptTensor z = zero.has_value() ? OptTensor(aligned_contiguous(*zero)) : OptTensor();
  const c10::cuda::CUDAGuard guard(weight.device());
  at::Tensor out = at::empty({lin.in, lin.out}, sc.options());
  WF_DISPATCH_FLOATING(to_dtype(sc.scalar_type(), op, "scale"), op, [&] {
    using T = scalar_t;
    kernels::GemvQuant<T> q;
    q.data = w.data_ptr();
    q.scale = static_cast<const T*>(sc.data_ptr());
    q.zero = z.has_value() ? static_cast<const uint8_t*>(z->data_ptr()) : nullptr;
    q.bits = lin.format == layers::WeightFormat::kInt8 ? 8 : 4;
    q.group = static_cast<int>(lin.group);
    WF_CUDA_CHECK(kernels::launch_dequantize(q, static_cast<int>(lin.in), static_cast<int>(lin.out),
                                             static_cast<T*>(out.data_ptr()), current_stream(w)));
  });
  return out;
}

std::string gemm_fingerprint(int64_t device) {
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  auto ctx = std::make_shared<CudaContext>(static_cast<int>(device),
                                           c10::cuda::getCurrentCUDAStream(device).stream(),
                                           torch_cuda_allocator(), 0);
  return Gemm(ctx.get()).tuning_fingerprint();
}

}  // namespace ops
}  // namespace warpformer
