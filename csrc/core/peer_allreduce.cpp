#include "csrc/core/peer_allreduce.h"

#include <c10/util/Exception.h>

#include "csrc/core/check.h"
#include "csrc/core/cuda_context.h"
#include "kernels/peer_allreduce.h"

namespace warpformer {
namespace {

// What each rank tells the others during set-up.
struct alignas(16) Record {
  cudaIpcMemHandle_t handle;
  char pci_bus_id[32];
  int32_t willing;  // this rank allocated and exported its buffer, and the path is not disabled
  char pad[128 - sizeof(cudaIpcMemHandle_t) - 32 - sizeof(int32_t)];
};
static_assert(sizeof(Record) == 128, "Record is exchanged as 32 floats");

// A CUDA call whose failure only disqualifies the path: the error is cleared and described.
bool soft(cudaError_t e, const char* what, std::string* why) {
  if (e == cudaSuccess) return true;
  (void)cudaGetLastError();
  if (why->empty()) *why = std::string(what) + ": " + cudaGetErrorString(e);
  return false;
}

}  // namespace

std::unique_ptr<PeerAllReduce> PeerAllReduce::create(Communicator& comm, int device,
                                                     double timeout_s, bool wanted,
                                                     std::string* why) {
  why->clear();
  DeviceScope scope(device);
  std::unique_ptr<PeerAllReduce> self(new PeerAllReduce());
  self->rank_ = comm.rank();
  self->ranks_ = comm.size();
  self->device_ = device;
  self->timeout_ns_ = static_cast<uint64_t>(timeout_s * 1e9);
  self->buffers_.assign(self->ranks_, nullptr);

  Record mine{};
  bool willing = wanted;
  if (!wanted) *why = "peer_allreduce=False";
  if (self->ranks_ < 2 || self->ranks_ > kernels::kPeerMaxRanks) {
    willing = false;
    if (why->empty()) {
      *why = "group size " + std::to_string(self->ranks_) + " is outside [2, " +
             std::to_string(kernels::kPeerMaxRanks) + "]";
    }
  }
  if (willing) {
    constexpr size_t kSeqBytes = kernels::kPeerMaxBlocks * sizeof(uint32_t);
    willing = soft(cudaMalloc(reinterpret_cast<void**>(&self->own_), kernels::kPeerBufferBytes),
                   "cudaMalloc", why) &&
              soft(cudaMemset(self->own_, 0, kernels::kPeerBufferBytes), "cudaMemset", why) &&
              soft(cudaMalloc(reinterpret_cast<void**>(&self->sequence_), kSeqBytes), "cudaMalloc",
                   why) &&
              soft(cudaMemset(self->sequence_, 0, kSeqBytes), "cudaMemset", why) &&
              soft(cudaIpcGetMemHandle(&mine.handle, self->own_), "cudaIpcGetMemHandle", why) &&
              soft(cudaDeviceGetPCIBusId(mine.pci_bus_id, sizeof(mine.pci_bus_id), device),
                   "cudaDeviceGetPCIBusId", why);
    // The zeroed flags must be in place before any peer can signal: the collectives below
    // complete only after every rank got here.
    if (willing) willing = soft(cudaDeviceSynchronize(), "cudaDeviceSynchronize", why);
  }
  mine.willing = willing ? 1 : 0;

  // Exchange the records (all_gather moves them as float32 words; nothing is interpreted).
  const int n = self->ranks_;
  std::vector<Record> all(n);
  cudaStream_t stream = nullptr;
  void* dev = nullptr;
  WF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  try {
    WF_CUDA_CHECK(cudaMalloc(&dev, sizeof(Record) * (n + 1)));
    char* recv = static_cast<char*>(dev) + sizeof(Record);
    WF_CUDA_CHECK(cudaMemcpyAsync(dev, &mine, sizeof(Record), cudaMemcpyHostToDevice, stream));
    comm.all_gather(dev, recv, sizeof(Record) / sizeof(float), DType::kFloat32, stream);
    WF_CUDA_CHECK(
        cudaMemcpyAsync(all.data(), recv, sizeof(Record) * n, cudaMemcpyDeviceToHost, stream));
    WF_CUDA_CHECK(cudaStreamSynchronize(stream));

    bool mapped = willing;
    for (int r = 0; r < n && mapped; ++r) {
      if (r == self->rank_) {
        self->buffers_[r] = self->own_;
        continue;
      }
      if (!all[r].willing) {
        *why = "rank " + std::to_string(r) + " could not offer its buffer";
        mapped = false;
        break;
      }
      int peer_device = -1, can = 0;
      mapped =
          soft(cudaDeviceGetByPCIBusId(&peer_device, all[r].pci_bus_id),
               "the GPU of a peer is not visible here (another host, or hidden by "
               "CUDA_VISIBLE_DEVICES): cudaDeviceGetByPCIBusId",
               why) &&
          soft(cudaDeviceCanAccessPeer(&can, device, peer_device), "cudaDeviceCanAccessPeer", why);
      if (mapped && !can && peer_device != device) {
        *why = "no peer access from GPU " + std::to_string(device) + " to GPU " +
               std::to_string(peer_device);
        mapped = false;
      }
      void* p = nullptr;
      if (mapped) {
        mapped = soft(cudaIpcOpenMemHandle(&p, all[r].handle, cudaIpcMemLazyEnablePeerAccess),
                      "cudaIpcOpenMemHandle", why);
      }
      if (mapped) self->buffers_[r] = static_cast<char*>(p);
    }
    // Keep the path only if every rank mapped every peer.
    float ok = mapped ? 1.f : 0.f;
    WF_CUDA_CHECK(cudaMemcpyAsync(dev, &ok, sizeof(float), cudaMemcpyHostToDevice, stream));
    comm.all_reduce_sum(dev, 1, DType::kFloat32, stream);
    WF_CUDA_CHECK(cudaMemcpyAsync(&ok, dev, sizeof(float), cudaMemcpyDeviceToHost, stream));
    WF_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaFree(dev);
    cudaStreamDestroy(stream);
    if (ok != static_cast<float>(n)) {
      if (why->empty()) *why = "another rank could not map every peer's buffer";
      return nullptr;  // the destructor unmaps and frees
    }
  } catch (...) {
    if (dev != nullptr) cudaFree(dev);
    cudaStreamDestroy(stream);
    throw;
  }
  return self;
}

PeerAllReduce::~PeerAllReduce() {
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) return;
  cudaSetDevice(device_);
  for (int r = 0; r < static_cast<int>(buffers_.size()); ++r) {
    if (r != rank_ && buffers_[r] != nullptr) cudaIpcCloseMemHandle(buffers_[r]);
  }
  if (own_ != nullptr) cudaFree(own_);
  if (sequence_ != nullptr) cudaFree(sequence_);
  (void)cudaGetLastError();
  cudaSetDevice(prev);
}

template <typename T>
kernels::PeerAllReduceParams<T> PeerAllReduce::params(void* data, int64_t count) const {
  kernels::PeerAllReduceParams<T> p;
  p.data = static_cast<T*>(data);
  p.count = count;
  for (int r = 0; r < ranks_; ++r) p.buffers[r] = buffers_[r];
  p.sequence = sequence_;
  p.rank = rank_;
  p.ranks = ranks_;
  p.timeout_ns = timeout_ns_;
  // Decode-sized calls let the next kernel start early (kernels::PeerAllReduceParams).
  p.start_next_early = count * static_cast<int64_t>(sizeof(T)) <= kernels::kPeerEarlyStartBytes;
  return p;
}

bool PeerAllReduce::supports(const void* data, int64_t count, DType dtype) const {
  return WF_DISPATCH_FLOATING(dtype, "PeerAllReduce", [&] {
    return kernels::peer_allreduce_supported(params<scalar_t>(const_cast<void*>(data), count));
  });
}

bool PeerAllReduce::run(void* data, int64_t count, DType dtype, cudaStream_t stream) {
  return WF_DISPATCH_FLOATING(dtype, "PeerAllReduce", [&] {
    const kernels::PeerAllReduceParams<scalar_t> p = params<scalar_t>(data, count);
    if (!kernels::peer_allreduce_supported(p)) return false;
    WF_CUDA_CHECK(kernels::launch_peer_allreduce(p, stream));
    return true;
  });
}

}  // namespace warpformer
