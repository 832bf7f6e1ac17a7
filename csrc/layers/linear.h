// Products that join two Linears in one GEMV launch at decode sizes, the fusions the decoder block
// is built on. Gemm stays "one product with a plan cache"; what these add is the pairing.
#pragma once

#include <cstdint>

#include "csrc/core/dispatch.h"
#include "csrc/core/gemm.h"
#include "csrc/layers/layer_spec.h"

namespace warpformer {
namespace layers {

// out[m, lin.out] = act(in[m, lin.in] @ W + bias) (+ beta * out) for a Linear of any format.
// Dense: Gemm::run_act. Quantized: the quantized GEMV (kernels::launch_gemv_quant) at up to
// kernels::kGemvMaxRows rows where it runs the shape; otherwise the weight is dequantized into
// `scratch` (lin.in * lin.out elements of dtype, 16-byte aligned; required then) and multiplied
// by the GEMM, which at many rows costs a small part of the product.
void linear_forward(Gemm& gemm, DType dtype, const Linear& lin, const void* in, void* out,
                    int64_t m, kernels::Activation act = kernels::Activation::kIdentity,
                    float beta = 0.f, void* scratch = nullptr);

// Whether linear_forward of a quantized `lin` at m rows runs the GEMV (needs no scratch).
bool linear_gemv(const Gemm& gemm, DType dtype, const Linear& lin, const void* in, const void* out,
                 int64_t m);

// One output of normed_pair: out[m, n] = act(norm(x) @ weight[k, n] + bias[n]).
struct PairedProduct {
  const void* weight = nullptr;  // [k, n]
  const void* bias = nullptr;    // [n] or null
  void* out = nullptr;           // [m, n]
  int64_t n = 0;
  kernels::Activation act = kernels::Activation::kIdentity;
};

// `first` of norm(x) and `second` of norm2(x) (norm2 is `in`'s norm with norm2's gamma / beta;
// null gamma: the same norm) as one GEMV launch (kernels::launch_gemv_normed_pair), where norm
// fusion is on and the GEMV runs both shapes: a parallel-MLP block's QKV and MLP-in products at
// decode sizes. Writes residual_out (and in.out when kept) as Gemm::run_normed does. Returns
// false, launching nothing, otherwise.
bool normed_pair(Gemm& gemm, DType dtype, const GemmNormedInput& in, const PairedProduct& first,
                 const PairedProduct& second, const NormWeights& norm2, int64_t m, int64_t k);

// out[m, n] = in1[m, k1] @ w1[k1, n] + in2[m, k2] @ w2[k2, n]: one GEMV launch over both depths
// where the GEMV runs the shape (kernels::launch_gemv_sum, one fp32 accumulation), otherwise two
// products, the second accumulating into out. Returns whether it was one launch.
// second_ready: the caller promises that the kernel just before this product on the stream does
// not write in2 or w2 (nor does any still running); the one launch then starts on the second
// product beside that kernel (kernels::launch_gemv_sum's second_ready).
bool product_sum(Gemm& gemm, DType dtype, const void* in1, const void* w1, int64_t k1,
                 const void* in2, const void* w2, int64_t k2, void* out, int64_t m, int64_t n,
                 bool second_ready = false);

// Whether product_sum with these arguments would be one launch (launches nothing).
bool joins_sum(const Gemm& gemm, DType dtype, const void* in1, const void* w1, int64_t k1,
               const void* in2, const void* w2, int64_t k2, void* out, int64_t m, int64_t n);

}  // namespace layers
}  // namespace warpformer
