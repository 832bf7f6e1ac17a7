// torch.classes.warpformer.NcclComm: one NCCL group member, created by warpformer.distributed
// after it exchanged the unique id (mpi4py or a torch.distributed store) and attached to models.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include <memory>
#include <string>
#include <vector>

#include "csrc/core/nccl_comm.h"

namespace warpformer {

class NcclCommHolder : public torch::CustomClassHolder {
 public:
  // unique_id: uint8 [128] from nccl_unique_id() on the group's first rank. peer_allreduce:
  // whether this rank offers the one-shot NVLink all-reduce (the group uses it only if every
  // rank does; warpformer.GPT.from_pretrained's peer_allreduce).
  NcclCommHolder(const at::Tensor& unique_id, int64_t world_size, int64_t rank, int64_t device,
                 double timeout_s, bool peer_allreduce = true);
  int64_t rank() const { return comm_->rank(); }
  int64_t size() const { return comm_->size(); }
  int64_t device() const { return comm_->device(); }
  // In-place sum over the group on the current stream (for tests and users). path: "auto" (the
  // peer all-reduce when the group has it and t fits, else NCCL), "nccl" or "peer".
  at::Tensor all_reduce_(at::Tensor t, const std::string& path);
  // In-place sums of every tensor of ts, each taken as all_reduce_ takes it, issued as one NCCL
  // group (one launch for all of them). Inside a group the sums take NCCL: path "auto" and
  // "nccl" alike; "peer" is refused. Every tensor is checked before any is issued.
  std::vector<at::Tensor> all_reduce_group_(std::vector<at::Tensor> ts, const std::string& path);
  // Whether the group set up the one-shot peer all-reduce; the reason when it did not.
  bool peer_all_reduce() const { return comm_->has_peer_all_reduce(); }
  std::string peer_all_reduce_reason() const { return comm_->peer_all_reduce_reason(); }
  // Returns once every rank has called it (an all-reduce of one value, then a stream sync).
  void barrier();
  void abort() { comm_->abort(); }
  NcclCommunicator* get() const { return comm_.get(); }

 private:
  // Checks t as the tensor argument `what` of op and returns its dtype.
  DType check_tensor(const at::Tensor& t, const char* op, const char* what) const;

  std::shared_ptr<NcclCommunicator> comm_;
};

}  // namespace warpformer
