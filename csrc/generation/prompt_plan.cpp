#include "csrc/generation/prompt_plan.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "csrc/core/check.h"

namespace warpformer {
namespace generation {

std::vector<PrefillGroup> plan_prefill_groups(const std::vector<int32_t>& lengths,
                                              int64_t group_tokens) {
  int64_t total = 0;
  for (int32_t l : lengths) total += l;
  // Each group is closed once it reaches total / groups tokens (or when the next sequence would
  // take it over the size).
  const int64_t size = group_tokens;
  const int64_t n = total / size + (total % size != 0);
  const int64_t target = total / n + (total % n != 0);
  std::vector<PrefillGroup> groups;
  PrefillGroup g;
  int64_t t = 0;
  auto close = [&](int64_t next_b) {
    g.t1 = t;
    groups.push_back(g);
    g = PrefillGroup{next_b, next_b, t, t, 0};
  };
  const int64_t batch = static_cast<int64_t>(lengths.size());
  for (int64_t b = 0; b < batch; ++b) {
    if (g.b1 > g.b0 && t + lengths[b] - g.t0 > size) close(b);
    g.b1 = b + 1;
    g.max_len = std::max(g.max_len, lengths[b]);
    t += lengths[b];
    if (t - g.t0 >= target && b + 1 < batch) close(b + 1);
  }
  close(batch);
  return groups;
}

PromptIndex pack_prompt(const std::vector<PrefillGroup>& groups,
                        const std::vector<int32_t>& lengths, const std::vector<int32_t>& past,
                        int64_t seq, int64_t slot_stride, int64_t tokens) {
  const int64_t batch = static_cast<int64_t>(lengths.size());
  const int64_t n_groups = static_cast<int64_t>(groups.size());
  PromptIndex x;
  x.gather = 0;
  x.slot = tokens;
  x.pos = 2 * tokens;
  x.ids = 3 * tokens;
  x.cu = 4 * tokens;
  x.seq_slot = x.cu + batch + n_groups;
  x.last = x.seq_slot + batch;
  x.past = x.last + batch;
  std::vector<int32_t>& host = x.host;
  host.assign(x.past + batch, 0);
  int64_t t = 0;
  for (int64_t gi = 0; gi < n_groups; ++gi) {
    const PrefillGroup& g = groups[gi];
    int32_t* cu = host.data() + x.cu + g.b0 + gi;  // the group's b1 - b0 + 1 entries
    for (int64_t b = g.b0; b < g.b1; ++b) {
      const auto slot = static_cast<int32_t>(b * slot_stride);
      cu[b - g.b0] = static_cast<int32_t>(t - g.t0);
      host[x.seq_slot + b] = slot;
      const int32_t p0 = past.empty() ? 0 : past[b];
      host[x.past + b] = p0;
      for (int32_t i = p0; i < p0 + lengths[b]; ++i, ++t) {
        host[x.gather + t] = static_cast<int32_t>(b * seq + i);
        host[x.slot + t] = slot;
        host[x.pos + t] = i;
      }
      host[x.last + b] = static_cast<int32_t>(t - 1 - g.t0);
    }
    cu[g.b1 - g.b0] = static_cast<int32_t>(t - g.t0);
  }
  for (; t < tokens; ++t) host[x.slot + t] = -1;  // padding: gather 0, position 0, no KV write
  return x;
}

void check_ranks_agree(Communicator* comm, CudaContext& ctx, int32_t value, const char* kind,
                       const char* what, const char* fix) {
  if (comm == nullptr || comm->size() == 1) return;
  const int size = comm->size();
  DeviceBuffer buf(ctx.allocator(), (1 + size) * sizeof(int32_t), ctx.stream());
  auto* d = buf.as<int32_t>();
  WF_CUDA_CHECK(cudaMemcpyAsync(d, &value, sizeof(value), cudaMemcpyHostToDevice, ctx.stream()));
  comm->all_gather(d, d + 1, 1, DType::kFloat32, ctx.stream());  // 4-byte words, bit for bit
  std::vector<int32_t> all(size);
  WF_CUDA_CHECK(cudaMemcpyAsync(all.data(), d + 1, all.size() * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, ctx.stream()));
  WF_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
  for (int r = 0; r < size; ++r) {
    TORCH_CHECK(all[r] == value, "warpformer: the ranks of the ", kind,
                "-parallel group disagree on the ", what, " (", value, " on rank ", comm->rank(),
                ", ", all[r], " on rank ", r, "); ", fix);
  }
}

}  // namespace generation
}  // namespace warpformer
