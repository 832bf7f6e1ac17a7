// Torch ops over the cuBLASLt Gemm of csrc/core: a plain matmul in the engine's weight layout (for
// tests) and the per-shape algorithm timing that `warpformer gemm-tune` uses.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>
#include <vector>

#include "csrc/core/gemm.h"
#include "kernels/gemv.h"
#include "csrc/torch/ops.h"
#include "csrc/torch/tensor_utils.h"

namespace warpformer {
namespace ops {
namespace {

GemmEpilogue parse_epilogue(const std::string& s, const char* op) {
  if (s == "none") return GemmEpilogue::kNone;
  if (s == "bias") return GemmEpilogue::kBias;
  if (s == "bias_gelu_tanh") return GemmEpilogue::kBiasGeluTanh;
  if (s == "bias_relu") return GemmEpilogue::kBiasRelu;
  TORCH_CHECK(false, op, ": epilogue must be one of none, bias, bias_gelu_tanh, bias_relu; got '",
              s, "'");
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
  a.in = input.contiguous();
  a.w = weight.contiguous();
  if (bias.has_value()) a.bias = bias->contiguous();
  return a;
}

std::shared_ptr<CudaContext> context_for(const at::Tensor& t) {
  return std::make_shared<CudaContext>(t.device().index(), current_stream(t),
                                       torch_cuda_allocator());
}

}  // namespace

at::Tensor gemm(const at::Tensor& input, const at::Tensor& weight, const OptTensor& bias,
                bool transposed, const std::string& epilogue, const std::string& backend,
                const OptTensor& residual) {
  const char* op = "warpformer.gemm";
  // Every epilogue runs through Gemm::run_act like the engine's MLP: the activation after the
  // bias. (The tuner's gemm_benchmark keeps cuBLASLt's own epilogue set.)
  struct OpEpilogue {
    const char* name;
    kernels::Activation act;
    bool bias;
  };
  using A = kernels::Activation;
  static constexpr OpEpilogue kEpilogues[] = {
      {"none", A::kIdentity, false},       {"bias", A::kIdentity, true},
      {"bias_gelu_tanh", A::kGeluTanh, true}, {"bias_gelu_erf", A::kGeluErf, true},
      {"bias_relu", A::kRelu, true},       {"bias_silu", A::kSilu, true}};
  const OpEpilogue* epi = nullptr;
  for (const OpEpilogue& e : kEpilogues) {
    if (epilogue == e.name) epi = &e;
  }
  TORCH_CHECK(epi != nullptr, op,
              ": epilogue must be one of none, bias, bias_gelu_tanh, bias_gelu_erf, bias_relu, "
              "bias_silu; got '", epilogue, "'");
  const kernels::Activation act = epi->act;
  const std::string lt_epilogue = epi->bias ? "bias" : "none";
  TORCH_CHECK(backend == "auto" || backend == "gemv" || backend == "gemv_static" ||
                  backend == "cublaslt",
              op, ": backend must be one of auto, gemv, gemv_static, cublaslt; got '", backend,
              "'");
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
    TORCH_CHECK(residual->dim() == 2 && residual->size(0) == a.key.m &&
                    residual->size(1) == a.key.n,
                op, ": residual must have shape [", a.key.m, ", ", a.key.n, "], got ",
                residual->sizes());
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
    g.run_act(a.key.dtype, a.in.data_ptr(), a.w.data_ptr(), bp, out.data_ptr(), a.key.m,
              a.key.n, a.key.k, act, beta);
  }
  return out;
}

at::Tensor gemm_benchmark(const at::Tensor& input, const at::Tensor& weight, const OptTensor& bias,
                          bool transposed, const std::string& epilogue, bool accumulate,
                          int64_t max_algos, int64_t reps) {
  const char* op = "warpformer.gemm_benchmark";
  TORCH_CHECK(max_algos >= 1 && max_algos <= 64, op, ": max_algos must be in [1, 64], got ",
              max_algos);
  TORCH_CHECK(reps >= 1 && reps <= 1000, op, ": reps must be in [1, 1000], got ", reps);
  GemmArgs a = check_gemm(op, input, weight, bias, transposed, epilogue, accumulate);
  const c10::cuda::CUDAGuard guard(input.device());
  auto ctx = context_for(a.in);
  Gemm g(ctx.get());
  at::Tensor out = at::randn({a.key.m, a.key.n}, a.in.options());
  const std::vector<float> t =
      g.benchmark(a.key, a.in.data_ptr(), a.w.data_ptr(),
                  a.bias.defined() ? a.bias.data_ptr() : nullptr, out.data_ptr(),
                  static_cast<int>(max_algos), static_cast<int>(reps));
  at::Tensor res = at::empty({static_cast<int64_t>(t.size())}, at::TensorOptions().dtype(at::kFloat));
  std::copy(t.begin(), t.end(), res.data_ptr<float>());
  return res;
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
