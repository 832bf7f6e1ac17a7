// The collective operations a tensor-parallel layer needs. A model holds a Communicator* for its
// tensor-parallel group; at tensor_para_size 1 it is null and the all-reduce hook does nothing.
// csrc/core/nccl_comm.h implements it over NCCL.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "csrc/core/dispatch.h"

namespace warpformer {

// One point-to-point transfer of a grouped send_recv call.
struct P2pOp {
  bool send;  // true: send `bytes` from data to peer; false: receive them into data
  void* data;
  int64_t bytes;
  int peer;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place sum over the group of `count` elements of `dtype`, ordered on `stream`.
  virtual void all_reduce_sum(void* data, int64_t count, DType dtype, cudaStream_t stream) = 0;
  // recv = the `count` elements of every rank's send, in rank order.
  virtual void all_gather(const void* send, void* recv, int64_t count, DType dtype,
                          cudaStream_t stream) = 0;
  // Bytes from `root` to every rank.
  virtual void broadcast(void* data, int64_t bytes, int root, cudaStream_t stream) = 0;
  virtual void send(const void* data, int64_t bytes, int peer, cudaStream_t stream) = 0;
  virtual void recv(void* data, int64_t bytes, int peer, cudaStream_t stream) = 0;
  // The n transfers as one group: they progress together, so ranks whose sends and receives
  // form a ring (each sends to one neighbour while receiving from another) cannot deadlock.
  virtual void send_recv(const P2pOp* ops, int n, cudaStream_t stream) = 0;
  // The calls between begin_group and end_group are issued together at end_group, so NCCL fuses
  // them into one launch. NCCL's group is per thread: every NCCL call of the thread in between
  // joins it, another communicator's too, and end_group waits only for this one's; so make only
  // this communicator's calls inside. They are only enqueued until end_group: nothing in between
  // may wait for one of them (stream sync, host read of its result). Groups nest. end_group
  // reports the errors of the whole group. No-ops where there is nothing to fuse.
  virtual void begin_group() {}
  virtual void end_group() {}
};

// A group of calls on `comm` (null: none) for the enclosing scope. Call end() on the normal path:
// it closes the group and reports its errors. A scope left by an exception only closes the group
// (an open group would swallow the thread's later calls) and drops that second error, since the
// first one is already on its way.
class GroupScope {
 public:
  explicit GroupScope(Communicator* comm) : comm_(comm) {
    if (comm_ != nullptr) comm_->begin_group();
  }
  ~GroupScope() {
    if (comm_ == nullptr) return;
    try {
      comm_->end_group();
    } catch (...) {
    }
  }
  void end() {
    Communicator* c = comm_;
    comm_ = nullptr;
    if (c != nullptr) c->end_group();
  }
  GroupScope(const GroupScope&) = delete;
  GroupScope& operator=(const GroupScope&) = delete;

 private:
  Communicator* comm_;
};

// Sum `data` over the group when there is one (size > 1); a no-op otherwise.
inline void all_reduce_if_parallel(Communicator* comm, void* data, int64_t count, DType dtype,
                                   cudaStream_t stream) {
  if (comm != nullptr && comm->size() > 1) comm->all_reduce_sum(data, count, dtype, stream);
}

}  // namespace warpformer
