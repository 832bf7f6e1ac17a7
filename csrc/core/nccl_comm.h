// NcclCommunicator: the NCCL implementation of Communicator for one tensor- or pipeline-parallel
// group. The group is joined with NCCL's non-blocking initialisation, polled up to a timeout and
// aborted when a peer never arrives, so a missing rank is an error rather than a hang. The unique
// id is exchanged by the caller (warpformer.distributed: mpi4py or a torch.distributed store), so
// no MPI-enabled PyTorch is needed. Groups whose GPUs can map each other's memory also get the
// one-shot peer all-reduce (csrc/core/peer_allreduce.h) for messages up to 1 MiB.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "csrc/core/communicator.h"
#include "csrc/core/peer_allreduce.h"

namespace warpformer {

// Which implementation an all-reduce uses: kAuto takes the peer path when the group has it and
// the message fits, NCCL otherwise.
enum class AllReducePath { kAuto, kNccl, kPeer };

class NcclCommunicator final : public Communicator {
 public:
  static constexpr size_t kIdBytes = sizeof(ncclUniqueId);
  static std::array<char, sizeof(ncclUniqueId)> new_unique_id();

  // Joins the group on `device` (this thread's current device is restored afterwards); with
  // peer_allreduce the group sets up the one-shot NVLink all-reduce where every rank can
  // (PeerAllReduce::create).
  NcclCommunicator(const std::array<char, sizeof(ncclUniqueId)>& id, int world_size, int rank,
                   int device, double timeout_s, bool peer_allreduce = true);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  void all_reduce_sum(void* data, int64_t count, DType dtype, cudaStream_t stream) override {
    all_reduce_sum(data, count, dtype, stream, AllReducePath::kAuto);
  }
  // kPeer throws when the group has no peer path or the message does not fit it.
  void all_reduce_sum(void* data, int64_t count, DType dtype, cudaStream_t stream,
                      AllReducePath path);
  // Whether the group set up the peer all-reduce, and if not, why.
  bool has_peer_all_reduce() const { return peer_ != nullptr; }
  const std::string& peer_all_reduce_reason() const { return peer_reason_; }
  // recv = [rank 0's send | rank 1's send | ...], count elements from each rank.
  void all_gather(const void* send, void* recv, int64_t count, DType dtype,
                  cudaStream_t stream) override;
  void broadcast(void* data, int64_t bytes, int root, cudaStream_t stream) override;
  void send(const void* data, int64_t bytes, int peer, cudaStream_t stream) override;
  void recv(void* data, int64_t bytes, int peer, cudaStream_t stream) override;
  void send_recv(const P2pOp* ops, int n, cudaStream_t stream) override;
  // ncclGroupStart / ncclGroupEnd. NCCL's group is per thread: any NCCL call on this thread in
  // between joins it. Inside a group an all-reduce takes NCCL (the peer kernel would run at once,
  // ahead of the group's calls), and kPeer throws.
  void begin_group() override;
  void end_group() override;
  // Aborts the communicator at once (pending operations fail); the object is unusable
  // afterwards. Not while another thread has a group of this communicator open.
  void abort();
  bool aborted() const { return comm_ == nullptr; }

 private:
  // NCCL calls on a non-blocking communicator may return ncclInProgress: wait for completion of
  // the enqueue (bounded by the timeout) and turn errors into exceptions. Inside a group the
  // enqueue happens at ncclGroupEnd, so there it only checks for errors, and throws without
  // aborting (the open group still refers to the communicator; end_group aborts on errors).
  void finish_call(int result, const char* what);

  ncclComm_t comm_ = nullptr;
  int rank_, size_, device_;
  double timeout_s_;
  std::unique_ptr<PeerAllReduce> peer_;
  std::string peer_reason_;
};

}  // namespace warpformer
