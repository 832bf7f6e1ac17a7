// GptModel's captured decode steps: a cache of CUDA graphs of decode_step_body keyed by what
// their launches bake (StepKey, gpt_model.h), the policy for when a step is replayed, captured or
// run eagerly, and which sessions share a graph. Greedy sessions of one batch size on one GPU
// share one: their token outputs live in the model's state and are copied to the caller's after
// each decode_step call (sync_out), so a workload of many short generations (LAMBADA: 1-3 tokens
// a batch) replays one graph instead of launching every step eagerly.
// And its captured prompt passes (PromptKey, gpt_model.h): a one-group pass on one GPU over its
// padded token count, shared by prompts of other lengths and contents.
#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

#include "csrc/core/check.h"
#include "csrc/models/gpt/gpt_model.h"
#include "kernels/gemv.h"

namespace warpformer {
namespace gpt {
namespace {

// A decode step is captured into a CUDA graph only when at least this many steps of the session
// remain (the capture's own step included), or when sessions sharing its graph ran this many
// eagerly before. Capturing launches as much as an eager step does, and
// instantiating, uploading and destroying the graph come on top, so a graph replayed once or twice
// costs more than it saves. Same call on an H200, bloom-560m batch 8, 80-token prompts
// (benchmarks/bench_short.py), graphs minus eager per generate() call when the step was captured
// at the third token: 3 new tokens +0.41 ms, 4 +0.32, 8 -0.07, 10 -0.24, 16 -0.77: break-even at
// about 5 remaining steps.
constexpr int64_t kMinGraphSteps = 6;

// Destroys and removes the graphs `which` selects. (Destroying an executable graph still in
// flight frees it when it completes.)
template <typename Graphs, typename Which>
void drop_graphs_if(Graphs* graphs, Which which) {
  for (auto it = graphs->begin(); it != graphs->end();) {
    if (which(*it)) {
      if (it->exec != nullptr) cudaGraphExecDestroy(it->exec);
      it = graphs->erase(it);
    } else {
      ++it;
    }
  }
}

// The graph of `key` in `graphs` (StepGraph or PromptGraph entries), added if missing; graphs of
// another generation are dropped first (they bake buffers that are gone and can never run
// again), and the least recently used one when `limit` are held.
template <typename Graph, typename Key>
Graph& find_or_add(std::vector<Graph>* graphs, const Key& key, uint64_t* clock, size_t limit) {
  ++*clock;
  drop_graphs_if(graphs, [&](const Graph& g) { return g.key.generation != key.generation; });
  for (Graph& g : *graphs) {
    if (g.key == key) {
      g.used = *clock;
      return g;
    }
  }
  if (graphs->size() >= limit) {
    const uint64_t oldest =
        std::min_element(graphs->begin(), graphs->end(), [](const Graph& a, const Graph& b) {
          return a.used < b.used;
        })->used;
    drop_graphs_if(graphs, [&](const Graph& g) { return g.used == oldest; });
  }
  Graph g;
  g.key = key;
  g.used = *clock;
  graphs->push_back(g);
  return graphs->back();
}

}  // namespace

// Shared only where the state layout depends on nothing but the key (greedy: no token counts)
// and on one GPU: tensor-parallel ranks must capture and replay their NCCL calls together,
// which a graph outliving its session could not promise (each rank's buffers grow on its own
// schedule), and a graph must not outlive the communicator it baked.
bool GptModel::shares_step_graph(const DecodeOptions& opt) const {
  return opt.greedy && !opt.needs_counts && opt.beam_width == 1 && pp_comm_ == nullptr &&
         (comm_ == nullptr || comm_->size() == 1);
}

GptModel::StepKey GptModel::step_key() const {
  const Session& s = session_;
  StepKey k;
  k.serial = s.shared ? 0 : s.serial;
  k.rows = s.rows;
  k.batch = s.batch;
  k.state = state_.data();
  k.generation = graph_generation();
  return k;
}

GptModel::StepGraph& GptModel::step_graph(const StepKey& key) {
  return find_or_add(&step_graphs_, key, &step_clock_, kMaxStepGraphs);
}

void GptModel::drop_graphs(bool unshared_only) {
  drop_graphs_if(&step_graphs_,
                 [&](const StepGraph& g) { return !unshared_only || g.key.serial != 0; });
  if (!unshared_only) drop_graphs_if(&prompt_graphs_, [](const PromptGraph&) { return true; });
}

// One decode step after the first token. Tensor parallelism is captured too (NCCL collectives are
// graph-capturable, and every rank makes the same choices); pipeline stages run eagerly, their
// send/recv pairs ordered by the host. Without a graph for the step's key yet, the step runs
// eagerly when nothing ran under the key before (the session's first step plans the GEMMs, and
// may grow their workspace, which a capture cannot) or when the graph would not be replayed
// often enough to repay its capture (kMinGraphSteps: counting this session's remaining steps, or
// the eager steps that sessions sharing the key ran before).
void GptModel::run_step() {
  Session& s = session_;
  if (!options_.cuda_graphs || pp_comm_ != nullptr) {
    decode_step_body();
    return;
  }
  StepGraph& g = step_graph(step_key());
  if (g.failed) {
    decode_step_body();
    return;
  }
  if (g.exec == nullptr) {
    const bool planned = s.steps_done > 1 || g.eager_steps > 0;
    const bool repays =
        s.output_len - s.steps_done >= kMinGraphSteps || g.eager_steps >= kMinGraphSteps;
    if (!planned || !repays) {
      decode_step_body();
      ++g.eager_steps;
      return;
    }
    g.exec = capture([this] { decode_step_body(); }, "decode step");
    if (g.exec == nullptr) {
      g.failed = true;  // not retried by later sessions under this key
      decode_step_body();
      return;
    }
  }
  WF_CUDA_CHECK(cudaGraphLaunch(g.exec, ctx_->stream()));
}

void GptModel::sync_out() {
  Session& s = session_;
  cudaStream_t stream = ctx_->stream();
  const size_t row = s.total * sizeof(int32_t);
  WF_CUDA_CHECK(cudaMemcpy2DAsync(s.out.output_ids, row, s.ids, s.ids_stride * sizeof(int32_t), row,
                                  s.rows, cudaMemcpyDeviceToDevice, stream));
  WF_CUDA_CHECK(cudaMemcpyAsync(s.out.sequence_lengths, s.lengths, s.rows * sizeof(int32_t),
                                cudaMemcpyDeviceToDevice, stream));
}

// Null when the work could not be captured; the caller then marks its key failed, so neither
// this call nor a later one under the key tries again.
cudaGraphExec_t GptModel::capture(const std::function<void()>& body, const char* what) {
  cudaStream_t stream = ctx_->stream();
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
                    " could not be captured in a CUDA graph; "
                    "running it without graphs");
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

int64_t GptModel::prompt_graph_tokens(int64_t tokens) const {
  // One GPU only: tensor-parallel ranks would have to capture and replay their collectives
  // together, and pipeline stages exchange each group with send/recv ordered by the host. Up to
  // kGemvMaxRows tokens the products run on the GEMV path, which padding would change.
  if (!options_.cuda_graphs || cfg_.tensor_para_size != 1 || cfg_.pipeline_para_size != 1 ||
      tokens <= kernels::kGemvMaxRows) {
    return 0;
  }
  const int64_t step = tokens <= 128 ? 16 : 64;
  return (tokens + step - 1) / step * step;
}

// The eager pass of a key comes first for the reason decode steps' does (gpt_decode.cpp): it
// plans the products of the padded row count; a capture could not grow their workspace.
void GptModel::run_prompt(int64_t tokens, int64_t seq, const layers::AttentionInputs& ai) {
  auto body = [&] { prompt_body(0, tokens, seq, ai); };
  PromptKey key;
  key.tokens = tokens;
  key.batch = ai.batch;
  key.max_seqlen = ai.max_seqlen;
  key.meta = meta_.data();
  key.generation = graph_generation();
  PromptGraph& g = find_or_add(&prompt_graphs_, key, &prompt_clock_, kMaxPromptGraphs);
  if (g.failed) {
    body();
    return;
  }
  if (g.exec == nullptr) {
    if (g.eager_runs == 0) {
      body();
      ++g.eager_runs;
      return;
    }
    g.exec = capture(body, "prompt pass");
    if (g.exec == nullptr) {
      g.failed = true;
      body();
      return;
    }
  }
  WF_CUDA_CHECK(cudaGraphLaunch(g.exec, ctx_->stream()));
  ++prompt_replays_;
}

}  // namespace gpt
}  // namespace warpformer
