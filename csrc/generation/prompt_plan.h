// The prompt pass's plan, model-agnostic: a batch's sequences cut into groups of whole
// sequences that run through the layers together (so activations are sized for one group), and
// the packed index arrays of the pass (padding-free: sequence b's tokens follow b - 1's).
#pragma once

#include <cstdint>
#include <vector>

#include "csrc/core/communicator.h"
#include "csrc/core/cuda_context.h"

namespace warpformer {
namespace generation {

// A group of the prompt pass: sequences [b0, b1), packed tokens [t0, t1).
struct PrefillGroup {
  int64_t b0 = 0, b1 = 0, t0 = 0, t1 = 0;
  int32_t max_len = 0;
  int64_t tokens() const { return t1 - t0; }
};

// As few groups as `group_tokens` allows, of about equal size (none over it unless one sequence
// is).
std::vector<PrefillGroup> plan_prefill_groups(const std::vector<int32_t>& lengths,
                                              int64_t group_tokens);

// The host index arrays of a pass over `tokens` packed tokens (>= the real ones; the rest is
// padding: token id 0 at position 0 with its KV write skipped, slot -1), one int32 vector
// uploaded in one copy; the fields are offsets into it.
struct PromptIndex {
  std::vector<int32_t> host;
  size_t gather;    // [tokens] packed token -> b * seq + position (the ids' place in [batch, seq])
  size_t slot;      // [tokens] KV slot of each token (sequence b: b * slot_stride)
  size_t pos;       // [tokens] position of each token
  size_t ids;       // [tokens] room for the packed ids (gathered on the device)
  size_t cu;        // [batch + groups] per group, its sequences' starts (from its t0) and end
  size_t seq_slot;  // [batch] KV slot of each sequence
  size_t last;      // [batch] each sequence's last token, counted from its group's t0
  size_t past;      // [batch] positions of each sequence already in its KV slot
};
// `lengths` are the tokens each sequence runs (groups were planned on them); `past` (empty: all
// 0) the positions its slot already holds: sequence b runs ids[b, past[b] : past[b] + lengths[b]]
// at those positions (an interactive session's next turn).
PromptIndex pack_prompt(const std::vector<PrefillGroup>& groups,
                        const std::vector<int32_t>& lengths, const std::vector<int32_t>& past,
                        int64_t seq, int64_t slot_stride, int64_t tokens);

// Refuses a group whose ranks disagree on `value` (a size every rank's collectives depend on,
// e.g. the prefill group size); `kind` and `what` name the group and the value in the error.
// `fix` says what the user should do.
void check_ranks_agree(Communicator* comm, CudaContext& ctx, int32_t value, const char* kind,
                       const char* what, const char* fix);

}  // namespace generation
}  // namespace warpformer
