// CudaContext: what every layer needs to launch work — the device, the stream to launch on
// (PyTorch's current stream when created from csrc/torch), a cuBLASLt handle and a GEMM workspace.
//
// Memory comes through the DeviceAllocator interface, which csrc/torch implements with PyTorch's
// caching allocator, so warpformer never calls cudaMalloc per call and shares memory with torch.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

namespace warpformer {

// Makes `device` current for the enclosing scope and restores the caller's device when it ends
// (also when an exception leaves it). Throws if either device cannot be queried or set.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
};

class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  // Device memory usable on `stream`; throws on failure (never returns null for bytes > 0).
  virtual void* allocate(size_t bytes, cudaStream_t stream) = 0;
  virtual void deallocate(void* ptr) = 0;
};

// Owning handle to device memory from a DeviceAllocator. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceAllocator* alloc, size_t bytes, cudaStream_t stream);
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset();
  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return bytes_; }

 private:
  DeviceAllocator* alloc_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// The process-wide cuBLASLt handle for a device: created on first use, kept for the process's
// life (destroying handles during interpreter shutdown races the driver's own teardown).
cublasLtHandle_t cublaslt_handle(int device);

class CudaContext {
 public:
  // workspace_bytes: the cuBLASLt workspace to start with; Gemm grows it to what the algorithms
  // it chose need (reserve_workspace), so it is usually much smaller than the 32 MiB that
  // cuBLASLt may use on Hopper.
  CudaContext(int device, cudaStream_t stream, std::shared_ptr<DeviceAllocator> allocator,
              size_t workspace_bytes = 0);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  // Launch on another stream from now on (e.g. the caller's current PyTorch stream changed).
  void set_stream(cudaStream_t stream) { stream_ = stream; }
  cublasLtHandle_t blaslt() const { return blaslt_; }
  void* workspace() const { return workspace_.data(); }
  size_t workspace_size() const { return workspace_.size(); }
  // Grows the workspace to at least `bytes` (never shrinks; the old buffer goes back to the
  // allocator, in order with the stream it was allocated on). A CUDA graph that baked the old
  // pointer must not be replayed after a growth: workspace_generation() counts them.
  void reserve_workspace(size_t bytes);
  size_t workspace_generation() const { return workspace_generation_; }
  DeviceAllocator* allocator() const { return allocator_.get(); }
  const cudaDeviceProp& props() const { return props_; }

  // The context's own stream. A model's calls run on it (OwnStreamScope) rather than on the
  // caller's: PyTorch's default stream is the legacy one, which cannot be captured into a CUDA
  // graph; and an instance's calls then run in call order whatever streams its callers use.
  cudaStream_t own_stream();
  // Entered: the own stream waits for the caller's work so far and becomes stream(). Left: the
  // caller's stream waits for the work launched meanwhile and becomes stream() again. Never
  // nested (a nested scope would order the real caller after nothing).
  void enter_own_stream();
  void leave_own_stream() noexcept;
  // Waits for the own stream's work (if it was ever created); never throws.
  void synchronize_own_stream() noexcept {
    if (own_stream_ != nullptr) cudaStreamSynchronize(own_stream_);
  }

 private:
  int device_;
  cudaStream_t stream_;
  std::shared_ptr<DeviceAllocator> allocator_;
  cublasLtHandle_t blaslt_;
  DeviceBuffer workspace_;
  size_t workspace_generation_ = 0;
  cudaDeviceProp props_;
  cudaStream_t own_stream_ = nullptr;
  cudaEvent_t order_event_ = nullptr;
  cudaStream_t caller_stream_ = nullptr;
};

// Runs the enclosing call on the context's own stream (entered here, left on scope exit).
class OwnStreamScope {
 public:
  explicit OwnStreamScope(CudaContext& ctx) : ctx_(ctx) { ctx_.enter_own_stream(); }
  ~OwnStreamScope() { ctx_.leave_own_stream(); }
  OwnStreamScope(const OwnStreamScope&) = delete;
  OwnStreamScope& operator=(const OwnStreamScope&) = delete;

 private:
  CudaContext& ctx_;
};

}  // namespace warpformer
