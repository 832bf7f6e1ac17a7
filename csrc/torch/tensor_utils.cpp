#include "csrc/torch/tensor_utils.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <sstream>

namespace warpformer {

DType to_dtype(c10::ScalarType t, const char* op, const char* arg) {
  switch (t) {
    case c10::ScalarType::Float: return DType::kFloat32;
    case c10::ScalarType::Half: return DType::kFloat16;
    case c10::ScalarType::BFloat16: return DType::kBFloat16;
    default: break;
  }
  TORCH_CHECK(false, op, ": ", arg, " must be float32, float16 or bfloat16, got ", t);
}

c10::ScalarType to_scalar_type(DType t) {
  switch (t) {
    case DType::kFloat32: return c10::ScalarType::Float;
    case DType::kFloat16: return c10::ScalarType::Half;
    case DType::kBFloat16: return c10::ScalarType::BFloat16;
  }
  TORCH_INTERNAL_ASSERT(false, "bad DType");
}

void check_floating(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(t.defined(), op, ": ", arg, " is an undefined tensor");
  (void)to_dtype(t.scalar_type(), op, arg);
}

void check_dtype(const at::Tensor& t, c10::ScalarType want, const char* op, const char* arg,
                 const char* why) {
  TORCH_CHECK(t.scalar_type() == want, op, ": ", arg, " must have dtype ", want, why ? " (" : "",
              why ? why : "", why ? ")" : "", ", got ", t.scalar_type());
}

void check_dim(const at::Tensor& t, int64_t dim, const char* op, const char* arg) {
  TORCH_CHECK(t.dim() == dim, op, ": ", arg, " must be ", dim, "-dimensional, got shape ",
              t.sizes());
}

void check_dim_in(const at::Tensor& t, std::initializer_list<int64_t> dims, const char* op,
                  const char* arg) {
  for (int64_t d : dims) {
    if (t.dim() == d) return;
  }
  std::ostringstream os;
  bool first = true;
  for (int64_t d : dims) {
    os << (first ? "" : " or ") << d;
    first = false;
  }
  TORCH_CHECK(false, op, ": ", arg, " must be ", os.str(), "-dimensional, got shape ", t.sizes());
}

void check_size(const at::Tensor& t, int64_t dim, int64_t want, const char* op, const char* arg,
                const char* why) {
  TORCH_CHECK(t.size(dim) == want, op, ": ", arg, ".shape[", dim, "] must be ", want, " (", why,
              "), got shape ", t.sizes());
}

void check_contiguous(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(t.is_contiguous(), op, ": ", arg,
              " must be contiguous (it is written in place), got strides ", t.strides());
}

void check_cuda(const at::Tensor& t, const char* op, const char* arg, const at::Tensor& ref,
                const char* ref_name) {
  TORCH_CHECK(t.is_cuda(), op, ": ", arg, " must be a CUDA tensor, got device ", t.device(),
              " (warpformer ops run on NVIDIA GPUs only; use warpformer.reference on the CPU)");
  if (ref.defined()) {
    TORCH_CHECK(t.device() == ref.device(), op, ": ", arg, " is on ", t.device(), " but ", ref_name,
                " is on ", ref.device(), "; all tensors must be on one device");
  }
}

std::vector<at::Tensor> upload_together(const std::vector<at::Tensor>& host, int64_t device) {
  constexpr int64_t kAlign = 16;
  std::vector<at::Tensor> src(host.size());
  std::vector<int64_t> offset(host.size(), 0);
  int64_t total = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    if (!host[i].defined()) continue;
    TORCH_CHECK(host[i].is_cpu(), "upload_together: tensor ", i, " is on ", host[i].device(),
                ", not the CPU");
    src[i] = host[i].contiguous();
    offset[i] = total;
    // At least one aligned slot, so that an empty tensor's view stays inside the buffer.
    total += std::max<int64_t>((static_cast<int64_t>(src[i].nbytes()) + kAlign - 1) / kAlign, 1) *
             kAlign;
  }
  const at::Tensor staging = at::empty({std::max<int64_t>(total, kAlign)},
                                       at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  auto* base = staging.data_ptr<uint8_t>();
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i].defined() && src[i].nbytes() > 0) {
      std::memcpy(base + offset[i], src[i].data_ptr(), src[i].nbytes());
    }
  }
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  // Non-blocking from pinned memory: the caching host allocator keeps `staging` until the copy
  // has run on the stream.
  const at::Tensor all = staging.to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)),
                                    /*non_blocking=*/true);
  std::vector<at::Tensor> out(host.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (!src[i].defined()) continue;
    const int64_t bytes = static_cast<int64_t>(src[i].nbytes());
    // A 1-d byte view reinterpreted as the element type, then shaped.
    const int64_t elem = static_cast<int64_t>(src[i].element_size());
    at::Tensor flat = all.narrow(0, offset[i], std::max(bytes, elem)).view(src[i].scalar_type());
    out[i] = flat.narrow(0, 0, src[i].numel()).view(src[i].sizes());
  }
  return out;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

int64_t leading_rows(const at::Tensor& t) {
  return t.dim() == 0 ? 1 : t.numel() / std::max<int64_t>(t.size(-1), 1);
}

namespace {

class TorchCudaAllocator final : public DeviceAllocator {
 public:
  void* allocate(size_t bytes, cudaStream_t stream) override {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream);
  }
  void deallocate(void* ptr) override { c10::cuda::CUDACachingAllocator::raw_delete(ptr); }
};

}  // namespace

std::shared_ptr<DeviceAllocator> torch_cuda_allocator() {
  static auto alloc = std::make_shared<TorchCudaAllocator>();
  return alloc;
}

}  // namespace warpformer
