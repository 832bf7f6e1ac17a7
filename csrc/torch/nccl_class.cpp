#include "csrc/torch/nccl_class.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <cstring>
#include <string>

#include "csrc/torch/ops.h"
#include "csrc/torch/tensor_utils.h"

namespace warpformer {

NcclCommHolder::NcclCommHolder(const at::Tensor& unique_id, int64_t world_size, int64_t rank,
                               int64_t device, double timeout_s, bool peer_allreduce) {
  const char* op = "NcclComm";
  check_dtype(unique_id, at::kByte, op, "unique_id");
  TORCH_CHECK(unique_id.numel() == static_cast<int64_t>(NcclCommunicator::kIdBytes), op,
              ": unique_id must have ", NcclCommunicator::kIdBytes,
              " bytes (from "
              "nccl_unique_id()), got ",
              unique_id.numel());
  TORCH_CHECK(device >= 0 && device < c10::cuda::device_count(), op, ": device ", device,
              " is not a visible CUDA device (", c10::cuda::device_count(), " visible)");
  const at::Tensor id = unique_id.to(at::kCPU).contiguous();
  std::array<char, NcclCommunicator::kIdBytes> bytes{};
  std::memcpy(bytes.data(), id.data_ptr(), bytes.size());
  comm_ = std::make_shared<NcclCommunicator>(bytes, static_cast<int>(world_size),
                                             static_cast<int>(rank), static_cast<int>(device),
                                             timeout_s, peer_allreduce);
}

namespace {

AllReducePath parse_path(const std::string& path, const char* op) {
  if (path == "nccl") return AllReducePath::kNccl;
  if (path == "peer") return AllReducePath::kPeer;
  TORCH_CHECK(path == "auto", op, ": path must be 'auto', 'nccl' or 'peer', got '", path, "'");
  return AllReducePath::kAuto;
}

}  // namespace

DType NcclCommHolder::check_tensor(const at::Tensor& t, const char* op, const char* what) const {
  check_floating(t, op, what);
  check_contiguous(t, op, what);
  check_cuda(t, op, what);
  TORCH_CHECK(t.device().index() == comm_->device(), op, ": ", what, " is on ", t.device(),
              " but the communicator is on cuda:", comm_->device());
  return to_dtype(t.scalar_type(), op, what);
}

at::Tensor NcclCommHolder::all_reduce_(at::Tensor t, const std::string& path) {
  const char* op = "NcclComm.all_reduce_";
  const AllReducePath how = parse_path(path, op);
  const DType dtype = check_tensor(t, op, "t");
  const c10::cuda::CUDAGuard guard(t.device());
  comm_->all_reduce_sum(t.data_ptr(), t.numel(), dtype, current_stream(t), how);
  return t;
}

std::vector<at::Tensor> NcclCommHolder::all_reduce_group_(std::vector<at::Tensor> ts,
                                                          const std::string& path) {
  const char* op = "NcclComm.all_reduce_group_";
  const AllReducePath how = parse_path(path, op);
  std::vector<DType> dtypes;
  dtypes.reserve(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string what = "ts[" + std::to_string(i) + "]";
    dtypes.push_back(check_tensor(ts[i], op, what.c_str()));
  }
  if (ts.empty()) return ts;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(comm_->device()));
  const cudaStream_t stream = current_stream(ts[0]);
  GroupScope group(comm_.get());
  for (size_t i = 0; i < ts.size(); ++i) {
    comm_->all_reduce_sum(ts[i].data_ptr(), ts[i].numel(), dtypes[i], stream, how);
  }
  group.end();
  return ts;
}

void NcclCommHolder::barrier() {
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(comm_->device()));
  at::Tensor one = at::ones({1}, at::TensorOptions().device(at::kCUDA, comm_->device()));
  all_reduce_(one, "auto");
  c10::cuda::getCurrentCUDAStream(comm_->device()).synchronize();
}

namespace ops {

at::Tensor nccl_unique_id() {
  const auto id = NcclCommunicator::new_unique_id();
  at::Tensor out =
      at::empty({static_cast<int64_t>(id.size())}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(out.data_ptr(), id.data(), id.size());
  return out;
}

}  // namespace ops
}  // namespace warpformer
