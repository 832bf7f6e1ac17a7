// What every layer call needs besides its weights and buffers.
#pragma once

#include "csrc/core/communicator.h"
#include "csrc/core/cuda_context.h"
#include "csrc/core/dispatch.h"
#include "csrc/core/gemm.h"
#include "csrc/layers/layer_spec.h"

namespace warpformer {
namespace layers {

struct LayerContext {
  const CudaContext* ctx;
  Gemm* gemm;
  Communicator* comm;  // tensor-parallel group or null
  const LayerSpec* spec;
  DType dtype;
};

}  // namespace layers
}  // namespace warpformer
