#include "csrc/layers/linear.h"

#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <utility>

#include "csrc/core/check.h"
#include "csrc/core/gemm_params.h"
#include "kernels/gemv.h"

namespace warpformer {
namespace layers {
namespace {

// The joined launch of product_sum when m and the shape allow it; false means "two products".
// With launch false it only answers. Sizes must be positive.
bool try_gemv_sum(const Gemm& gemm, DType dtype, const void* in1, const void* w1, int64_t k1,
                  const void* in2, const void* w2, int64_t k2, void* out, int64_t m, int64_t n,
                  bool launch, bool second_ready) {
  if (m > gemm.gemv_max_rows(false) || n > INT_MAX || k1 > INT_MAX || k2 > INT_MAX) return false;
  const CudaContext& ctx = gemm.context();
  return WF_DISPATCH_FLOATING(dtype, "product_sum", [&] {
    using T = scalar_t;
    const kernels::GemvParams<T> p =
        gemv_params<T>(in1, w1, nullptr, out, m, n, k1, gemm.static_weights());
    const T* x2 = static_cast<const T*>(in2);
    const T* v2 = static_cast<const T*>(w2);
    if (!kernels::gemv_sum_supported(p, x2, v2, static_cast<int>(k2))) return false;
    if (launch) {
      WF_CUDA_CHECK(kernels::launch_gemv_sum(p, x2, v2, static_cast<int>(k2), ctx.device(),
                                             ctx.stream(), second_ready));
    }
    return true;
  });
}

// The quantized GEMV's parameters for lin (quantized) at m rows.
template <typename T>
std::pair<kernels::GemvParams<T>, kernels::GemvQuant<T>> quant_params(
    const Gemm& gemm, const Linear& lin, const void* in, const void* out, int64_t m,
    kernels::Activation act, float beta) {
  kernels::GemvParams<T> p = gemv_params<T>(in, nullptr, lin.bias, const_cast<void*>(out), m,
                                            lin.out, lin.in, gemm.static_weights());
  p.act = act;
  p.beta = beta;
  kernels::GemvQuant<T> q;
  q.data = lin.weight;
  q.scale = static_cast<const T*>(lin.scales);
  q.zero = static_cast<const uint8_t*>(lin.zeros);
  q.bits = lin.format == WeightFormat::kInt8 ? 8 : 4;
  q.group = static_cast<int>(lin.group);
  return {p, q};
}

bool quant_gemv_runs(const Gemm& gemm, DType dtype, const Linear& lin, const void* in,
                     const void* out, int64_t m, bool launch, kernels::Activation act, float beta) {
  // Past a few rows the dense GEMV gives way to the GEMM; the quantized one does not: a
  // dequantized weight costs more traffic than the whole product at up to kGemvMaxRows rows.
  // (GemvPolicy::kNever still means "never the GEMV": the gemm ops' cuBLASLt backend.)
  const int64_t max_rows = gemm.gemv_max_rows(false) == 0 ? 0 : kernels::kGemvMaxRows;
  if (m < 1 || m > max_rows || lin.in > INT_MAX || lin.out > INT_MAX) return false;
  const CudaContext& ctx = gemm.context();
  return WF_DISPATCH_FLOATING(dtype, "linear_forward", [&] {
    using T = scalar_t;
    const auto [p, q] = quant_params<T>(gemm, lin, in, out, m, act, beta);
    if (!kernels::gemv_quant_supported(p, q)) return false;
    if (launch) WF_CUDA_CHECK(kernels::launch_gemv_quant(p, q, ctx.device(), ctx.stream()));
    return true;
  });
}

}  // namespace

void linear_forward(Gemm& gemm, DType dtype, const Linear& lin, const void* in, void* out,
                    int64_t m, kernels::Activation act, float beta, void* scratch) {
  TORCH_CHECK(m >= 0 && lin.in > 0 && lin.out > 0, "linear_forward: bad sizes m=", m,
              " in=", lin.in, " out=", lin.out);
  if (m == 0) return;
  if (!lin.quantized()) {
    gemm.run_act(dtype, in, lin.weight, lin.bias, out, m, lin.out, lin.in, act, beta);
    return;
  }
  if (quant_gemv_runs(gemm, dtype, lin, in, out, m, true, act, beta)) return;
  TORCH_CHECK(scratch != nullptr, "linear_forward: a quantized product of ", m,
              " rows needs scratch for the dequantized weight");
  const CudaContext& ctx = gemm.context();
  WF_DISPATCH_FLOATING(dtype, "linear_forward", [&] {
    using T = scalar_t;
    const auto [p, q] = quant_params<T>(gemm, lin, in, out, m, act, beta);
    (void)p;
    WF_CUDA_CHECK(kernels::launch_dequantize(q, static_cast<int>(lin.in), static_cast<int>(lin.out),
                                             static_cast<T*>(scratch), ctx.stream()));
  });
  // The scratch is written by the kernel just before the product: a GEMV there must not read
  // its weight ahead of that kernel, as it does with static weights (restored however run_act
  // ends).
  struct DynamicWeights {
    Gemm& gemm;
    bool was;
    ~DynamicWeights() { gemm.set_static_weights(was); }
  } scope{gemm, gemm.static_weights()};
  gemm.set_static_weights(false);
  gemm.run_act(dtype, in, scratch, lin.bias, out, m, lin.out, lin.in, act, beta);
}

bool linear_gemv(const Gemm& gemm, DType dtype, const Linear& lin, const void* in, const void* out,
                 int64_t m) {
  return lin.quantized() &&
         quant_gemv_runs(gemm, dtype, lin, in, out, m, false, kernels::Activation::kIdentity, 0.f);
}

bool product_sum(Gemm& gemm, DType dtype, const void* in1, const void* w1, int64_t k1,
                 const void* in2, const void* w2, int64_t k2, void* out, int64_t m, int64_t n,
                 bool second_ready) {
  TORCH_CHECK(m >= 0 && n > 0 && k1 > 0 && k2 > 0, "product_sum: bad sizes m=", m, " n=", n,
              " k1=", k1, " k2=", k2);
  if (m == 0) return false;
  if (try_gemv_sum(gemm, dtype, in1, w1, k1, in2, w2, k2, out, m, n, true, second_ready)) {
    return true;
  }
  gemm.run(dtype, in1, w1, nullptr, out, m, n, k1);
  gemm.run(dtype, in2, w2, nullptr, out, m, n, k2, GemmEpilogue::kNone, 1.f);
  return false;
}

bool joins_sum(const Gemm& gemm, DType dtype, const void* in1, const void* w1, int64_t k1,
               const void* in2, const void* w2, int64_t k2, void* out, int64_t m, int64_t n) {
  return m > 0 && n > 0 && k1 > 0 && k2 > 0 &&
         try_gemv_sum(gemm, dtype, in1, w1, k1, in2, w2, k2, out, m, n, false, false);
}

bool normed_pair(Gemm& gemm, DType dtype, const GemmNormedInput& in, const PairedProduct& first,
                 const PairedProduct& second, const NormWeights& norm2, int64_t m, int64_t k) {
  TORCH_CHECK(m >= 0 && k > 0 && first.n > 0 && second.n > 0, "normed_pair: bad sizes m=", m,
              " k=", k, " n=", first.n, " n2=", second.n);
  TORCH_CHECK(in.kind != kernels::NormKind::kAddOnly && in.input != nullptr && in.gamma != nullptr,
              "normed_pair: needs a LayerNorm or RMSNorm with input and gamma");
  if (m == 0 || !gemm.norm_fusion() || m > gemm.gemv_max_rows(false) || k > INT_MAX ||
      first.n > INT_MAX || second.n > INT_MAX) {
    return false;
  }
  const CudaContext& ctx = gemm.context();
  return WF_DISPATCH_FLOATING(dtype, "normed_pair", [&] {
    using T = scalar_t;
    kernels::GemvParams<T> p = gemv_params<T>(nullptr, first.weight, first.bias, first.out, m,
                                              first.n, k, gemm.static_weights());
    p.act = first.act;
    kernels::NormParams<T> np = norm_params<T>(in, m, k);
    if (!in.keep_out) np.out = nullptr;
    kernels::GemvSecond<T> s2{};
    s2.out = static_cast<T*>(second.out);
    s2.weight = static_cast<const T*>(second.weight);
    s2.bias = static_cast<const T*>(second.bias);
    s2.gamma = static_cast<const T*>(norm2.gamma);
    s2.beta = static_cast<const T*>(norm2.beta);
    s2.n = static_cast<int>(second.n);
    s2.act = second.act;
    if (!kernels::gemv_normed_pair_supported(p, np, s2, ctx.device())) return false;
    WF_CUDA_CHECK(kernels::launch_gemv_normed_pair(p, np, s2, ctx.device(), ctx.stream()));
    return true;
  });
}

}  // namespace layers
}  // namespace warpformer
