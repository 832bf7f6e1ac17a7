// PeerAllReduce: the one-shot NVLink all-reduce of kernels/peer_allreduce.h, set up for one
// communicator group. Each rank allocates an exchange buffer, exports it with CUDA IPC and maps
// every peer's; the group keeps the path only when every rank could map every peer (same host,
// peer access between the GPUs, wanted by every rank) — a decision all ranks take together, so
// they never disagree about which collective runs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "csrc/core/communicator.h"
#include "kernels/peer_allreduce.h"

namespace warpformer {

class PeerAllReduce {
 public:
  // Collective over `comm` (every rank of the group calls it at the same point; `comm` must not
  // route all_reduce_sum through a PeerAllReduce yet). Returns null on every rank alike when the
  // path is not available (not `wanted` by some rank included), with the reason in *why.
  static std::unique_ptr<PeerAllReduce> create(Communicator& comm, int device, double timeout_s,
                                               bool wanted, std::string* why);
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  // True when a message of `count` elements at `data` fits one call.
  bool supports(const void* data, int64_t count, DType dtype) const;
  // In-place sum over the group on `stream`; every rank must call it with the same counts in
  // the same order. Returns false (nothing launched) when supports() is false.
  bool run(void* data, int64_t count, DType dtype, cudaStream_t stream);

 private:
  PeerAllReduce() = default;
  template <typename T>
  kernels::PeerAllReduceParams<T> params(void* data, int64_t count) const;

  int rank_ = 0, ranks_ = 0, device_ = 0;
  uint64_t timeout_ns_ = 0;
  char* own_ = nullptr;           // this rank's exchange buffer
  uint32_t* sequence_ = nullptr;  // per-block call counters
  std::vector<char*> buffers_;    // every rank's buffer as mapped here (own_ at rank_)
};

}  // namespace warpformer
