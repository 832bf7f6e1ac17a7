#include "csrc/core/gemm.h"

#include <c10/util/Exception.h>

#include "csrc/core/check.h"

namespace warpformer {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
  }
  TORCH_INTERNAL_ASSERT(false, "bad DType");
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kBiasGeluTanh: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case GemmEpilogue::kBiasRelu: return CUBLASLT_EPILOGUE_RELU_BIAS;
  }
  TORCH_INTERNAL_ASSERT(false, "bad GemmEpilogue");
}

}  // namespace

Gemm::~Gemm() {
  for (auto& kv : plans_) {
    Plan& p = *kv.second;
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  }
}

size_t Gemm::cached_plans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

Gemm::Plan& Gemm::plan_for(const GemmKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;

  auto plan = std::make_unique<Plan>();
  const cudaDataType_t t = cuda_type(key.dtype);
  // fp32 inputs use true fp32 arithmetic (no TF32) so fp32 runs can be compared tightly with HF.
  WF_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t no_trans = CUBLAS_OP_N;
  const cublasOperation_t trans_a = key.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  WF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                 &trans_a, sizeof(trans_a)));
  WF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                 &no_trans, sizeof(no_trans)));
  const cublasLtEpilogue_t epi = lt_epilogue(key.epilogue);
  WF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                 sizeof(epi)));
  // Column-major view: A = weight^T [n, k] (ld n), B = in^T [k, m] (ld k), C = out^T [n, m].
  // A transposed weight [n, k] row-major is column-major [k, n] (ld k), used with op T.
  if (key.transposed) {
    WF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, t, key.k, key.n, key.k));
  } else {
    WF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, t, key.n, key.k, key.n));
  }
  WF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, t, key.k, key.m, key.k));
  WF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, t, key.n, key.m, key.n));

  cublasLtMatmulPreference_t pref = nullptr;
  WF_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = ctx_->workspace_size();
  WF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      ctx_->blaslt(), plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  WF_CUBLAS_CHECK(st);
  TORCH_CHECK(found > 0, "cuBLASLt found no algorithm for GEMM m=", key.m, " n=", key.n,
              " k=", key.k, " dtype=", dtype_name(key.dtype));
  plan->algo = result.algo;
  auto& ref = *plan;
  plans_.emplace(key, std::move(plan));
  return ref;
}

void Gemm::run(DType dtype, const void* in, const void* weight, const void* bias, void* out,
               int64_t m, int64_t n, int64_t k, GemmEpilogue epilogue, float beta) {
  TORCH_CHECK(m >= 0 && n > 0 && k > 0, "Gemm: bad sizes m=", m, " n=", n, " k=", k);
  if (m == 0) return;
  TORCH_CHECK(epilogue == GemmEpilogue::kNone || bias != nullptr,
              "Gemm: the bias epilogue needs a bias pointer");
  launch(GemmKey{m, n, k, dtype, epilogue, beta != 0.f, false}, in, weight, bias, out, beta);
}

void Gemm::run_transposed(DType dtype, const void* in, const void* weight, const void* bias,
                          void* out, int64_t m, int64_t n, int64_t k) {
  TORCH_CHECK(m >= 0 && n > 0 && k > 0, "Gemm: bad sizes m=", m, " n=", n, " k=", k);
  if (m == 0) return;
  const GemmEpilogue epi = bias != nullptr ? GemmEpilogue::kBias : GemmEpilogue::kNone;
  launch(GemmKey{m, n, k, dtype, epi, false, true}, in, weight, bias, out, 0.f);
}

void Gemm::launch(const GemmKey& key, const void* in, const void* weight, const void* bias,
                  void* out, float beta) {
  Plan& plan = plan_for(key);
  if (key.epilogue != GemmEpilogue::kNone) {
    WF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof(bias)));
  }
  const float alpha = 1.f;
  WF_CUBLAS_CHECK(cublasLtMatmul(ctx_->blaslt(), plan.desc, &alpha, weight, plan.a, in, plan.b,
                                 &beta, out, plan.c, out, plan.c, &plan.algo, ctx_->workspace(),
                                 ctx_->workspace_size(), ctx_->stream()));
}

}  // namespace warpformer
