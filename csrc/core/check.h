// Error checking for CUDA, cuBLAS(Lt) and NCCL calls, and for kernel launches.
//
// Every macro throws c10::Error (seen by Python as RuntimeError) carrying file:line, the failing
// expression and the library's decoded message. The library never calls exit() or abort().
// c10/util/Exception.h is the only piece of the torch distribution that core code uses: it is the
// error type PyTorch translates at the Python boundary, so errors raised deep in a model reach the
// user with their message intact.
#pragma once

#include <cuda_runtime_api.h>

#include <c10/util/Exception.h>

#include <string>

namespace warpformer {

// Decoders for library status codes (defined in check.cpp so that cublas and nccl headers stay
// out of every translation unit that only needs CUDA).
std::string cublas_status_string(int status);
std::string nccl_result_string(int result);

[[noreturn]] void throw_library_error(const char* library, const char* expr, const char* file,
                                      int line, const std::string& message);

}  // namespace warpformer

#define WF_CUDA_CHECK(expr)                                                                 \
  do {                                                                                      \
    const cudaError_t wf_err_ = (expr);                                                     \
    if (wf_err_ != cudaSuccess) {                                                           \
      (void)cudaGetLastError(); /* clear a non-sticky error so later calls do not see it */ \
      ::warpformer::throw_library_error(                                                    \
          "CUDA", #expr, __FILE__, __LINE__,                                                \
          std::string(cudaGetErrorName(wf_err_)) + ": " + cudaGetErrorString(wf_err_));     \
    }                                                                                       \
  } while (0)

// Checks the launch that was just made (bad configuration, missing kernel image for this GPU).
#define WF_CHECK_LAUNCH() WF_CUDA_CHECK(cudaGetLastError())

#define WF_CUBLAS_CHECK(expr)                                                        \
  do {                                                                               \
    const int wf_st_ = static_cast<int>(expr);                                       \
    if (wf_st_ != 0) {                                                               \
      ::warpformer::throw_library_error("cuBLAS", #expr, __FILE__, __LINE__,         \
                                        ::warpformer::cublas_status_string(wf_st_)); \
    }                                                                                \
  } while (0)

#define WF_NCCL_CHECK(expr)                                                         \
  do {                                                                              \
    const int wf_res_ = static_cast<int>(expr);                                     \
    if (wf_res_ != 0) {                                                             \
      ::warpformer::throw_library_error("NCCL", #expr, __FILE__, __LINE__,          \
                                        ::warpformer::nccl_result_string(wf_res_)); \
    }                                                                               \
  } while (0)
