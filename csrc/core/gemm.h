// Gemm: row-major matrix products with fp32 accumulation.
//
//   out[m, n] = in[m, k] @ weight[k, n] (+ bias[n]) (+ beta * out)
//
// Decode-sized products run on warpformer's weight-streaming GEMV (kernels/gemv.h), which reads
// each weight byte once in a single kernel, where it measured faster than cuBLASLt: up to
// kernels::kGemvPreferredRowsKN rows for [k, n] weights, and up to kGemvMaxRows where the GEMV
// runs them on tensor cores (kernels::gemv_kn_tensor_cores: 16-bit weights of at most 16 MiB),
// kGemvPreferredRowsNK for the [n, k] lm_head (and when the shape allows 16-byte access);
// everything else goes to cuBLASLt (set_gemv_policy changes that for the gemm ops' backends).
//
// Weights are stored [in, out] (the on-disk layout), so no transposes are needed: in cuBLASLt's
// column-major view this is out^T[n, m] = weight^T[n, k] @ in^T[k, m]. Matmul descriptors and the
// chosen algorithm are cached per (m, n, k, dtype, epilogue, beta != 0), so a steady-state call
// only launches (which also makes it capturable in a CUDA graph). Algorithms are chosen among
// those that need at most kMaxWorkspaceBytes of workspace (cuBLASLt's recommendation on Hopper),
// and the context's workspace grows to what the chosen ones need (CudaContext::
// reserve_workspace) on their first eager launch. The cache keeps the
// kMaxPlans most recently used shapes: a long-running server meets a new m with every prompt
// length, and a dropped shape only costs a re-plan when it comes back. A new m above kExactRows
// does not pay a heuristic query (costly host time: benchmarks/HISTORY.md, "Figures moved from
// ARCHITECTURE.md (issue 50)") either: it borrows the algorithm the heuristic chose for m rounded
// up to a step of 6-12% of m (heuristic_rows), once cuBLASLt has checked it for the exact shape
// (cublasLtMatmulAlgoCheck); a shape it refuses, or one in a tuning file, is planned exactly. A
// tuning file's entry for the rounded count itself (gemm-tune --prompt-rows) replaces the
// heuristic's choice there, for every m it rounds from.
#pragma once

#include <cublasLt.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "csrc/core/cuda_context.h"
#include "csrc/core/dispatch.h"
#include "kernels/activations.h"
#include "kernels/norms.h"

namespace warpformer {

enum class GemmEpilogue { kNone = 0, kBias = 1, kBiasGeluTanh = 2, kBiasRelu = 3 };
constexpr int kGemmEpilogues = 4;

// An epilogue's name as tuning files, gemm_plan_shapes() and the gemm ops spell it: "none",
// "bias", "bias_gelu_tanh", "bias_relu".
const char* gemm_epilogue_name(GemmEpilogue e);
// The epilogue named `s` into *out; false (and *out untouched) for any other string.
bool parse_gemm_epilogue(const std::string& s, GemmEpilogue* out);
// All the names, comma-separated, for the error of a string parse_gemm_epilogue refuses.
std::string gemm_epilogue_names();

// The input of Gemm::run_normed: norm(x) with x = input (+ input_bias) (+ residual), rows of k
// elements, as kernels::NormParams describes it (LayerNorm or RMSNorm).
struct GemmNormedInput {
  kernels::NormKind kind = kernels::NormKind::kLayerNorm;
  const void* input = nullptr;       // [m, k]
  const void* residual = nullptr;    // [m, k] or null
  const void* input_bias = nullptr;  // [k] or null
  const void* gamma = nullptr;       // [k]
  const void* beta = nullptr;        // [k] or null
  float eps = 1e-5f;
  void* residual_out = nullptr;  // [m, k] receives x, or null; must not alias the inputs
  // [m, k] norm(x): scratch of the unfused path (a norms kernel writes it, the product reads it),
  // and written by the fused path too when keep_out. Must not alias the inputs.
  void* out = nullptr;
  bool keep_out = false;
};

struct GemmKey {
  int64_t m, n, k;
  DType dtype;
  GemmEpilogue epilogue;
  bool accumulate;
  bool transposed;  // weight given as [n, k] (e.g. lm_head [V, e])
  bool operator==(const GemmKey& o) const {
    return m == o.m && n == o.n && k == o.k && dtype == o.dtype && epilogue == o.epilogue &&
           accumulate == o.accumulate && transposed == o.transposed;
  }
};

struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const {
    size_t h = static_cast<size_t>(k.m) * 0x9E3779B97F4A7C15ull;
    h ^= static_cast<size_t>(k.n) + 0x7f4a7c15 + (h << 6) + (h >> 2);
    h ^= static_cast<size_t>(k.k) + 0x3c6ef372 + (h << 6) + (h >> 2);
    h ^= (static_cast<size_t>(k.dtype) << 8) | (static_cast<size_t>(k.epilogue) << 4) |
         (static_cast<size_t>(k.transposed) << 1) | static_cast<size_t>(k.accumulate);
    return h;
  }
};

class Gemm {
 public:
  // The workspace cap of the algorithm search (the workspace itself is what the chosen need).
  static constexpr size_t kMaxWorkspaceBytes = size_t{32} << 20;

  explicit Gemm(CudaContext* ctx);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // out[m, n] = in[m, k] @ weight[k, n] (+ bias[n] per epilogue) (+ beta * out if beta != 0).
  // All pointers of `dtype`, row-major, contiguous; bias required by the bias epilogues.
  void run(DType dtype, const void* in, const void* weight, const void* bias, void* out, int64_t m,
           int64_t n, int64_t k, GemmEpilogue epilogue = GemmEpilogue::kNone, float beta = 0.f);

  // out[m, n] = act(in[m, k] @ weight[k, n] + bias[n]) (+ beta * out). One fused kernel on the
  // GEMV path. On cuBLASLt, ReLU rides on its bias epilogue, and so does tanh-GELU for 16-bit
  // types: cuBLASLt applies it to the fp32 accumulator and rounds once. Other activations and
  // fp32 (which keeps warpformer's exact tanh) run warpformer's bias/activation kernel after a
  // plain GEMM. bias may be null.
  // beside: the caller promises that the kernel just before this product on the stream neither
  // writes what it reads nor reads or writes what it writes; where the GEMV runs the product it
  // then runs beside that kernel (kernels::GemvParams::beside).
  void run_act(DType dtype, const void* in, const void* weight, const void* bias, void* out,
               int64_t m, int64_t n, int64_t k, kernels::Activation act, float beta = 0.f,
               bool beside = false);

  // out[m, n] = act(norm(x)[m, k] @ weight[k, n] + bias[n]), x described by `in`. Where the GEMV
  // runs the product and norm fusion is on, one kernel normalises the rows itself
  // (kernels::launch_gemv_normed); otherwise a norms kernel writes in.out first. Both paths
  // write residual_out (and in.out when kept) and give bit-identical results.
  // beside: as for run_act (then the norms kernel of the unfused path does not run beside).
  void run_normed(DType dtype, const GemmNormedInput& in, const void* weight, const void* bias,
                  void* out, int64_t m, int64_t n, int64_t k, kernels::Activation act,
                  bool beside = false);

  // Whether run_normed may fuse the norm into the GEMV (on by default; the norm_gemm op's
  // 'unfused' backend turns it off, the reference the fused path is tested against).
  void set_norm_fusion(bool on) { norm_fusion_ = on; }
  bool norm_fusion() const { return norm_fusion_; }

  // Whether run_normed with these arguments would run the fused kernel (launches nothing).
  bool fuses_norm(DType dtype, const GemmNormedInput& in, const void* weight, const void* bias,
                  void* out, int64_t m, int64_t n, int64_t k, kernels::Activation act);

  // out[m, n] = in[m, k] @ weight[n, k]^T (+ bias[n]): for weights stored [out, in], such as the
  // lm_head [V, e], which the on-disk format never transposes.
  void run_transposed(DType dtype, const void* in, const void* weight, const void* bias, void* out,
                      int64_t m, int64_t n, int64_t k);

  // Which products go to the GEMV kernel: never (all cuBLASLt: the `warpformer.gemm` op's
  // backend='cublaslt'), where it measured faster (the default), or whenever the kernel can run
  // the shape (backend='gemv').
  enum class GemvPolicy { kNever, kPreferred, kAlways };
  void set_gemv_policy(GemvPolicy policy) { gemv_policy_ = policy; }

  // Promise that no weight passed to this Gemm is written by the kernel just before the product
  // on the stream (true of model weights, written once at load time). The GEMV then starts
  // streaming the weight while that kernel is still running (kernels::GemvParams::
  // prefetch_weight). Off by default: the `warpformer.gemm` op cannot promise it.
  void set_static_weights(bool on) { static_weights_ = on; }
  bool static_weights() const { return static_weights_; }

  // Rows up to which the GEMV runs [k, n] (or transposed [n, k]) products under the policy.
  int gemv_max_rows(bool transposed) const;
  CudaContext& context() const { return *ctx_; }

  // Number of shapes whose plan is cached now (at most kMaxPlans).
  size_t cached_plans() const;
  // The cached shapes, one line each with the tuning file's key columns ("float16 m n k
  // transposed epilogue accumulate", see load_tuning), sorted: what the calls so far ran on
  // cuBLASLt (the kMaxPlans most recently used).
  std::vector<std::string> plan_shapes() const;
  static constexpr size_t kMaxPlans = 1024;
  // Row counts up to kExactRows are planned for exactly; above, the heuristic is asked for
  // heuristic_rows(m): m rounded up to a multiple of max(16, bit_ceil(m) / 16) (m itself past
  // 2^40).
  static constexpr int64_t kExactRows = 64;
  static int64_t heuristic_rows(int64_t m);
  // cublasLtMatmulAlgoGetHeuristic calls made so far (tests count them).
  int64_t heuristic_queries() const { return heuristic_queries_; }

  // Per-shape algorithm choices from a tuning file written by `warpformer gemm-tune`: the index
  // into cuBLASLt's heuristic list that measured fastest. Shapes not in the file use the
  // heuristic's first choice. Returns false when the file was not used; `note` (one line) says
  // how many shapes were loaded or why the file was ignored.
  bool load_tuning(const std::string& path, std::string* note);
  size_t tuned_shapes() const { return tuned_.size(); }
  // Plans made so far with an algorithm from the tuning file: its own shape, or (above
  // kExactRows) the rounded row count heuristic_rows(m) whose algorithm the shape borrows.
  int64_t tuned_plans() const { return tuned_plans_; }

  // Times the first `max_algos` heuristic candidates for one shape on the given buffers
  // (microseconds per launch, from a CUDA graph of `reps` launches back to back, the median of
  // three replays; -1 for a candidate that failed). Launch i reads weights[i % size]: copies
  // whose bytes together exceed the L2 cache time the weight as a model's pass meets it, read
  // from DRAM, where one copy would be timed from L2 after its first launch. For the tuner.
  std::vector<float> benchmark(const GemmKey& key, const void* in,
                               const std::vector<const void*>& weights, const void* bias, void* out,
                               int max_algos, int reps);

  // Identifies the GPU and cuBLASLt version a tuning file was made for.
  std::string tuning_fingerprint() const;

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace = 0;  // bytes the algorithm needs
    Plan() = default;
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;
    ~Plan();
  };
  // Shared: a plan dropped from the cache (by another thread's insert, or load_tuning) stays
  // alive for a launch that already holds it.
  std::shared_ptr<Plan> plan_for(const GemmKey& key);
  void create_descriptors(const GemmKey& key, Plan* plan) const;
  std::vector<cublasLtMatmulHeuristicResult_t> heuristics(const Plan& plan, int count) const;
  // Runs the GEMV kernel (normalising `norm` first when given) when m and the shape allow it;
  // false means "use cuBLASLt". With launch false it only answers.
  bool try_gemv(DType dtype, const void* in, const void* weight, const void* bias, void* out,
                int64_t m, int64_t n, int64_t k, bool transposed, kernels::Activation act,
                float beta, const GemmNormedInput* norm = nullptr, bool launch = true,
                bool beside = false);
  void launch(const GemmKey& key, const void* in, const void* weight, const void* bias, void* out,
              float beta);
  // Grows the context's workspace to `bytes`; refuses while the stream is capturing a graph.
  // Like the launches, not synchronised: one thread drives a Gemm (and its context) at a time.
  void reserve_workspace(size_t bytes, const GemmKey& key);

  CudaContext* ctx_;
  // kPreferred also sends [k, n] products of 3-8 rows to the GEMV where it runs them on tensor
  // cores (kernels::gemv_kn_tensor_cores).
  GemvPolicy gemv_policy_ = GemvPolicy::kPreferred;
  // Up to this many rows the engine's policy also lets the tensor-core GEMV normalise its own
  // input (the norm then costs no kernel of its own); past it the norms kernel runs first and
  // the product reads its output. Every block of the GEMV forms the statistics of every row
  // (all rows at once) and normalises its k-range of them, work that grows with the rows and,
  // at one block per SM, is latency-bound: past 6 rows it costs more than the kernel it saves
  // (benchmarks/HISTORY.md, "The normalising prologue forms every row's statistics at once").
  static constexpr int64_t kTensorCoreNormRows = 6;
  bool static_weights_ = false;
  bool norm_fusion_ = true;
  mutable std::mutex mu_;
  struct CachedPlan {
    std::shared_ptr<Plan> plan;
    std::list<GemmKey>::iterator use;  // its place in uses_
  };
  std::list<GemmKey> uses_;  // cached shapes, most recently used first
  std::unordered_map<GemmKey, CachedPlan, GemmKeyHash> plans_;
  std::unordered_map<GemmKey, int, GemmKeyHash> tuned_;  // heuristic index per shape
  // The algorithm chosen per shape with m = heuristic_rows(m): the tuning file's for that shape,
  // else the heuristic's first (cleared when full).
  std::unordered_map<GemmKey, cublasLtMatmulHeuristicResult_t, GemmKeyHash> rounded_algos_;
  mutable std::atomic<int64_t> heuristic_queries_{0};
  std::atomic<int64_t> tuned_plans_{0};
};

}  // namespace warpformer
