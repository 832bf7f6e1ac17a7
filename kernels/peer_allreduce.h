// One-shot all-reduce over peer-to-peer memory (NVLink) for decode-sized messages, where NCCL's
// ring/tree protocols spend most of their time in synchronisation rather than in moving bytes.
//
// Every rank owns one exchange buffer that all ranks of the group have mapped (CUDA IPC; set up
// by csrc/core/peer_allreduce.cpp). One call, with G blocks on every rank:
//   1. block b copies its slice of the local input into slot b of its own buffer;
//   2. it raises flag (b, my rank) on every rank to this call's sequence number;
//   3. it waits until flags (b, r) of its own buffer reach that number for every rank r;
//   4. it reads slice b from every rank's buffer, sums in fp32 in rank order 0..n-1 and writes
//      the result over the input.
// All ranks therefore compute bit-identical sums. Slots alternate between two halves of the
// buffer on odd and even sequence numbers: a rank can only reuse a half after every peer has
// signalled the following call, i.e. after each of them finished reading it, so no end-of-call
// barrier is needed. The sequence numbers live in device memory (one per block) and advance in
// the kernel, so a call captured in a CUDA graph stays correct across replays.
//
// A wait that exceeds `timeout_ns` (a peer died or stopped calling) prints which rank it waited
// for and traps, which fails the process's CUDA context instead of hanging forever.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace warpformer {
namespace kernels {

constexpr int kPeerMaxRanks = 8;
constexpr int kPeerMaxBlocks = 32;
constexpr int64_t kPeerSlotBytes = 32 * 1024;  // one block's slice per call, at most
// The largest message (bytes) a call can carry: every block slot full.
constexpr int64_t kPeerMaxBytes = kPeerMaxBlocks * kPeerSlotBytes;
// Layout of each rank's exchange buffer: flags, then two halves of kPeerMaxBlocks slots.
constexpr int64_t kPeerFlagBytes = kPeerMaxBlocks * kPeerMaxRanks * sizeof(uint32_t);
constexpr int64_t kPeerDataOffset = 4096;
constexpr int64_t kPeerBufferBytes = kPeerDataOffset + 2 * kPeerMaxBytes;
static_assert(kPeerFlagBytes <= kPeerDataOffset, "flags overlap the data slots");

// T: float, __half or __nv_bfloat16.
template <typename T>
struct PeerAllReduceParams {
  T* data = nullptr;  // [count] elements, 16-byte aligned; summed in place
  int64_t count = 0;
  char* buffers[kPeerMaxRanks] = {};  // every rank's exchange buffer, as mapped here
  uint32_t* sequence = nullptr;       // [kPeerMaxBlocks] this rank's call counters (device memory)
  int rank = 0, ranks = 0;
  uint64_t timeout_ns = 0;
  // Let the next kernel on the stream be scheduled as soon as every block is running (common.cuh,
  // start_next_kernel) instead of when the call ends: a decode step's next kernel is a GEMV that
  // then streams its first weights while this call still waits for its peers.
  bool start_next_early = false;
};

// Messages up to this size start the next kernel early when PeerAllReduce allows it: two rows of
// a decode step up to 8,192 wide in fp32. A prefill's all-reduce, ahead of cuBLASLt products,
// is larger unless the prompt is a few tokens; then the early start may cost a little time,
// never correctness (the next kernel still waits for this one before touching its output).
constexpr int64_t kPeerEarlyStartBytes = 64 * 1024;

// True when one call can carry the message: 16-byte aligned data, at most kPeerMaxBytes.
template <typename T>
bool peer_allreduce_supported(const PeerAllReduceParams<T>& p);

// Launches the call on `stream` (every rank must make the same sequence of calls with the same
// counts). cudaErrorInvalidValue when peer_allreduce_supported() is false.
template <typename T>
cudaError_t launch_peer_allreduce(const PeerAllReduceParams<T>& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace warpformer
