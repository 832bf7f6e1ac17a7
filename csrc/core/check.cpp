// Decoding of cuBLAS and NCCL status codes for the check macros in check.h.
#include "csrc/core/check.h"

#include <cublasLt.h>
#include <nccl.h>

#include <sstream>

namespace warpformer {

std::string cublas_status_string(int status) {
  // cuBLASLt has no decoder of its own (cublasGetStatusString lives in libcublas), so spell the
  // statuses out here.
  switch (static_cast<cublasStatus_t>(status)) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED: handle not created";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED: out of device memory";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE: unsupported value or parameter combination";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH: feature not supported on this GPU";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR: GPU memory access failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED: the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED: no algorithm for this layout/type combination";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: break;
  }
  std::ostringstream os;
  os << "cuBLAS status " << status;
  return os.str();
}

std::string nccl_result_string(int result) {
  std::ostringstream os;
  os << ncclGetErrorString(static_cast<ncclResult_t>(result));
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') os << " (" << last << ")";
  return os.str();
}

void throw_library_error(const char* library, const char* expr, const char* file, int line,
                         const std::string& message) {
  std::ostringstream os;
  os << library << " error at " << file << ":" << line << " in `" << expr << "`: " << message;
  throw c10::Error(c10::SourceLocation{library, file, static_cast<uint32_t>(line)}, os.str());
}

}  // namespace warpformer
