#include "csrc/generation/graph_cache.h"

#include <c10/util/Exception.h>

namespace warpformer {
namespace generation {

cudaGraphExec_t capture_graph(cudaStream_t stream, const std::function<void()>& body,
                              const char* what) {
  cudaGraph_t graph = nullptr;
  const cudaError_t begin = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (begin != cudaSuccess) {
    (void)cudaGetLastError();
    TORCH_WARN_ONCE("warpformer: cannot capture the ", what, " in a CUDA graph (",
                    cudaGetErrorString(begin), "); running it without graphs");
    return nullptr;
  }
  try {
    body();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    TORCH_WARN_ONCE("warpformer: the ", what,
                    " could not be captured in a CUDA graph; running it without graphs");
    return nullptr;
  }
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  cudaGraphExec_t exec = nullptr;
  if (end != cudaSuccess || graph == nullptr ||
      cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    exec = nullptr;
    TORCH_WARN_ONCE("warpformer: CUDA graph capture of the ", what, " failed (",
                    cudaGetErrorString(end), "); running it without graphs");
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  return exec;
}

}  // namespace generation
}  // namespace warpformer
