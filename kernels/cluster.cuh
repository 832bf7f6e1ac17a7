// Thread-block cluster primitives (sm_90): addresses in another block's shared memory, the
// cluster barrier, and a transaction barrier (mbarrier) that counts bytes stored into a block's
// shared memory by the other blocks of its cluster (st.async). The [k, n] GEMV's k-split adds
// its partial sums with them (gemv.cu): every block arrives at the cluster barrier when it
// starts, rank 0 initialises a transaction barrier expecting the other ranks' sums, and after
// the products those ranks wait on the cluster barrier once (so rank 0's barrier is initialised)
// and store their sums into rank 0's shared memory, while rank 0 waits for the bytes. Defined only
// when compiling for sm_90 or newer; callers guard their use alike.
#pragma once

#include <cstdint>

#include "kernels/common.cuh"

namespace warpformer {
namespace kernels {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// A shared-memory address of this block as the same variable's address in cluster rank `rank`.
__device__ __forceinline__ uint32_t cluster_rank_addr(uint32_t local, unsigned rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

// One thread, before any other thread uses the barrier: a barrier of one arrival (this one) that
// also expects `bytes` of asynchronous stores (st.async) before its first phase completes.
__device__ __forceinline__ void init_tx_barrier(uint64_t* bar, uint32_t bytes) {
  const uint32_t a = shared_addr(bar);
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

// Stores v at cluster address `dst`, counted against the barrier at cluster address `bar`.
__device__ __forceinline__ void store_to_rank(uint32_t dst, float v, uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(dst),
      "f"(v), "r"(bar)
      : "memory");
}

// Waits until the barrier's first phase completes: every expected byte has landed. The wait
// acquires at cluster scope, as the PTX memory model asks for the other blocks' st.async (whose
// complete_tx releases at cluster scope) to be ordered before this block's reads of what they
// stored. (CUTLASS's cluster barrier waits with the default .cta scope; the .cluster form adds an
// L1 invalidation after the wait, CCTL.IVALL, which the GEMV's epilogue does not notice: its
// global reads were not in L1.)
__device__ __forceinline__ void wait_tx_barrier(uint64_t* bar) {
  const uint32_t a = shared_addr(bar);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(a)
        : "memory");
  }
}
#endif

}  // namespace kernels
}  // namespace warpformer
