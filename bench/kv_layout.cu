// How fast the decode attention's KV reads can go, by layout (docs/cuda-decode.md):
// each warp streams 16-key tiles of one KV head through a two-stage cp.async ring, as
// the tensor-core attention does, and only touches the bytes. Layouts of a 16-slot block:
//   slot-major [slot][kv_head][dim] (the engine's cache): a head's 16 keys are 128-byte pieces
//     kv_heads · head_dim bytes apart;
//   head-major [kv_head][slot][dim]: a head's 16 keys are one contiguous 2 KB piece.
// Rows own consecutive blocks; each launch reads another layer's copy (8 layers, past L2).
// Prints µs a launch and GB/s beside the 4.26 TB/s copy ceiling. Usage: tailserve-bench-kv-layout
#include <cuda_pipeline_primitives.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "worker/backends/cuda/cuda_check.h"

namespace {

constexpr int kKeys = 16, kHeadDim = 128, kKvHeads = 8, kBlock = 16, kLayers = 8;
constexpr int kRowBytes = kHeadDim + 16;  // the attention's padded stage rows

template <bool kHeadMajor, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) ReadKv(const uint8_t* k, const uint8_t* v, int keys, int blocks_per_row,
                                                      unsigned* sink) {
  extern __shared__ __align__(16) uint8_t smem[];  // [kWarps][2 stages][K, V][kKeys * kRowBytes]
  auto stage = reinterpret_cast<uint8_t(*)[2][2][kKeys * kRowBytes]>(smem);
  const int row = blockIdx.x, head = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  auto at = [&](int key) {  // byte offset of (row, key, head) in a layer
    const int64_t block = static_cast<int64_t>(row) * blocks_per_row + key / kBlock, slot = key % kBlock;
    return kHeadMajor ? ((block * kKvHeads + head) * kBlock + slot) * kHeadDim
                      : ((block * kBlock + slot) * kKvHeads + head) * kHeadDim;
  };
  auto issue = [&](int t0, int s) {
#pragma unroll
    for (int i = 0; i < kKeys * kHeadDim / 16 / 32; ++i) {
      const int piece = lane + 32 * i, key = piece / (kHeadDim / 16), part = piece % (kHeadDim / 16);
      const int64_t off = at(min(t0 + key, keys - 1)) + part * 16;
      __pipeline_memcpy_async(&stage[warp][s][0][key * kRowBytes + part * 16], k + off, 16);
      __pipeline_memcpy_async(&stage[warp][s][1][key * kRowBytes + part * 16], v + off, 16);
    }
    __pipeline_commit();
  };
  unsigned acc = 0;
  int t0 = warp * kKeys;
  if (t0 < keys) issue(t0, 0);
  for (int it = 0; t0 < keys; ++it, t0 += kWarps * kKeys) {
    const int s = it & 1;
    if (t0 + kWarps * kKeys < keys) {
      issue(t0 + kWarps * kKeys, s ^ 1);
    } else {
      __pipeline_commit();
    }
    __pipeline_wait_prior(1);
    __syncwarp();
    acc += stage[warp][s][0][lane * 4] + stage[warp][s][1][lane * 4 + 64];
    __syncwarp();
  }
  if (acc == 0xffffffffu) *sink = acc;  // keeps the reads
}

struct Case {
  int rows, warps, keys;
};

template <int kWarps>
constexpr int SmemBytes() {
  return kWarps * 2 * 2 * kKeys * kRowBytes;
}

// Once, before anything is timed: every instance may take its stages' dynamic shared memory.
cudaError_t AllowSmem() {
  cudaError_t e = cudaSuccess;
  auto allow = [&](auto kernel, int bytes) {
    if (e == cudaSuccess) e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  };
  allow(ReadKv<false, 4>, SmemBytes<4>()), allow(ReadKv<true, 4>, SmemBytes<4>());
  allow(ReadKv<false, 8>, SmemBytes<8>()), allow(ReadKv<true, 8>, SmemBytes<8>());
  allow(ReadKv<false, 16>, SmemBytes<16>()), allow(ReadKv<true, 16>, SmemBytes<16>());
  return e;
}

template <bool kHeadMajor, int kWarps>
cudaError_t LaunchWarps(const Case& c, const uint8_t* k, const uint8_t* v, int blocks_per_row, unsigned* sink,
                        cudaStream_t s) {
  ReadKv<kHeadMajor, kWarps><<<dim3(c.rows, kKvHeads), kWarps * 32, SmemBytes<kWarps>(), s>>>(k, v, c.keys,
                                                                                            blocks_per_row, sink);
  return cudaGetLastError();
}

template <bool kHeadMajor>
cudaError_t Launch(const Case& c, const uint8_t* k, const uint8_t* v, int blocks_per_row, unsigned* sink, cudaStream_t s) {
  switch (c.warps) {
    case 4: return LaunchWarps<kHeadMajor, 4>(c, k, v, blocks_per_row, sink, s);
    case 8: return LaunchWarps<kHeadMajor, 8>(c, k, v, blocks_per_row, sink, s);
    default: return LaunchWarps<kHeadMajor, 16>(c, k, v, blocks_per_row, sink, s);
  }
}

absl::Status Run() {
  const std::vector<Case> cases = {{16, 16, 512}, {16, 4, 512}, {32, 8, 512}, {64, 4, 512}, {64, 4, 2048}};
  int max_rows = 0, max_keys = 0;
  for (const Case& c : cases) max_rows = std::max(max_rows, c.rows), max_keys = std::max(max_keys, c.keys);
  const int blocks_per_row = (max_keys + kBlock - 1) / kBlock;
  const size_t layer_bytes = static_cast<size_t>(max_rows) * blocks_per_row * kBlock * kKvHeads * kHeadDim;
  uint8_t *k = nullptr, *v = nullptr;
  unsigned* sink = nullptr;
  cudaStream_t s;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&k, layer_bytes * kLayers));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&v, layer_bytes * kLayers));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&sink, sizeof(unsigned)));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(k, 1, layer_bytes * kLayers));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(v, 2, layer_bytes * kLayers));
  TAILSERVE_CUDA_RETURN_IF_ERROR(AllowSmem());
  cudaEvent_t e0, e1;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e0));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e1));
  std::printf("| rows | warps a CTA | keys | MB a launch | slot-major µs | GB/s | head-major µs | GB/s |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Case& c : cases) {
    const double bytes = 2.0 * c.rows * kKvHeads * c.keys * kHeadDim;
    float best[2] = {1e30f, 1e30f};
    for (int round = 0; round < 5; ++round) {
      for (int layout = 0; layout < 2; ++layout) {
        constexpr int kReps = 40;
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(e0, s));
        for (int r = 0; r < kReps; ++r) {
          const size_t off = (r % kLayers) * layer_bytes;
          TAILSERVE_CUDA_RETURN_IF_ERROR(layout ? Launch<true>(c, k + off, v + off, blocks_per_row, sink, s)
                                                : Launch<false>(c, k + off, v + off, blocks_per_row, sink, s));
        }
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(e1, s));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e1));
        float ms = 0;
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, e0, e1));
        best[layout] = std::min(best[layout], ms * 1e3f / kReps);
      }
    }
    std::printf("| %d | %d | %d | %.1f | %.1f | %.0f | %.1f | %.0f |\n", c.rows, c.warps, c.keys, bytes / 1e6, best[0],
                bytes / best[0] / 1e3, best[1], bytes / best[1] / 1e3);
  }
  std::printf("\n(launches back to back: each time includes one launch's ramp and tail; copy ceiling 4260 GB/s)\n");
  cudaFree(k), cudaFree(v), cudaFree(sink);
  return absl::OkStatus();
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "tailserve-bench-kv-layout: no CUDA device\n");
    return 1;
  }
  if (absl::Status st = Run(); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
