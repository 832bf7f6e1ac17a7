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

CudaContext::~CudaContext() {
  if (own_stream_ != nullptr) {
    cudaStreamSynchronize(own_stream_);
    cudaStreamDestroy(own_stream_);
  }
  if (order_event_ != nullptr) cudaEventDestroy(order_event_);
}

cudaStream_t CudaContext::own_stream() {
  if (own_stream_ == nullptr) {
    const DeviceScope scope(device_);
    WF_CUDA_CHECK(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking));
    WF_CUDA_CHECK(cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming));
  }
  return own_stream_;
}

void CudaContext::enter_own_stream() {
  cudaStream_t own = own_stream();
  TORCH_INTERNAL_ASSERT(stream_ != own,
                        "CudaContext: an own-stream scope was entered inside another");
  caller_stream_ = stream_;
  WF_CUDA_CHECK(cudaEventRecord(order_event_, caller_stream_));
  WF_CUDA_CHECK(cudaStreamWaitEvent(own, order_event_, 0));
  stream_ = own;
}

// Never throws (it runs from destructors during unwinding); a failure here would also have
// failed the work before it, which reports the error.
void CudaContext::leave_own_stream() noexcept {
  if (cudaEventRecord(order_event_, own_stream_) == cudaSuccess) {
    cudaStreamWaitEvent(caller_stream_, order_event_, 0);
  }
  stream_ = caller_stream_;
}

void CudaContext::reserve_workspace(size_t bytes) {
  if (bytes <= workspace_.size()) return;
  workspace_.reset();  // before allocating: the two need not be held at once
  ++workspace_generation_;
  workspace_ = DeviceBuffer(allocator_.get(), bytes, stream_);
}

}  // namespace warpformer
