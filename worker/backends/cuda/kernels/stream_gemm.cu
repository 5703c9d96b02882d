#include "worker/backends/cuda/kernels/stream_gemm.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <type_traits>

#include "common/status_macros.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"
#include "worker/backends/cuda/kernels/tma.cuh"
#include "worker/backends/cuda/per_device.h"

namespace tailserve::cuda {
namespace {

using tma::BarrierArrive;
using tma::BarrierExpect;
using tma::BarrierInit;
using tma::BarrierWait;
using tma::LdMatrix4;
using tma::LoadAcquire;
using tma::Mma;
using tma::MapBoxes;
using tma::Smem;
using tma::Swizzled;
using tma::TmaLoadBoxes;

constexpr int kTileK = tma::kBoxK;  // k a box: one 128-byte swizzle row
static_assert(kTileK == kStreamTileK);
constexpr int kXBoxBytes = 16 * kTileK * 2;  // 2 KB: 16 rows, zero-filled past the real ones
constexpr int kConsumerWarps = 4;
constexpr int kThreads = (kConsumerWarps + 1) * 32;

// TN: 64-column blocks an item (each consumer warp takes 16 · TN columns); KB: k boxes a stage.
template <int TN, int KB>
struct Config {
  static constexpr int kTileN = 64 * TN;
  static constexpr int kWBoxBytes = kTileN * kTileK * 2;
  static constexpr int kStageBytes = KB * (kWBoxBytes + kXBoxBytes);  // a multiple of 1024 (the swizzle's span)
  static constexpr int kStages = (227 * 1024 - 1024) / kStageBytes;
  static constexpr int kSmem = kStages * kStageBytes + 1024;  // + alignment slack
};
constexpr int kMaxStages = (227 * 1024 - 1024) / (64 * kTileK * 2 + kXBoxBytes);

// What an item does. kGemm: StreamGemm's (column tile, k chunk) into its chunk's partial. The
// FFN (StreamFfn): kGateUp, a 64-column tile of the interleaved gate/up matrix over the whole k,
// whose epilogue applies SwiGLU and writes 32 features of act; kDown, a 64-column tile of W_down
// over k chunk `group` of act, into that chunk's partial, once every gate/up tile of the group's
// features is written.
enum ItemKind : int { kGemm = 0, kGateUp = 1, kDown = 2 };
constexpr int kMaxSegments = 2 * kStreamFfnMaxChunks;

struct Params {
  int rows, n, chunks, chunk_k, k_blocks, items;
  float* partials;
  int64_t stride;
  int* counters;  // [0]: the next item, [1]: CTAs finished, [2 + g]: the FFN's gate/up tiles of group g done
  bool overlap;   // launched programmatically: copy the first W before the wait
  int stages;     // of the ring: Config::kStages, or fewer (max_ring_bytes)
  // The FFN (ffn > 0): items in segments of one kind and group, in this order, so that a down
  // segment comes `lag` gate/up groups after its own (its features long written when it is taken).
  int ffn, hidden, down_tiles, gate_up_k_blocks;  // down_tiles: a group's
  // Feature group g: features [group_first[g], + group_features[g]), gate/up tiles from
  // group_first[g] / 32 (a tile: 32 features' gate and up), down's k blocks.
  int group_first[kStreamFfnMaxChunks], group_features[kStreamFfnMaxChunks], group_k_blocks[kStreamFfnMaxChunks];
  __half* act;
  int segments, segment_kind[kMaxSegments], segment_group[kMaxSegments];
  uint64_t* timeline;  // StreamFfnArgs::timeline
};

struct Item {
  ItemKind kind;
  int group, tile, k_first, k_blocks;  // group: GEMM's k chunk, or the FFN's feature group
};

__device__ __forceinline__ Item Decode(const Params& p, int item) {
  if (p.ffn == 0) {
    return {kGemm, item % p.chunks, item / p.chunks, (item % p.chunks) * p.chunk_k, p.k_blocks};
  }
  for (int s = 0; s < p.segments; ++s) {
    const ItemKind kind = static_cast<ItemKind>(p.segment_kind[s]);
    const int g = p.segment_group[s], count = kind == kGateUp ? p.group_features[g] / 32 : p.down_tiles;
    if (item < count) {
      return kind == kGateUp ? Item{kGateUp, g, p.group_first[g] / 32 + item, 0, p.gate_up_k_blocks}
                             : Item{kDown, g, item, p.group_first[g], p.group_k_blocks[g]};
    }
    item -= count;
  }
  return {kGemm, 0, 0, 0, 0};  // unreachable for item < p.items
}

__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t SmId() {
  uint32_t id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

template <int TN, int KB>
__global__ void __launch_bounds__(kThreads, 1)
    StreamGemmKernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                     const __grid_constant__ CUtensorMap w2_map, const __grid_constant__ CUtensorMap x2_map,
                     const __grid_constant__ Params p) {
  using C = Config<TN, KB>;
  constexpr int kStageBytes = C::kStageBytes, kTileN = C::kTileN;
  const int stages = p.stages;
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full_s[kMaxStages], empty_s[kMaxStages];
  __shared__ int item_s[kMaxStages];  // the item a filled stage belongs to; -1: no more
  __shared__ int kb_s[kMaxStages];    // its k block, for the stages copied before the wait
  unsigned char* ring = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&w_map)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&x_map)) : "memory");
    if (p.ffn > 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&w2_map)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&x2_map)) : "memory");
    }
    for (int s = 0; s < stages; ++s) BarrierInit(&full_s[s], 1), BarrierInit(&empty_s[s], kConsumerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    if (Timed(p.timeline)) {
      uint64_t* cta = p.timeline + 4 * p.items + 6 * blockIdx.x;  // StreamFfnArgs::timeline's CTA record
      cta[0] = GlobalTimer(), cta[2] = clock64();
    }
  }
  __syncthreads();
  // X and the partials (read by the previous launch's consumer) belong to what came before: the
  // consumer warps wait here; launched programmatically, the producer first copies the W of a
  // whole ring of stages (W is constant, the counter is this launch's own), then waits and copies
  // their X. The producer's whole warp skips this wait: with its idle lanes waiting here, lane 0's
  // copies before the wait were held back (docs/cuda-decode.md: skipping it took the
  // programmatic chain of the four projections to 111.4 µs, plain 122.2, cuBLASLt 115.5).
  // Triggering at once lets a programmatic follower take each SM this grid leaves (the idle lanes
  // trigger without waiting: a follower waits for this whole grid before it reads anything).
  if (warp != kConsumerWarps) {
    GridDependencyWait(), TriggerDependents();
  } else if (lane != 0) {
    TriggerDependents();
  }

  if (warp == kConsumerWarps) {  // the producer
    if (lane == 0) {
      uint64_t stream_policy, keep_policy;  // W is read once; X by every CTA
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(stream_policy));
      asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep_policy));
      uint64_t empty_wait = 0;  // cycles spent waiting for a free stage (the timeline's)
      // One copy a stage for W and one for X (maps from MapBoxes), and no division: the producer
      // lane's issue is what sets a stage's fixed cost (docs/cuda-decode.md: a bare
      // ring streams 53-144 GB/s an SM, and each per-stage step added to it slows it).
      auto load_x = [&](int s, const Item& it, int kb) {
        TmaLoadBoxes(ring + s * kStageBytes + KB * C::kWBoxBytes, it.kind == kDown ? &x2_map : &x_map,
                     it.k_first / kTileK + kb * KB, 0, &full_s[s], keep_policy);
      };
      int before_wait = 0;  // stages whose X waits for the predecessor; -1 once waited
      auto wait_once = [&] {
        if (before_wait < 0) return;
        GridDependencyWait();
        TriggerDependents();
        for (int e = 0; e < before_wait; ++e) load_x(e, Decode(p, item_s[e]), kb_s[e]);
        before_wait = -1;
      };
      // Without a predecessor X goes out with each stage: X queued behind a ring of W copies
      // delayed the first stage by the TMA's issue of the whole ring (kernel bench, 12-03).
      // Launched programmatically, the whole ring's W goes out before the wait (W is constant), so
      // the ring fills while the predecessor's last CTAs finish.
      const int early_stages = stages;
      if (!p.overlap) wait_once();
      int s = 0;             // slot % stages
      uint32_t parity = 0;   // (slot / stages) & 1
      // The next item is claimed kClaimAhead stages before this one's last: waiting for the
      // atomic's round trip between items stalled the ring (the ring probe's claimed tiles).
      constexpr int kClaimAhead = 4;
      int item = atomicAdd(p.counters, 1);
      for (int slot = 0;;) {
        const bool more = item < p.items;
        const Item it = more ? Decode(p, item) : Item{};
        if (Timed(p.timeline) && more) p.timeline[4 * item] = GlobalTimer(), p.timeline[4 * item + 3] = SmId();
        const CUtensorMap* w = it.kind == kDown ? &w2_map : &w_map;
        const int k_blocks = more ? it.k_blocks : 1, claim_at = k_blocks > kClaimAhead ? k_blocks - kClaimAhead : 0;
        int next = p.items;
        for (int kb = 0; kb < k_blocks; ++kb, ++slot) {
          if (more && kb == claim_at) next = atomicAdd(p.counters, 1);
          if (slot >= early_stages) wait_once();
          if (slot >= stages) {
            const uint64_t w0 = Timed(p.timeline) ? clock64() : 0;
            BarrierWait(&empty_s[s], parity ^ 1);
            if (Timed(p.timeline)) empty_wait += clock64() - w0;
          }
          // The consumers read an item's id at its first stage (the stages before the wait: each).
          if (kb == 0 || before_wait >= 0) item_s[s] = more ? item : -1;  // published by the arrive's release
          if (!more) {
            wait_once();
            BarrierArrive(&full_s[s]);
            break;
          }
          if (kb == 0 && it.kind == kDown) {
            // act's features of this group: written by other CTAs' gate/up epilogues (generic
            // stores, released by their count), read here by the TMA (the async proxy).
            wait_once();
            const uint64_t spin_start = Timed(p.timeline) ? GlobalTimer() : 0;
            while (LoadAcquire(p.counters + 2 + it.group) < p.group_features[it.group] / 32) __nanosleep(32);
            asm volatile("fence.proxy.async.global;" ::: "memory");
            if (Timed(p.timeline)) p.timeline[4 * item + 1] = GlobalTimer() - spin_start;
          }
          BarrierExpect(&full_s[s], kStageBytes);
          TmaLoadBoxes(ring + s * kStageBytes, w, it.k_first / kTileK + kb * KB, it.tile * kTileN, &full_s[s],
                       stream_policy);
          if (before_wait < 0) {
            load_x(s, it, kb);
          } else {
            kb_s[s] = kb, ++before_wait;
          }
          if (++s == stages) s = 0, parity ^= 1;
        }
        if (!more) break;
        item = next;
      }
      if (Timed(p.timeline)) p.timeline[4 * p.items + 6 * blockIdx.x + 5] = empty_wait;
    }
    __syncwarp();
  } else {
    // ldmatrix rows this lane addresses: of W (rows 8 at a time, then the k half), of X (rows 0-7
    // for the first k half and then the second, then rows 8-15 likewise).
    const int w_row = 16 * TN * warp + (lane & 7) + 8 * ((lane >> 3) & 1), w_half = lane >> 4;
    const int x_row = (lane & 7) + 8 * (lane >> 4), x_half = (lane >> 3) & 1;
    const uint32_t ring_addr = Smem(ring);
    float acc[TN][2][4] = {};
    Item it{};
    const bool timed = Timed(p.timeline) && warp == 0;
    uint64_t full_wait = 0;  // warp 0's cycles waiting for a filled stage (the timeline's)
    int item = -1;
    for (int s = 0, kb = 0, parity = 0;;) {  // s: the slot % stages, parity: (slot / stages) & 1
      const uint64_t w0 = timed ? clock64() : 0;
      BarrierWait(&full_s[s], parity);
      if (timed) full_wait += clock64() - w0;
      if (kb == 0) {  // an item's stages arrive in a row; its id with the first
        item = item_s[s];
        if (item < 0) break;
        it = Decode(p, item);
      }
      const uint32_t stage = ring_addr + s * kStageBytes;
#pragma unroll
      for (int b = 0; b < KB; ++b) {
        const uint32_t w_base = stage + b * C::kWBoxBytes, x_base = stage + KB * C::kWBoxBytes + b * kXBoxBytes;
#pragma unroll
        for (int ks = 0; ks < kTileK / 16; ++ks) {
          uint32_t bx[4];
          LdMatrix4(x_base + Swizzled(x_row, 2 * ks + x_half), bx);
#pragma unroll
          for (int mt = 0; mt < TN; ++mt) {
            uint32_t a[4];
            LdMatrix4(w_base + Swizzled(w_row + 16 * mt, 2 * ks + w_half), a);
            Mma(acc[mt][0], a, bx[0], bx[1]);
            Mma(acc[mt][1], a, bx[2], bx[3]);
          }
        }
      }
      __syncwarp();
      if (lane == 0) BarrierArrive(&empty_s[s]);
      if (++s == stages) s = 0, parity ^= 1;
      if (++kb < it.k_blocks) continue;
      // The item's last stage: acc[mt][j][i] is column tile·kTileN + 16·TN·warp + 16·mt + g +
      // 8·(i / 2) of row 8·j + 2·c + i % 2 (g = lane / 4, c = lane % 4).
      kb = 0;
      // kGateUp: gate and up interleave, so column 2f (even g) is feature f's gate and lane ^ 4
      // holds 2f + 1, its up; SwiGLU goes to act. Otherwise the sum goes to the item's partial.
      const bool swiglu = it.kind == kGateUp;  // the same for the whole warp: the shuffle is safe
      const int n = it.kind == kDown ? p.hidden : p.n;
      float* out = p.partials + it.group * p.stride;
#pragma unroll
      for (int mt = 0; mt < TN; ++mt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int col = it.tile * kTileN + 16 * TN * warp + 16 * mt + (lane >> 2) + 8 * (i >> 1);
            const int row = 8 * j + 2 * (lane & 3) + (i & 1);
            const float v = acc[mt][j][i];
            if (swiglu) {
              const float up = __shfl_xor_sync(0xffffffffu, v, 4);
              if (((lane >> 2) & 1) == 0 && row < p.rows) {
                p.act[static_cast<int64_t>(row) * p.ffn + col / 2] = __float2half(v / (1.0f + __expf(-v)) * up);
              }
            } else if (row < p.rows && col < n) {
              out[static_cast<int64_t>(row) * n + col] = v;
            }
            acc[mt][j][i] = 0.0f;
          }
        }
      }
      if (swiglu) {
        // Release the group's count once all four warps' stores are out (and visible to the
        // async proxy that reads them).
        asm volatile("fence.proxy.async.global;" ::: "memory");
        asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32) : "memory");
        if (threadIdx.x == 0) {
          __threadfence();
          atomicAdd(p.counters + 2 + it.group, 1);
        }
      }
      if (Timed(p.timeline) && threadIdx.x == 0) p.timeline[4 * item + 2] = GlobalTimer();
    }
    if (timed && lane == 0) p.timeline[4 * p.items + 6 * blockIdx.x + 4] = full_wait;
  }
  // The last CTA out leaves the counters zeroed for the next launch: every CTA has taken its
  // final (past-the-end) item before it counts itself finished.
  __syncthreads();
  if (threadIdx.x == 0) {
    if (Timed(p.timeline)) {
      uint64_t* cta = p.timeline + 4 * p.items + 6 * blockIdx.x;
      cta[1] = GlobalTimer(), cta[3] = clock64();
    }
    __threadfence();
    if (atomicAdd(p.counters + 1, 1) == static_cast<int>(gridDim.x) - 1) {
      __threadfence();  // the reset after every other CTA's last use, not only by control dependence
      p.counters[0] = 0, p.counters[1] = 0;
      for (int g = 0; p.ffn > 0 && g < p.chunks; ++g) p.counters[2 + g] = 0;
      __threadfence();
    }
  }
}

// The instance's function attributes (room for the ring, all of shared memory's carveout), set
// once a device.
template <int TN, int KB>
absl::Status Attributes() {
  static PerDeviceInt opted;
  return opted
      .Get([]() -> absl::StatusOr<int> {
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
            StreamGemmKernel<TN, KB>, cudaFuncAttributeMaxDynamicSharedMemorySize, Config<TN, KB>::kSmem));
        TAILSERVE_CUDA_RETURN_IF_ERROR(
            cudaFuncSetAttribute(StreamGemmKernel<TN, KB>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
        return 1;
      })
      .status();
}

template <int TN, int KB>
absl::Status Launch(const CUtensorMap (&maps)[4], Params p, int ctas, int max_ring_bytes, cudaStream_t stream) {
  using C = Config<TN, KB>;
  p.stages = max_ring_bytes > 0 ? std::clamp(max_ring_bytes / C::kStageBytes, 2, C::kStages) : C::kStages;
  TAILSERVE_RETURN_IF_ERROR(Attributes<TN, KB>());
  const int smem = p.stages * C::kStageBytes + 1024;  // + alignment slack
  TAILSERVE_CUDA_RETURN_IF_ERROR(LaunchMaybeOverlapped(p.overlap, dim3(std::min(ctas, p.items)), dim3(kThreads), smem,
                                                       stream, StreamGemmKernel<TN, KB>, maps[0], maps[1], maps[2],
                                                       maps[3], p));
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

template <int TN, int KB>
absl::Status LaunchGemm(const StreamGemmArgs& a, int ctas, cudaStream_t stream) {
  using C = Config<TN, KB>;
  if (a.k % (kTileK * KB * a.chunks) != 0) return absl::InvalidArgumentError("StreamGemm: k for the variant");
  CUtensorMap maps[4];
  TAILSERVE_RETURN_IF_ERROR(MapBoxes(&maps[0], a.w, a.k, a.n, C::kTileN, KB));
  TAILSERVE_RETURN_IF_ERROR(MapBoxes(&maps[1], a.x, a.k, a.rows, 16, KB));
  maps[2] = maps[0], maps[3] = maps[1];
  Params p{};
  p.rows = a.rows, p.n = a.n, p.chunks = a.chunks, p.chunk_k = a.k / a.chunks, p.k_blocks = p.chunk_k / (kTileK * KB);
  p.items = (a.n + C::kTileN - 1) / C::kTileN * a.chunks;
  p.partials = a.partials, p.stride = a.partial_stride, p.counters = static_cast<int*>(a.workspace);
  p.overlap = a.overlap_previous;
  return Launch<TN, KB>(maps, p, ctas, a.max_ring_bytes, stream);
}

// Calls f(TN, KB) (as integral constants) with StreamGemmArgs::variant's item and stage shape.
template <typename F>
auto WithVariant(int variant, F&& f) {
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  switch (variant) {
    case 1: return f(I1{}, I2{});
    case 2: return f(I2{}, I1{});
    case 3: return f(I2{}, I2{});
    case 4: return f(I1{}, std::integral_constant<int, 4>{});
    default: return f(I1{}, I1{});
  }
}
// The plan reads a variant's k a stage from plan/stream_layout.h: it must be this table's.
static_assert(StreamGemmKStep(0) == kTileK && StreamGemmKStep(1) == 2 * kTileK && StreamGemmKStep(2) == kTileK &&
              StreamGemmKStep(3) == 2 * kTileK && StreamGemmKStep(4) == 4 * kTileK);

absl::StatusOr<int> CtasOrSms(int ctas) {
  if (ctas > 0) return ctas;
  return CurrentDeviceSmCount();
}

}  // namespace

absl::Status StreamGemm(const StreamGemmArgs& a, cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (a.rows < 1 || a.rows > kStreamGemmMaxRows || a.chunks < 1 || a.chunks > 8 || a.k <= 0 ||
      a.k % (kTileK * a.chunks) != 0 || a.n <= 0 || a.x == nullptr || a.w == nullptr || a.partials == nullptr ||
      a.workspace == nullptr || !aligned(a.x) || !aligned(a.w) ||
      (a.chunks > 1 && a.partial_stride < static_cast<int64_t>(a.rows) * a.n)) {
    return absl::InvalidArgumentError(
        "StreamGemm: 1..16 rows, 1..8 chunks, k a multiple of 64 · chunks, x and w 16-byte aligned, partials "
        "at least rows · n apart, a workspace");
  }
  absl::StatusOr<int> ctas = CtasOrSms(a.ctas);
  if (!ctas.ok()) return ctas.status();
  return WithVariant(a.variant, [&](auto tn, auto kb) {
    return LaunchGemm<decltype(tn)::value, decltype(kb)::value>(a, *ctas, stream);
  });
}

absl::Status StreamFfn(const StreamFfnArgs& a, cudaStream_t stream) {
  if (a.timeline != nullptr && !kTimelineBuild) {
    return absl::InvalidArgumentError("StreamFfn: a timeline needs the kernels built with TAILSERVE_KERNEL_TIMELINE");
  }
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int c = a.chunks;
  const std::vector<int> features = StreamFfnGroupFeatures(a.ffn, c, a.last_chunk, a.last_chunks);
  if (a.rows < 1 || a.rows > kStreamGemmMaxRows || c < 1 || c > kStreamFfnMaxChunks || a.lag < 1 || a.hidden <= 0 ||
      a.hidden % kTileK != 0 || features.empty() || a.x == nullptr || a.w_gate_up == nullptr ||
      a.w_down == nullptr || a.act == nullptr || a.partials == nullptr || a.workspace == nullptr || !aligned(a.x) ||
      !aligned(a.w_gate_up) || !aligned(a.w_down) || !aligned(a.act) ||
      a.partial_stride < static_cast<int64_t>(a.rows) * a.hidden) {
    return absl::InvalidArgumentError(
        "StreamFfn: 1..16 rows, 1..16 chunks, a lag of 1 or more, hidden a multiple of 64, ffn of 64 · chunks (with a "
        "last chunk: it and the rest's equal shares multiples of 64), x, the weights and act 16-byte aligned, partials "
        "at least rows · hidden apart, a workspace");
  }
  absl::StatusOr<int> ctas = CtasOrSms(a.ctas);
  if (!ctas.ok()) return ctas.status();
  // The most k boxes a stage that hidden and every group allow, up to a.k_boxes.
  int kb = 1;
  for (int b : {4, 2}) {
    bool fits = kb == 1 && b <= a.k_boxes && a.hidden % (b * kTileK) == 0;
    for (int n : features) fits = fits && n % (b * kTileK) == 0;
    if (fits) kb = b;
  }
  CUtensorMap maps[4];
  TAILSERVE_RETURN_IF_ERROR(MapBoxes(&maps[0], a.w_gate_up, a.hidden, 2 * a.ffn, 64, kb));
  TAILSERVE_RETURN_IF_ERROR(MapBoxes(&maps[1], a.x, a.hidden, a.rows, 16, kb));
  TAILSERVE_RETURN_IF_ERROR(MapBoxes(&maps[2], a.w_down, a.ffn, a.hidden, 64, kb));
  TAILSERVE_RETURN_IF_ERROR(MapBoxes(&maps[3], a.act, a.ffn, a.rows, 16, kb));
  Params p{};
  p.rows = a.rows, p.n = 2 * a.ffn, p.chunks = c;
  p.partials = a.partials, p.stride = a.partial_stride, p.counters = static_cast<int*>(a.workspace);
  p.overlap = a.overlap_previous;
  p.timeline = a.timeline;
  p.ffn = a.ffn, p.hidden = a.hidden, p.act = a.act;
  p.down_tiles = (a.hidden + 63) / 64, p.gate_up_k_blocks = a.hidden / (kTileK * kb);
  for (int g = 0, first = 0; g < c; first += features[g], ++g) {
    p.group_first[g] = first, p.group_features[g] = features[g], p.group_k_blocks[g] = features[g] / (kTileK * kb);
  }
  p.items = c * p.down_tiles + a.ffn / 32;
  for (const StreamFfnSegment& segment : StreamFfnOrder(c, a.lag)) {
    p.segment_kind[p.segments] = segment.down ? kDown : kGateUp, p.segment_group[p.segments] = segment.group;
    ++p.segments;
  }
  // The whole ring: one CTA an SM (two with half a ring each measured no faster).
  if (kb == 4) return Launch<1, 4>(maps, p, *ctas, 0, stream);
  return kb == 2 ? Launch<1, 2>(maps, p, *ctas, 0, stream) : Launch<1, 1>(maps, p, *ctas, 0, stream);
}

}  // namespace tailserve::cuda
