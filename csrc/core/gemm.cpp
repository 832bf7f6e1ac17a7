#include "csrc/core/gemm.h"

#include <c10/util/Exception.h>

#include "csrc/core/check.h"
#include "csrc/core/gemm_params.h"
#include "kernels/gemv.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <sstream>

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

// Entry `index` of a heuristic list (a tuning file's choice), or the first when the list is
// shorter (a file made with another cuBLAS version).
const cublasLtMatmulHeuristicResult_t& tuned_or_first(
    const std::vector<cublasLtMatmulHeuristicResult_t>& results, int index) {
  return results[index < static_cast<int>(results.size()) ? index : 0];
}

}  // namespace

Gemm::Plan::~Plan() {
  if (a) cublasLtMatrixLayoutDestroy(a);
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (c) cublasLtMatrixLayoutDestroy(c);
  if (desc) cublasLtMatmulDescDestroy(desc);
}

Gemm::Gemm(CudaContext* ctx) : ctx_(ctx) {}

Gemm::~Gemm() = default;

size_t Gemm::cached_plans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

namespace {
const char* const kEpilogueNames[kGemmEpilogues] = {"none", "bias", "bias_gelu_tanh", "bias_relu"};
}  // namespace

const char* gemm_epilogue_name(GemmEpilogue e) { return kEpilogueNames[static_cast<int>(e)]; }

bool parse_gemm_epilogue(const std::string& s, GemmEpilogue* out) {
  for (int i = 0; i < kGemmEpilogues; ++i) {
    if (s == kEpilogueNames[i]) {
      *out = static_cast<GemmEpilogue>(i);
      return true;
    }
  }
  return false;
}

std::string gemm_epilogue_names() {
  std::string out;
  for (int i = 0; i < kGemmEpilogues; ++i) {
    if (i > 0) out += ", ";
    out += kEpilogueNames[i];
  }
  return out;
}

std::vector<std::string> Gemm::plan_shapes() const {
  std::vector<std::string> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.reserve(plans_.size());
    for (const auto& entry : plans_) {
      const GemmKey& k = entry.first;
      std::ostringstream os;
      os << dtype_name(k.dtype) << ' ' << k.m << ' ' << k.n << ' ' << k.k << ' ' << k.transposed
         << ' ' << gemm_epilogue_name(k.epilogue) << ' ' << k.accumulate;
      out.push_back(os.str());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Gemm::create_descriptors(const GemmKey& key, Plan* plan) const {
  const cudaDataType_t t = cuda_type(key.dtype);
  // fp32 inputs use true fp32 arithmetic (no TF32) so fp32 runs can be compared tightly with HF.
  WF_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t no_trans = CUBLAS_OP_N;
  const cublasOperation_t trans_a = key.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  WF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                                 sizeof(trans_a)));
  WF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans,
                                                 sizeof(no_trans)));
  const cublasLtEpilogue_t epi = lt_epilogue(key.epilogue);
  WF_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  // Column-major view: A = weight^T [n, k] (ld n), B = in^T [k, m] (ld k), C = out^T [n, m].
  // A transposed weight [n, k] row-major is column-major [k, n] (ld k), used with op T.
  if (key.transposed) {
    WF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, t, key.k, key.n, key.k));
  } else {
    WF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, t, key.n, key.k, key.n));
  }
  WF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, t, key.k, key.m, key.k));
  WF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, t, key.n, key.m, key.n));
}

std::vector<cublasLtMatmulHeuristicResult_t> Gemm::heuristics(const Plan& plan, int count) const {
  cublasLtMatmulPreference_t pref = nullptr;
  WF_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kMaxWorkspaceBytes;
  WF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(count);
  int found = 0;
  ++heuristic_queries_;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(ctx_->blaslt(), plan.desc, plan.a, plan.b, plan.c, plan.c,
                                     pref, count, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  WF_CUBLAS_CHECK(st);
  results.resize(found);
  return results;
}

int64_t Gemm::heuristic_rows(int64_t m) {
  if (m <= kExactRows || m > (int64_t{1} << 40)) return m;
  int64_t pow2 = 1;
  while (pow2 < m) pow2 <<= 1;
  const int64_t step = std::max<int64_t>(16, pow2 / 16);
  return (m + step - 1) / step * step;
}

std::shared_ptr<Gemm::Plan> Gemm::plan_for(const GemmKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(key);
  if (it != plans_.end()) {
    uses_.splice(uses_.begin(), uses_, it->second.use);
    return it->second.plan;
  }

  auto plan = std::make_shared<Plan>();
  create_descriptors(key, plan.get());
  auto tuned = tuned_.find(key);
  bool chosen = false;
  bool from_file = tuned != tuned_.end();
  if (tuned == tuned_.end() && key.m > kExactRows) {
    // The algorithm chosen for the rounded-up row count: the tuning file's, when it has that
    // count (gemm-tune --prompt-rows tunes every rounded count of a range), else the
    // heuristic's first.
    GemmKey rounded = key;
    rounded.m = heuristic_rows(key.m);
    const auto tuned_rounded = tuned_.find(rounded);
    auto found = rounded_algos_.find(rounded);
    if (found == rounded_algos_.end()) {
      const int index = tuned_rounded == tuned_.end() ? 0 : tuned_rounded->second;
      Plan probe;
      std::vector<cublasLtMatmulHeuristicResult_t> results;
      try {  // a failed query of the rounded shape leaves the exact one to plan below
        if (rounded.m != key.m) create_descriptors(rounded, &probe);
        results = heuristics(rounded.m != key.m ? probe : *plan, index + 1);
      } catch (const c10::Error&) {
      }
      if (!results.empty()) {
        if (rounded_algos_.size() >= kMaxPlans) rounded_algos_.clear();
        found = rounded_algos_.emplace(rounded, tuned_or_first(results, index)).first;
      }
    }
    // cuBLASLt checks a borrowed algorithm for the exact shape (and says what workspace it
    // needs there); a shape it refuses is planned exactly below.
    if (found != rounded_algos_.end()) {
      // Unrounded (m is a step): the heuristic's own answer for this shape.
      cublasLtMatmulHeuristicResult_t fit = found->second;
      const bool ok =
          rounded.m == key.m ||
          cublasLtMatmulAlgoCheck(ctx_->blaslt(), plan->desc, plan->a, plan->b, plan->c, plan->c,
                                  &found->second.algo, &fit) == CUBLAS_STATUS_SUCCESS;
      if (ok && fit.workspaceSize <= kMaxWorkspaceBytes) {
        plan->algo = found->second.algo;
        plan->workspace = fit.workspaceSize;
        chosen = true;
        from_file = tuned_rounded != tuned_.end();
      }
    }
  }
  if (!chosen) {
    const int index = tuned == tuned_.end() ? 0 : tuned->second;
    const auto results = heuristics(*plan, index + 1);
    TORCH_CHECK(!results.empty(), "cuBLASLt found no algorithm for GEMM m=", key.m, " n=", key.n,
                " k=", key.k, " dtype=", dtype_name(key.dtype));
    const auto& pick = tuned_or_first(results, index);
    plan->algo = pick.algo;
    plan->workspace = pick.workspaceSize;
  }
  if (plans_.size() >= kMaxPlans) {  // drop the least recently used shape
    plans_.erase(uses_.back());
    uses_.pop_back();
  }
  uses_.push_front(key);
  plans_.emplace(key, CachedPlan{plan, uses_.begin()});
  if (from_file) ++tuned_plans_;
  return plan;
}

namespace {

// The CUDA objects of one Gemm::benchmark call, released however it ends.
struct BenchObjects {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  void drop_graph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
    exec = nullptr;
    graph = nullptr;
  }
  BenchObjects() = default;
  BenchObjects(const BenchObjects&) = delete;
  BenchObjects& operator=(const BenchObjects&) = delete;
  // Waits for the stream first: a path that returns or throws between launches (a candidate
  // that fails its capture, a failed check) would otherwise leave kernels running on buffers
  // the caller frees once benchmark returns.
  ~BenchObjects() {
    if (stream != nullptr) (void)cudaStreamSynchronize(stream);
    drop_graph();
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

}  // namespace

// Each candidate's `reps` launches are captured back to back in one CUDA graph and the replay is
// timed (median of three replays, divided by reps): the kernels' own time, with the weight as cold
// as the caller's copies make it. Timing launch by launch between events also counted the host's
// per-launch work, which swamped a prompt pass's shorter products (benchmarks/HISTORY.md, "Batch-64
// prefill: where the other 45% goes", and "Figures moved from code comments (issue 50)"). The
// capture runs on a stream of its own, ordered after the context's stream, since that may be the
// legacy default stream, which cannot be captured.
std::vector<float> Gemm::benchmark(const GemmKey& key, const void* in,
                                   const std::vector<const void*>& weights, const void* bias,
                                   void* out, int max_algos, int reps) {
  TORCH_CHECK(!weights.empty(), "Gemm::benchmark: weights must hold at least one copy");
  Plan plan;
  create_descriptors(key, &plan);
  if (key.epilogue != GemmEpilogue::kNone) {
    WF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof(bias)));
  }
  const auto results = heuristics(plan, max_algos);
  size_t need = 0;
  for (const auto& r : results) need = std::max(need, r.workspaceSize);
  reserve_workspace(need, key);
  const float alpha = 1.f, beta = key.accumulate ? 1.f : 0.f;
  BenchObjects o;
  WF_CUDA_CHECK(cudaStreamCreateWithFlags(&o.stream, cudaStreamNonBlocking));
  WF_CUDA_CHECK(cudaEventCreate(&o.start));
  WF_CUDA_CHECK(cudaEventCreate(&o.stop));
  WF_CUDA_CHECK(cudaEventRecord(o.start, ctx_->stream()));  // the operands were written there
  WF_CUDA_CHECK(cudaStreamWaitEvent(o.stream, o.start, 0));
  std::vector<float> times;
  for (const auto& r : results) {
    auto launch_once = [&](int i) {
      const void* weight = weights[static_cast<size_t>(i) % weights.size()];
      return cublasLtMatmul(ctx_->blaslt(), plan.desc, &alpha, weight, plan.a, in, plan.b, &beta,
                            out, plan.c, out, plan.c, &r.algo, ctx_->workspace(),
                            ctx_->workspace_size(), o.stream);
    };
    if (launch_once(0) != CUBLAS_STATUS_SUCCESS) {
      (void)cudaGetLastError();  // leave no launch error for the next launcher to report
      times.push_back(-1.f);
      continue;
    }
    WF_CUBLAS_CHECK(launch_once(0));  // warm-up
    WF_CUDA_CHECK(cudaStreamBeginCapture(o.stream, cudaStreamCaptureModeThreadLocal));
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < reps && st == CUBLAS_STATUS_SUCCESS; ++i) st = launch_once(i);
    const cudaError_t end = cudaStreamEndCapture(o.stream, &o.graph);
    if (st != CUBLAS_STATUS_SUCCESS || end != cudaSuccess || o.graph == nullptr ||
        cudaGraphInstantiate(&o.exec, o.graph, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      o.drop_graph();
      times.push_back(-1.f);
      continue;
    }
    WF_CUDA_CHECK(cudaGraphLaunch(o.exec, o.stream));  // uploads the graph
    float t[3];
    for (float& ms : t) {
      WF_CUDA_CHECK(cudaEventRecord(o.start, o.stream));
      WF_CUDA_CHECK(cudaGraphLaunch(o.exec, o.stream));
      WF_CUDA_CHECK(cudaEventRecord(o.stop, o.stream));
      WF_CUDA_CHECK(cudaEventSynchronize(o.stop));
      WF_CUDA_CHECK(cudaEventElapsedTime(&ms, o.start, o.stop));
    }
    std::sort(t, t + 3);
    times.push_back(t[1] * 1000.f / static_cast<float>(reps));
    o.drop_graph();
  }
  return times;
}

std::string Gemm::tuning_fingerprint() const {
  std::ostringstream os;
  os << "gpu=" << ctx_->props().name << ";cublaslt=" << cublasLtGetVersion();
  std::string s = os.str();
  for (char& c : s) {
    if (c == ' ') c = '_';
  }
  return s;
}

bool Gemm::load_tuning(const std::string& path, std::string* note) {
  auto fail = [&](const std::string& why) {
    *note = "GEMM tuning file '" + path + "' " + why + "; using cuBLASLt heuristics";
    return false;
  };
  std::ifstream f(path);
  if (!f) return fail("not found");
  std::string line, fingerprint;
  std::unordered_map<GemmKey, int, GemmKeyHash> table;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.rfind("# fingerprint ", 0) == 0) fingerprint = line.substr(14);
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    std::string dtype, epi;
    GemmKey k{};
    int transposed = 0, accumulate = 0, index = 0;
    if (!(is >> dtype >> k.m >> k.n >> k.k >> transposed >> epi >> accumulate >> index)) {
      return fail("line " + std::to_string(lineno) + " is malformed");
    }
    if (index < 0 || index > 1023) {
      return fail("line " + std::to_string(lineno) + " has algorithm index " +
                  std::to_string(index) + " (must be in [0, 1024))");
    }
    k.dtype = parse_dtype(dtype, "GEMM tuning file: dtype");
    k.transposed = transposed != 0;
    k.accumulate = accumulate != 0;
    if (!parse_gemm_epilogue(epi, &k.epilogue)) {
      return fail("line " + std::to_string(lineno) + " has unknown epilogue '" + epi +
                  "' (must be one of " + gemm_epilogue_names() + ")");
    }
    table[k] = index;
  }
  if (fingerprint != tuning_fingerprint()) {
    return fail("was made for " +
                (fingerprint.empty() ? std::string("an unknown GPU") : fingerprint) + ", this is " +
                tuning_fingerprint());
  }
  std::lock_guard<std::mutex> lock(mu_);
  tuned_ = std::move(table);
  plans_.clear();  // re-plan with the tuned choices (plans are rebuilt on next use)
  uses_.clear();
  rounded_algos_.clear();
  tuned_plans_ = 0;
  *note = "GEMM tuning file '" + path + "': " + std::to_string(tuned_.size()) + " shapes";
  return true;
}

namespace {

kernels::Activation epilogue_activation(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kBiasGeluTanh: return kernels::Activation::kGeluTanh;
    case GemmEpilogue::kBiasRelu: return kernels::Activation::kRelu;
    default: return kernels::Activation::kIdentity;
  }
}

}  // namespace

int Gemm::gemv_max_rows(bool transposed) const {
  switch (gemv_policy_) {
    case GemvPolicy::kNever: return 0;
    case GemvPolicy::kAlways: return kernels::kGemvMaxRows;
    default: return transposed ? kernels::kGemvPreferredRowsNK : kernels::kGemvPreferredRowsKN;
  }
}

bool Gemm::try_gemv(DType dtype, const void* in, const void* weight, const void* bias, void* out,
                    int64_t m, int64_t n, int64_t k, bool transposed, kernels::Activation act,
                    float beta, const GemmNormedInput* norm, bool launch, bool beside) {
  // Past the preferred rows, [k, n] products of up to kGemvMaxRows rows still take the GEMV
  // where it runs them on tensor cores (kernels::gemv_kn_tensor_cores).
  const bool within = m <= gemv_max_rows(transposed);
  const bool tensor_cores = !within && !transposed && gemv_policy_ == GemvPolicy::kPreferred &&
                            m <= kernels::kGemvMaxRows;
  if ((!within && !tensor_cores) || n > INT_MAX || k > INT_MAX) return false;
  return WF_DISPATCH_FLOATING(dtype, "Gemm (GEMV path)", [&] {
    kernels::GemvParams<scalar_t> p =
        gemv_params<scalar_t>(in, weight, bias, out, m, n, k, static_weights_);
    p.transposed = transposed;
    p.act = act;
    p.beta = beta;
    p.beside = beside;
    if (tensor_cores && !kernels::gemv_kn_tensor_cores(p, ctx_->device())) return false;
    if (norm != nullptr && tensor_cores && m > kTensorCoreNormRows) return false;
    if (norm != nullptr) {
      kernels::NormParams<scalar_t> np = norm_params<scalar_t>(*norm, m, k);
      if (!norm->keep_out) np.out = nullptr;
      if (!kernels::gemv_normed_supported(p, np, ctx_->device())) return false;
      if (launch) {
        WF_CUDA_CHECK(kernels::launch_gemv_normed(p, np, ctx_->device(), ctx_->stream()));
      }
      return true;
    }
    if (!kernels::gemv_supported(p)) return false;
    if (launch) WF_CUDA_CHECK(kernels::launch_gemv(p, ctx_->device(), ctx_->stream()));
    return true;
  });
}

void Gemm::run(DType dtype, const void* in, const void* weight, const void* bias, void* out,
               int64_t m, int64_t n, int64_t k, GemmEpilogue epilogue, float beta) {
  TORCH_CHECK(m >= 0 && n > 0 && k > 0, "Gemm: bad sizes m=", m, " n=", n, " k=", k);
  if (m == 0) return;
  TORCH_CHECK(epilogue == GemmEpilogue::kNone || bias != nullptr,
              "Gemm: the bias epilogue needs a bias pointer");
  if (try_gemv(dtype, in, weight, bias, out, m, n, k, false, epilogue_activation(epilogue), beta)) {
    return;
  }
  launch(GemmKey{m, n, k, dtype, epilogue, beta != 0.f, false}, in, weight, bias, out, beta);
}

void Gemm::run_act(DType dtype, const void* in, const void* weight, const void* bias, void* out,
                   int64_t m, int64_t n, int64_t k, kernels::Activation act, float beta,
                   bool beside) {
  TORCH_CHECK(m >= 0 && n > 0 && k > 0, "Gemm: bad sizes m=", m, " n=", n, " k=", k);
  if (m == 0) return;
  if (try_gemv(dtype, in, weight, bias, out, m, n, k, false, act, beta, nullptr, true, beside)) {
    return;
  }
  if (act == kernels::Activation::kRelu && bias != nullptr && beta == 0.f) {
    launch(GemmKey{m, n, k, dtype, GemmEpilogue::kBiasRelu, false, false}, in, weight, bias, out,
           0.f);
    return;
  }
  if (act == kernels::Activation::kGeluTanh && bias != nullptr && beta == 0.f &&
      dtype != DType::kFloat32) {
    launch(GemmKey{m, n, k, dtype, GemmEpilogue::kBiasGeluTanh, false, false}, in, weight, bias,
           out, 0.f);
    return;
  }
  if (act == kernels::Activation::kIdentity) {
    const GemmEpilogue epi = bias != nullptr ? GemmEpilogue::kBias : GemmEpilogue::kNone;
    launch(GemmKey{m, n, k, dtype, epi, beta != 0.f, false}, in, weight, bias, out, beta);
    return;
  }
  TORCH_CHECK(beta == 0.f, "Gemm::run_act: an activation with beta != 0 needs the GEMV path");
  launch(GemmKey{m, n, k, dtype, GemmEpilogue::kNone, false, false}, in, weight, nullptr, out, 0.f);
  WF_DISPATCH_FLOATING(dtype, "Gemm::run_act", [&] {
    WF_CUDA_CHECK(kernels::launch_bias_act(
        static_cast<scalar_t*>(out), static_cast<const scalar_t*>(out),
        static_cast<const scalar_t*>(bias), m, static_cast<int>(n), act, ctx_->stream()));
  });
}

void Gemm::run_normed(DType dtype, const GemmNormedInput& in, const void* weight, const void* bias,
                      void* out, int64_t m, int64_t n, int64_t k, kernels::Activation act,
                      bool beside) {
  TORCH_CHECK(m >= 0 && n > 0 && k > 0, "Gemm: bad sizes m=", m, " n=", n, " k=", k);
  TORCH_CHECK(in.kind != kernels::NormKind::kAddOnly && in.input != nullptr &&
                  in.gamma != nullptr && in.out != nullptr,
              "Gemm::run_normed: needs a LayerNorm or RMSNorm with input, gamma and out");
  if (m == 0) return;
  if (norm_fusion_ &&
      try_gemv(dtype, nullptr, weight, bias, out, m, n, k, false, act, 0.f, &in, true, beside)) {
    return;
  }
  WF_DISPATCH_FLOATING(dtype, "Gemm::run_normed", [&] {
    WF_CUDA_CHECK(kernels::launch_norm(norm_params<scalar_t>(in, m, k), ctx_->stream()));
  });
  run_act(dtype, in.out, weight, bias, out, m, n, k, act);
}

bool Gemm::fuses_norm(DType dtype, const GemmNormedInput& in, const void* weight, const void* bias,
                      void* out, int64_t m, int64_t n, int64_t k, kernels::Activation act) {
  return norm_fusion_ && m > 0 &&
         try_gemv(dtype, nullptr, weight, bias, out, m, n, k, false, act, 0.f, &in, false);
}

void Gemm::run_transposed(DType dtype, const void* in, const void* weight, const void* bias,
                          void* out, int64_t m, int64_t n, int64_t k) {
  TORCH_CHECK(m >= 0 && n > 0 && k > 0, "Gemm: bad sizes m=", m, " n=", n, " k=", k);
  if (m == 0) return;
  if (try_gemv(dtype, in, weight, bias, out, m, n, k, true, kernels::Activation::kIdentity, 0.f)) {
    return;
  }
  const GemmEpilogue epi = bias != nullptr ? GemmEpilogue::kBias : GemmEpilogue::kNone;
  launch(GemmKey{m, n, k, dtype, epi, false, true}, in, weight, bias, out, 0.f);
}

void Gemm::launch(const GemmKey& key, const void* in, const void* weight, const void* bias,
                  void* out, float beta) {
  const std::shared_ptr<Plan> held = plan_for(key);
  Plan& plan = *held;
  if (plan.workspace > ctx_->workspace_size()) reserve_workspace(plan.workspace, key);
  if (key.epilogue != GemmEpilogue::kNone) {
    WF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof(bias)));
  }
  const float alpha = 1.f;
  WF_CUBLAS_CHECK(cublasLtMatmul(ctx_->blaslt(), plan.desc, &alpha, weight, plan.a, in, plan.b,
                                 &beta, out, plan.c, out, plan.c, &plan.algo, ctx_->workspace(),
                                 ctx_->workspace_size(), ctx_->stream()));
}

void Gemm::reserve_workspace(size_t bytes, const GemmKey& key) {
  if (bytes <= ctx_->workspace_size()) return;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  WF_CUDA_CHECK(cudaStreamIsCapturing(ctx_->stream(), &capturing));
  // The engine plans every product on an eager launch before it captures one; a plan made
  // during a capture (a shape first seen there) cannot allocate.
  TORCH_CHECK(capturing == cudaStreamCaptureStatusNone,
              "Gemm: the cuBLASLt algorithm for m=", key.m, " n=", key.n, " k=", key.k, " needs a ",
              bytes, "-byte workspace (have ", ctx_->workspace_size(),
              "), which cannot grow while a CUDA graph is captured");
  ctx_->reserve_workspace(bytes);
}

}  // namespace warpformer
