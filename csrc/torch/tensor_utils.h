// Argument checks and conversions shared by the torch-facing ops and classes.
//
// Every check names the op, the argument and the rule it broke, e.g.
//   "warpformer.layer_norm: weight must have dtype float16 (the dtype of input), got float32".
// Device checks come after dtype/shape checks so that argument errors are reported the same way
// on a machine without a GPU.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "csrc/core/cuda_context.h"
#include "csrc/core/dispatch.h"

namespace warpformer {

// fp32/fp16/bf16 -> DType; anything else throws naming op and argument.
DType to_dtype(c10::ScalarType t, const char* op, const char* arg);
c10::ScalarType to_scalar_type(DType t);

void check_floating(const at::Tensor& t, const char* op, const char* arg);
void check_dtype(const at::Tensor& t, c10::ScalarType want, const char* op, const char* arg,
                 const char* why = nullptr);
void check_dim(const at::Tensor& t, int64_t dim, const char* op, const char* arg);
void check_dim_in(const at::Tensor& t, std::initializer_list<int64_t> dims, const char* op,
                  const char* arg);
void check_size(const at::Tensor& t, int64_t dim, int64_t want, const char* op, const char* arg,
                const char* why);
void check_contiguous(const at::Tensor& t, const char* op, const char* arg);
// `t` must be a CUDA tensor on the same device as `ref` (or on any CUDA device if ref undefined).
void check_cuda(const at::Tensor& t, const char* op, const char* arg,
                const at::Tensor& ref = at::Tensor(), const char* ref_name = nullptr);

// The CPU tensors `host` on cuda:`device`, sent with one host->device copy on the device's current
// stream: they are packed into one pinned staging buffer (each at a 16-byte aligned offset) and
// come back as views of one device allocation, with their dtypes and shapes. Undefined entries
// stay undefined. One copy instead of one per tensor: each pageable copy costs a round trip.
std::vector<at::Tensor> upload_together(const std::vector<at::Tensor>& host, int64_t device);

// "[a, b, c]": a shape as the error messages write it.
std::string shape_str(const std::vector<int64_t>& shape);

// Element count of the leading axes of a [..., last] tensor, as an int64.
int64_t leading_rows(const at::Tensor& t);

// PyTorch's caching allocator behind warpformer's DeviceAllocator interface.
std::shared_ptr<DeviceAllocator> torch_cuda_allocator();

// PyTorch's current stream on the tensor's device.
inline cudaStream_t current_stream(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

template <typename T>
inline T* ptr_or_null(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? reinterpret_cast<T*>(t->data_ptr()) : nullptr;
}

}  // namespace warpformer
