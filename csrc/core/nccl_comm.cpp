#include "csrc/core/nccl_comm.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "csrc/core/check.h"
#include "csrc/core/cuda_context.h"
#include "kernels/peer_allreduce.h"

namespace warpformer {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
  }
  TORCH_INTERNAL_ASSERT(false, "bad DType");
}

// Open ncclGroupStart calls on this thread (NCCL keeps its group state per thread).
thread_local int t_group_depth = 0;

}  // namespace

std::array<char, sizeof(ncclUniqueId)> NcclCommunicator::new_unique_id() {
  ncclUniqueId id;
  WF_NCCL_CHECK(ncclGetUniqueId(&id));
  std::array<char, sizeof(ncclUniqueId)> out{};
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

NcclCommunicator::NcclCommunicator(const std::array<char, sizeof(ncclUniqueId)>& id, int world_size,
                                   int rank, int device, double timeout_s, bool peer_allreduce)
    : rank_(rank), size_(world_size), device_(device), timeout_s_(timeout_s) {
  TORCH_CHECK(world_size >= 1, "NcclComm: world_size must be >= 1, got ", world_size);
  TORCH_CHECK(rank >= 0 && rank < world_size, "NcclComm: rank must be in [0, ", world_size,
              "), got ", rank);
  TORCH_CHECK(timeout_s > 0, "NcclComm: timeout_s must be positive, got ", timeout_s);
  DeviceScope scope(device);
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommInitRankConfig(&comm_, world_size, uid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    WF_NCCL_CHECK(r);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  ncclResult_t state = ncclInProgress;
  while (true) {
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) state = q;
    if (state != ncclInProgress) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      TORCH_CHECK(false, "NcclComm: rank ", rank, " of ", world_size, " timed out after ",
                  timeout_s,
                  " s waiting for the other ranks to join the NCCL group (a rank "
                  "failed or never started); aborted");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (state != ncclSuccess) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    WF_NCCL_CHECK(state);
  }
  if (world_size > 1) {
    try {
      peer_ = PeerAllReduce::create(*this, device, timeout_s, peer_allreduce, &peer_reason_);
    } catch (...) {
      abort();
      throw;
    }
  } else {
    peer_reason_ = "a group of one rank needs no all-reduce";
  }
}

NcclCommunicator::~NcclCommunicator() {
  peer_.reset();
  if (comm_ != nullptr) {
    // Finalize is a collective; destruction must not block on absent peers, so abort instead.
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

void NcclCommunicator::finish_call(int result, const char* what) {
  auto r = static_cast<ncclResult_t>(result);
  if (t_group_depth > 0) {
    TORCH_CHECK(r == ncclSuccess || r == ncclInProgress, "NcclComm: ", what, " failed on rank ",
                rank_, " inside a group: ", nccl_result_string(static_cast<int>(r)));
    return;
  }
  if (r == ncclInProgress) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    do {
      if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
      if (r != ncclInProgress) break;
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        TORCH_CHECK(false, "NcclComm: ", what, " on rank ", rank_, " did not complete within ",
                    timeout_s_, " s; communicator aborted");
      }
      std::this_thread::yield();
    } while (true);
  }
  if (r != ncclSuccess) {
    abort();
    TORCH_CHECK(false, "NcclComm: ", what, " failed on rank ", rank_, ": ",
                nccl_result_string(static_cast<int>(r)));
  }
}

void NcclCommunicator::all_reduce_sum(void* data, int64_t count, DType dtype, cudaStream_t stream,
                                      AllReducePath path) {
  TORCH_CHECK(comm_ != nullptr, "NcclComm: the communicator was aborted");
  if (path == AllReducePath::kPeer) {
    TORCH_CHECK(t_group_depth == 0,
                "NcclComm: all_reduce path 'peer' cannot join a group of "
                "NCCL calls");
    TORCH_CHECK(peer_ != nullptr,
                "NcclComm: all_reduce path 'peer' is not available in this "
                "group (",
                peer_reason_, ")");
    TORCH_CHECK(peer_->supports(data, count, dtype),
                "NcclComm: all_reduce path 'peer' takes "
                "16-byte aligned messages of at most ",
                kernels::kPeerMaxBytes, " bytes; got ", count, " elements of ", dtype_name(dtype));
  }
  if (path != AllReducePath::kNccl && t_group_depth == 0 && peer_ != nullptr &&
      peer_->run(data, count, dtype, stream)) {
    return;
  }
  finish_call(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(dtype), ncclSum,
                            comm_, stream),
              "all_reduce");
}

void NcclCommunicator::all_gather(const void* send, void* recv, int64_t count, DType dtype,
                                  cudaStream_t stream) {
  TORCH_CHECK(comm_ != nullptr, "NcclComm: the communicator was aborted");
  finish_call(
      ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(dtype), comm_, stream),
      "all_gather");
}

void NcclCommunicator::broadcast(void* data, int64_t bytes, int root, cudaStream_t stream) {
  TORCH_CHECK(comm_ != nullptr, "NcclComm: the communicator was aborted");
  finish_call(ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclInt8, root, comm_, stream),
              "broadcast");
}

void NcclCommunicator::send(const void* data, int64_t bytes, int peer, cudaStream_t stream) {
  TORCH_CHECK(comm_ != nullptr, "NcclComm: the communicator was aborted");
  finish_call(ncclSend(data, static_cast<size_t>(bytes), ncclInt8, peer, comm_, stream), "send");
}

void NcclCommunicator::recv(void* data, int64_t bytes, int peer, cudaStream_t stream) {
  TORCH_CHECK(comm_ != nullptr, "NcclComm: the communicator was aborted");
  finish_call(ncclRecv(data, static_cast<size_t>(bytes), ncclInt8, peer, comm_, stream), "recv");
}

void NcclCommunicator::send_recv(const P2pOp* ops, int n, cudaStream_t stream) {
  TORCH_CHECK(comm_ != nullptr, "NcclComm: the communicator was aborted");
  if (n == 0) return;
  const bool outermost = t_group_depth == 0;
  try {
    GroupScope group(this);
    for (int i = 0; i < n; ++i) {
      const P2pOp& op = ops[i];
      if (op.send) {
        send(op.data, op.bytes, op.peer, stream);
      } else {
        recv(op.data, op.bytes, op.peer, stream);
      }
    }
    group.end();
  } catch (...) {
    // A transfer that failed to enqueue leaves its peer's matching call waiting: nothing on this
    // communicator can complete any more. The scope has closed the group by now; inside an outer
    // group the communicator stays until that group's end_group reports the error.
    if (outermost) abort();
    throw;
  }
}

void NcclCommunicator::begin_group() {
  TORCH_CHECK(comm_ != nullptr, "NcclComm: the communicator was aborted");
  const ncclResult_t r = ncclGroupStart();
  TORCH_CHECK(r == ncclSuccess, "NcclComm: ncclGroupStart failed on rank ", rank_, ": ",
              nccl_result_string(static_cast<int>(r)));
  ++t_group_depth;
}

void NcclCommunicator::end_group() {
  TORCH_CHECK(t_group_depth > 0, "NcclComm: end_group without a matching begin_group");
  --t_group_depth;
  const ncclResult_t r = ncclGroupEnd();
  TORCH_CHECK(comm_ != nullptr, "NcclComm: the communicator was aborted inside a group");
  // At the outermost end this waits for the enqueue and aborts on errors, as a single call does.
  finish_call(r, "ncclGroupEnd (grouped calls)");
}

void NcclCommunicator::abort() {
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

}  // namespace warpformer
