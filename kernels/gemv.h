// Weight-streaming matrix-vector products for decode-sized batches (1 to 8 rows), where a GEMM
// library spends its time in tiles built for large M and in split-K reduction kernels:
//
//   out[m, n] = act(in[m, :] . W[:, n] + bias[n]) + beta * out[m, n]
//
// with W stored [k, n] (the engine's [in, out] layout) or [n, k] ("transposed": the lm_head
// [vocab, hidden]). Every weight byte is read once, 16 bytes per load, with fp32 accumulation
// in a fixed order (results are deterministic run to run). Products of 3-8 rows of 16-bit
// values run on tensor cores (mma.sync): [n, k] ones always (sm_80+), [k, n] ones where
// gemv_kn_tensor_cores says (sm_90: weight tiles staged in shared memory, a cluster k-split); the
// others on CUDA cores. Bias, activation and the residual accumulate are applied once per
// output element, so a fused call replaces GEMM + bias/act.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/activations.h"
#include "kernels/norms.h"

namespace warpformer {
namespace kernels {

constexpr int kGemvMaxRows = 8;
// Where the GEMV is faster than cuBLASLt (fp16 and bf16, gpt2-medium and gpt-j-6b shapes;
// benchmarks/HISTORY.md, "Decode-sized GEMV (bench_kernels.py --gemv-only)"): [k, n] weights up
// to 2 rows (at 3-4 rows its CUDA-core FMAs, not the weight stream, set the pace), and up to 8
// rows where the tensor-core kernel runs the shape (gemv_kn_tensor_cores: 16-bit weights of at
// most 16 MiB, which it streams ahead of the kernel before it; benchmarks/HISTORY.md, "The [k, n]
// GEMV of 3-8 rows on tensor cores"); [n, k] weights (lm_head) up to 8 rows.
constexpr int kGemvPreferredRowsKN = 2;
constexpr int kGemvPreferredRowsNK = 8;

template <typename T>
struct GemvParams {
  T* out = nullptr;           // [m, n]
  const T* in = nullptr;      // [m, k]
  const T* weight = nullptr;  // [k, n], or [n, k] when transposed
  const T* bias = nullptr;    // [n] or null
  int m = 0, n = 0, k = 0;
  bool transposed = false;
  Activation act = Activation::kIdentity;  // applied to (in . W + bias)
  float beta = 0.f;                        // 0: out is write-only
  // The weight is not written by the kernel just before this one on the stream (model weights,
  // written once at load time): a [k, n] product then starts streaming it before waiting for
  // that kernel (programmatic dependent launch, kernels/common.cuh), so the first loads overlap
  // the previous kernel instead of following it. The same promise covers the norm's gamma and
  // beta of launch_gemv_normed (asked of L1 before the wait).
  bool prefetch_weight = false;
  // The kernel just before this one on the stream neither writes what this [k, n] product reads
  // nor reads or writes what it writes (the engine: a parallel-residual layer's MLP-in product
  // after the attention). The product then runs beside that kernel, not after it: it waits for
  // it only before exiting, so a kernel that waits for this one still finds both done.
  bool beside = false;
};

// True when launch_gemv can run these parameters: 1 <= m <= kGemvMaxRows, k (and n when not
// transposed) a multiple of 16 bytes' worth of elements, in/weight 16-byte aligned.
template <typename T>
bool gemv_supported(const GemvParams<T>& p);

// `device` selects the SM count and whether thread-block clusters (sm_90+) may split k across
// blocks. Returns cudaErrorInvalidValue for parameters gemv_supported rejects.
template <typename T>
cudaError_t launch_gemv(const GemvParams<T>& p, int device, cudaStream_t stream);

// True when launch_gemv (and launch_gemv_normed, for the same p) runs p on the [k, n]
// tensor-core kernel: gemv_supported(p), 3 <= m <= 8, a 16-bit type, not transposed nor beside,
// n a multiple of 64, k of 256 with k / (its 256-1,024-row chunk) <= 8, k * n at most 16 MiB,
// and sm_90 code on sm_90+ hardware. launch_gemv_sum and launch_gemv_normed_pair never use it.
template <typename T>
bool gemv_kn_tensor_cores(const GemvParams<T>& p, int device);

// A [k, n] product of a normalised input, the norm done inside the GEMV (one kernel instead of
// launch_norm + launch_gemv):
//
//   x = norm.input (+ norm.input_bias) (+ norm.residual)      [m, k]
//   out = act(norm(x) . W + bias) (+ beta * out)              (p.in is not read)
//   norm.residual_out = x and norm.out = norm(x), each when given
//
// Every block computes the row statistics itself (so it pays off for a row or two: a decode
// step's norm is then no longer a kernel of its own) and normalises its share of k into shared
// memory. The sums are formed exactly as launch_norm forms them, so out, residual_out and
// norm.out are bit-identical to launch_norm followed by launch_gemv. norm.rows must be p.m and
// norm.hidden p.k; the outputs must not alias the inputs; a block's share of the normalised
// rows plus its reduction arrays must fit in 48 KiB of shared memory (without a k-split, many
// rows may not): gemv_normed_supported says whether everything holds.
template <typename T>
bool gemv_normed_supported(const GemvParams<T>& p, const NormParams<T>& norm, int device);

template <typename T>
cudaError_t launch_gemv_normed(const GemvParams<T>& p, const NormParams<T>& norm, int device,
                               cudaStream_t stream);

// A second product of the same normalised rows, written to its own output:
//
//   out2 = act2(norm2(x) . W2 + bias2)     norm2: `norm` with gamma2 / beta2 (null gamma2: norm's)
//
// launch_gemv_normed_pair runs p's product and this one as one launch, the second's column tiles
// after the first's, so that two products of one input (a parallel-residual layer's QKV and
// MLP-in) cost one kernel and stream their weights as one wider matrix. The row statistics, and
// residual_out and norm.out (the first product's norm), are those of launch_gemv_normed.
template <typename T>
struct GemvSecond {
  T* out = nullptr;           // [m, n]
  const T* weight = nullptr;  // [k, n]
  const T* bias = nullptr;    // [n] or null
  const T* gamma = nullptr;   // [k] or null (the first product's gamma and beta)
  const T* beta = nullptr;    // [k] or null (LayerNorm only)
  int n = 0;
  Activation act = Activation::kIdentity;
};

// What gemv_normed_supported asks of p and norm, plus: p.beta == 0; the second product's n a
// positive multiple of 16 bytes' worth of elements, its weight, gamma and beta 16-byte aligned
// (a beta only with a gamma);
// its output apart from every other range; and the shared memory of the joint split in 48 KiB.
template <typename T>
bool gemv_normed_pair_supported(const GemvParams<T>& p, const NormParams<T>& norm,
                                const GemvSecond<T>& second, int device);

template <typename T>
cudaError_t launch_gemv_normed_pair(const GemvParams<T>& p, const NormParams<T>& norm,
                                    const GemvSecond<T>& second, int device, cudaStream_t stream);

// out = act(in . W + in2 . W2 + bias) (+ beta * out): a [k, n] product whose depth continues
// over a second input in2 [m, k2] and weight W2 [k2, n], summed in the same fp32 accumulation
// and rounded once (p gives out, in, W, bias, act, beta). A parallel-residual layer's
// attention-out and MLP-out products are one such launch. gemv_sum_supported: what launch_gemv
// needs of p, plus k2 a multiple of 16 bytes' worth of elements, in2 and W2 16-byte aligned,
// p.k + k2 a step (at most 256) below the int range, p.beside off, and the output apart from
// both inputs.
template <typename T>
bool gemv_sum_supported(const GemvParams<T>& p, const T* in2, const T* weight2, int k2);

// second_ready: the caller promises that in2 and W2 are not written by the kernel just before
// this one on the stream (nor by one still running ahead of it), as a parallel-residual layer's
// MLP hidden is not by the attention kernel. Every block streams its share of the second
// product first and waits for that kernel (programmatic dependent launch) only before its share
// of the first, so the second product's weight streams while that kernel is still running.
template <typename T>
cudaError_t launch_gemv_sum(const GemvParams<T>& p, const T* in2, const T* weight2, int k2,
                            int device, cudaStream_t stream, bool second_ready = false);

// ---- weight-only quantized weights (kernels/gemv_quant.cu) -----------------------------------
// A [k, n] weight stored in one of the formats of docs/FORMAT.md, "Weight-only quantized"
// (python/warpformer/converters/quantize.py writes them): int8, one scale per output column
// (data int8 [k, n], scale [n]); int4, one scale (and with zero points, one uint8 zero point)
// per `group` input rows and column (data uint8 [k / 2, n], byte [j, c] holding row 2j in bits 0-3
// and row 2j + 1 in bits 4-7, two's complement when symmetric; scale and zero [k / group, n]).
// A weight dequantizes to (q - zero) * scale (zero 0 when symmetric).
template <typename T>
struct GemvQuant {
  const void* data = nullptr;
  const T* scale = nullptr;
  const uint8_t* zero = nullptr;  // int4 with zero points only
  int bits = 8;                   // 8 or 4
  int group = 0;                  // int4: input rows per scale (ignored for int8)
};

// out = act(in . dequant(W) + bias) (+ beta * out), W quantized (p.weight is not read; p.transposed
// and p.beside must be off). The weight streams through a ring of registers and is dequantized
// into tensor-core operands (16-bit T only, sm_80+); products accumulate in fp32 over every input
// row (int8 applies its column scale once per output, int4 its group scale once per group of rows).
// gemv_quant_supported: 1 <= m <= kGemvMaxRows; n a multiple of 16; k of 16 (int4: and of group,
// itself a multiple of 16); in and data 16-byte aligned, scale (and zero) aligned to 16 columns;
// the output apart from the input; code and device sm_80 or newer.
template <typename T>
bool gemv_quant_supported(const GemvParams<T>& p, const GemvQuant<T>& q);

template <typename T>
cudaError_t launch_gemv_quant(const GemvParams<T>& p, const GemvQuant<T>& q, int device,
                              cudaStream_t stream);

// out[k, n] = dequant(W) in T: the dense weight a many-row product hands to the GEMM (the GEMV
// pays off only for decode-sized rows). Needs n a multiple of 16, k of 8 and (int4) an even group
// that divides k, data 16-byte aligned and scale (zero) aligned to 16 columns.
template <typename T>
cudaError_t launch_dequantize(const GemvQuant<T>& q, int k, int n, T* out, cudaStream_t stream);

}  // namespace kernels
}  // namespace warpformer
