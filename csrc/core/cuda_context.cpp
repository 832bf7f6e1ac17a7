#include "csrc/core/cuda_context.h"

#include <mutex>
#include <unordered_map>

#include "csrc/core/check.h"

namespace warpformer {

DeviceScope::DeviceScope(int device) {
  WF_CUDA_CHECK(cudaGetDevice(&prev_));
  WF_CUDA_CHECK(cudaSetDevice(device));
}

DeviceScope::~DeviceScope() { cudaSetDevice(prev_); }

DeviceBuffer::DeviceBuffer(DeviceAllocator* alloc, size_t bytes, cudaStream_t stream)
    : alloc_(alloc), bytes_(bytes) {
  TORCH_INTERNAL_ASSERT(alloc != nullptr, "DeviceBuffer needs an allocator");
  ptr_ = bytes > 0 ? alloc->allocate(bytes, stream) : nullptr;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    alloc_ = o.alloc_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.alloc_ = nullptr;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (ptr_ != nullptr && alloc_ != nullptr) alloc_->deallocate(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

cublasLtHandle_t cublaslt_handle(int device) {
  static std::mutex mu;
  static std::unordered_map<int, cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  {
    const DeviceScope scope(device);
    WF_CUBLAS_CHECK(cublasLtCreate(&h));
  }
  handles.emplace(device, h);
  return h;
}

CudaContext::CudaContext(int device, cudaStream_t stream,
                         std::shared_ptr<DeviceAllocator> allocator, size_t workspace_bytes)
    : device_(device), stream_(stream), allocator_(std::move(allocator)) {
  TORCH_CHECK(allocator_ != nullptr, "CudaContext: allocator must not be null");
  WF_CUDA_CHECK(cudaGetDeviceProperties(&props_, device));
  blaslt_ = cublaslt_handle(device);
  if (workspace_bytes > 0) workspace_ = DeviceBuffer(allocator_.get(), workspace_bytes, stream);
}

void CudaContext::reserve_workspace(size_t bytes) {
  if (bytes <= workspace_.size()) return;
  workspace_.reset();  // before allocating: the two need not be held at once
  ++workspace_generation_;
  workspace_ = DeviceBuffer(allocator_.get(), bytes, stream_);
}

}  // namespace warpformer
