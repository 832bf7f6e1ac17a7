// Probe: does asking L2 for a weight ahead of its use (cp.async.bulk.prefetch.L2, sm_90) make a
// later streaming read of it faster, how many SMs must issue the prefetch, and how long it takes
// to land. Stand-alone (nvcc -arch=sm_90 -O3 l2_prefetch.cu -o probe && ./probe); prints one
// table: median microseconds of a GEMV-like streaming read (528 blocks, 16-byte __ldcs loads)
// after a flush of L2 and a spin of the given length (a stand-in for the attention kernel),
// with and without a prefetch issued before the spin.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

__global__ void stream_read(const int4* w, int64_t n, float* out) {
  float acc = 0.f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int4 v = __ldcs(w + i);
    acc += __int_as_float(v.x) + __int_as_float(v.y) + __int_as_float(v.z) + __int_as_float(v.w);
  }
  if (acc == 1.2345f) out[0] = acc;  // keeps the loads
}

__global__ void flush(int4* buf, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    buf[i] = make_int4(int(i), 0, 0, 0);
  }
}

__global__ void spin(int64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (static_cast<int64_t>(t - t0) < ns);
}

// Each block asks L2 for its share of [w, w + bytes): one bulk prefetch per `chunk` bytes,
// issued by thread 0 (bulk) or as 128-byte prefetches by every thread (lines).
__global__ void prefetch(const char* w, int64_t bytes, int64_t chunk, bool bulk) {
  const int64_t share = (bytes / gridDim.x + 15) / 16 * 16;
  const int64_t beg = blockIdx.x * share, end = min(bytes, beg + share);
  if (bulk) {
    if (threadIdx.x != 0) return;
    for (int64_t o = beg; o < end; o += chunk) {
      const uint32_t n = static_cast<uint32_t>(min(chunk, end - o));
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + o), "r"(n) : "memory");
    }
  } else {
    for (int64_t o = beg + threadIdx.x * 128; o < end; o += blockDim.x * 128) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(w + o));
    }
  }
}

int main() {
  const int64_t flush_bytes = 256ll << 20;
  int4* fl;
  CHECK(cudaMalloc(&fl, flush_bytes));
  float* out;
  CHECK(cudaMalloc(&out, 4));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  int l2 = 0;
  CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  std::printf("L2 %d bytes\n", l2);
  std::printf("| MB | spin us | prefetch | blocks | chunk KB | read us (median of 15) |\n");
  std::printf("|---:|---:|---|---:|---:|---:|\n");
  for (int64_t mb : {2, 8, 24}) {
    const int64_t bytes = mb << 20;
    char* w;
    CHECK(cudaMalloc(&w, bytes));
    CHECK(cudaMemset(w, 1, bytes));
    struct Case {
      const char* name;
      int blocks;
      int64_t chunk;
      bool bulk;
      int spin_us;
    };
    std::vector<Case> cases = {
        {"none", 0, 0, true, 8},          {"warm (no flush)", 0, 0, true, 8},
        {"bulk", 16, 64 << 10, true, 8},  {"bulk", 16, 1 << 20, true, 8},
        {"bulk", 128, 64 << 10, true, 8}, {"bulk", 528, 64 << 10, true, 8},
        {"bulk", 528, 64 << 10, true, 2}, {"bulk", 528, 64 << 10, true, 4},
        {"lines", 16, 0, false, 8},       {"lines", 528, 0, false, 8},
    };
    for (const Case& c : cases) {
      std::vector<float> t;
      for (int rep = 0; rep < 15; ++rep) {
        const bool warm = c.name[0] == 'w';
        if (!warm) flush<<<528, 256>>>(fl, flush_bytes / 16);
        else stream_read<<<528, 256>>>(reinterpret_cast<const int4*>(w), bytes / 16, out);
        if (c.blocks > 0) prefetch<<<c.blocks, 256>>>(w, bytes, c.chunk, c.bulk);
        spin<<<1, 32>>>(c.spin_us * 1000);
        CHECK(cudaEventRecord(e0));
        stream_read<<<528, 256>>>(reinterpret_cast<const int4*>(w), bytes / 16, out);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        CHECK(cudaGetLastError());
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1000);
      }
      std::sort(t.begin(), t.end());
      std::printf("| %lld | %d | %s | %d | %lld | %.2f |\n", static_cast<long long>(mb), c.spin_us,
                  c.name, c.blocks, static_cast<long long>(c.chunk >> 10), t[t.size() / 2]);
    }
    CHECK(cudaFree(w));
  }
  return 0;
}
