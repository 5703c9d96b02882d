#include "worker/backends/cuda/kernels/skinny_gemm.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"

namespace tailserve::cuda {
namespace {

constexpr int kTileN = 128;                 // W rows (output columns) a tile
constexpr int kTileK = 64;                  // k a stage: one 128-byte swizzle row
constexpr int kWBytes = kTileN * kTileK * 2;  // 16 KB
constexpr int kConsumerWarps = 4;           // 32 columns each
constexpr int kThreads = (kConsumerWarps + 1) * 32;
constexpr int kMaxTiles = 4096;             // counters in the workspace: n ≤ 524288
constexpr int kMaxCtas = 1024;

template <int RT>  // 16-row groups of X
struct Config {
  static constexpr int kXBytes = 16 * RT * kTileK * 2;
  static constexpr int kStageBytes = kWBytes + kXBytes;  // a multiple of 1024 (the swizzle's span)
  // One CTA an SM with as many stages as its shared memory holds: the bytes in flight are what
  // bound the stream (6 stages, two CTAs an SM, ran o at 16 rows at 48% of the bandwidth).
  static constexpr int kStages = (226 * 1024 - 1024) / kStageBytes;
  static constexpr int kSmem = kStages * kStageBytes + 1024;  // + alignment slack
  static constexpr int kAcc = 2 * 2 * RT * 4;  // a consumer thread's accumulators
};

constexpr int kMaxUnits = 1024;  // partial slots in the workspace (a tile split in more than one unit)

struct Params {
  int rows, k, n;
  float* y;
  float beta;
  __half* swiglu_out;
  int* counters;     // [kMaxTiles]: units of the tile published
  int* work;         // [2]: units handed out past the first wave, CTAs done
  float4* partials;  // [units][kAcc / 4][128]
  // Work units: split `split` of tile t covers k blocks [split · unit_blocks, +unit_blocks) (the last
  // fewer); unit u is (u / splits, u % splits). CTA c starts on unit c and then takes the next
  // unhanded one, so faster SMs take more.
  int k_blocks, tiles, splits, unit_blocks, units;
  unsigned long long* stamps;  // SkinnyGemmArgs::stamps
  int variant;
};

__device__ __forceinline__ void Stamp(const Params& p, int cta, int i) {
  if (p.stamps == nullptr) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (i == 0) {  // the SM in the top byte
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    t |= static_cast<unsigned long long>(sm) << 56;
  }
  p.stamps[cta * 4 + i] = t;
}

__device__ __forceinline__ uint32_t Smem(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void BarrierInit(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(Smem(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void BarrierExpect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(Smem(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void BarrierArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(Smem(bar)) : "memory");
}
__device__ __forceinline__ void BarrierWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @p bra DONE_%=;\n"
      " bra WAIT_%=;\n DONE_%=:\n }" ::"r"(Smem(bar)),
      "r"(parity)
      : "memory");
}
// One 2D tile (coordinates: element along k, row) into shared memory, completing on `bar`.
__device__ __forceinline__ void TmaLoad(void* dst, const CUtensorMap* map, int k0, int row0, uint64_t* bar,
                                        uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(Smem(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(row0), "r"(Smem(bar)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void LdMatrix4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// D += A · B for one m16n8k16 tile: fp16 in, fp32 accumulate.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 128-byte rows under the TMA's
// 128-byte swizzle (chunk index XOR row mod 8, rows counted from a 1024-byte-aligned base).
__device__ __forceinline__ uint32_t Swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}


// Consumer thread `tid` (0..127) of warp `warp`: its accumulators acc[mt][j][i] hold output column
// tile·128 + 32·warp + 16·mt + g + 8·(i / 2) of row 8·j + 2·c + i % 2 (g = lane / 4, c = lane % 4).
template <int RT>
__device__ __forceinline__ float* OutputAt(const Params& p, int tile, int warp, int lane, int mt, int j, int i) {
  const int col = tile * kTileN + 32 * warp + 16 * mt + (lane >> 2) + 8 * (i >> 1), row = 8 * j + 2 * (lane & 3) + (i & 1);
  return row < p.rows && col < p.n ? p.y + static_cast<int64_t>(row) * p.n + col : nullptr;
}

// beta · y over the thread's outputs of `tile`, loaded when the CTA starts on the tile so that the
// loads have landed by its epilogue (each one a round trip to L2 otherwise, behind the tile's last
// stage). Zeros without a residual.
template <int RT>
__device__ __forceinline__ void LoadResidual(const Params& p, int tile, int warp, int lane, float (&old)[2][2 * RT][4]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int j = 0; j < 2 * RT; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float* y = p.beta != 0.0f && p.swiglu_out == nullptr ? OutputAt<RT>(p, tile, warp, lane, mt, j, i) : nullptr;
        old[mt][j][i] = y != nullptr ? p.beta * *y : 0.0f;
      }
    }
  }
}

template <int RT>
__device__ __forceinline__ void Epilogue(const Params& p, int tile, int warp, int lane,
                                         const float (&acc)[2][2 * RT][4], const float (&old)[2][2 * RT][4]) {
  const int g = lane >> 2, c = lane & 3;
  if (p.swiglu_out != nullptr) {
    // Gate and up interleaved (columns 2i, 2i + 1): lane (g, c) holds column g of a pair whose
    // other column lane (g + 1, c), four lanes on, holds.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int j = 0; j < 2 * RT; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float up = __shfl_xor_sync(0xffffffffu, acc[mt][j][i], 4);
          const int col = tile * kTileN + 32 * warp + 16 * mt + g + 8 * (i >> 1), row = 8 * j + 2 * c + (i & 1);
          if ((g & 1) == 0 && row < p.rows && col < p.n) {
            p.swiglu_out[static_cast<int64_t>(row) * (p.n / 2) + col / 2] = __float2half(Silu(acc[mt][j][i]) * up);
          }
        }
      }
    }
    return;
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int j = 0; j < 2 * RT; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (float* y = OutputAt<RT>(p, tile, warp, lane, mt, j, i)) *y = acc[mt][j][i] + old[mt][j][i];
      }
    }
  }
}

// Tile counters, as CUTLASS's stream-K barriers: one thread of each CTA publishes after a CTA
// barrier (the release covers the other threads' partials) and the reader acquires before one.
__device__ __forceinline__ int LoadRelaxed(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int AddAcqRel(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ void ConsumerSync() { asm volatile("bar.sync 1, 128;" ::: "memory"); }

// A finished unit (split `split` of `tile`): written out when it is the tile's only split;
// otherwise the tile's last unit to finish sums every split's part in split order (so the result
// does not depend on which finished last) and writes the tile, and the others leave theirs as
// partials. `peek` is thread 0's look at the tile's counter when the unit started.
template <int RT>
__device__ __forceinline__ void Flush(const Params& p, int unit, int warp, int lane, const float (&acc)[2][2 * RT][4],
                                      int peek, int* flag_s) {
  constexpr int kVecs = Config<RT>::kAcc / 4;
  const int tid = warp * 32 + lane, tile = unit / p.splits, split = unit % p.splits, others = p.splits - 1;
  float old[2][2 * RT][4];
  if (p.splits == 1) {
    LoadResidual<RT>(p, tile, warp, lane, old);
    Epilogue<RT>(p, tile, warp, lane, acc, old);
    return;
  }
  auto slot_of = [&](int u) { return p.partials + static_cast<int64_t>(u) * kVecs * 128 + tid; };
  const float* flat = &acc[0][0][0];
  if (tid == 0) {
    const bool seen_all = peek == others;
    if (seen_all) asm volatile("fence.acq_rel.gpu;" ::: "memory");  // with the relaxed peek: an acquire
    *flag_s = seen_all;
  }
  ConsumerSync();
  const bool last_to_arrive = *flag_s;
  ConsumerSync();  // flag_s read before thread 0 writes it again
  if (!last_to_arrive) {
    float4* mine = slot_of(unit);
#pragma unroll
    for (int v = 0; v < kVecs; ++v) mine[v * 128] = make_float4(flat[4 * v], flat[4 * v + 1], flat[4 * v + 2], flat[4 * v + 3]);
    ConsumerSync();
    if (tid == 0) *flag_s = AddAcqRel(p.counters + tile, 1) == others;
    ConsumerSync();
    const bool now_last = *flag_s;
    ConsumerSync();
    if (!now_last) return;
  }
  // Every other split is published: the residual and up to 4 / RT partials at a time go out together.
  LoadResidual<RT>(p, tile, warp, lane, old);
  constexpr int kBatch = 4 / RT;
  float sum[2][2 * RT][4] = {};
  float* total = &sum[0][0][0];
  const int first = tile * p.splits;
  for (int b0 = 0; b0 < p.splits; b0 += kBatch) {
    float4 q[kBatch][kVecs];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (b0 + b >= p.splits || b0 + b == split) continue;
      const float4* part = slot_of(first + b0 + b);
#pragma unroll
      for (int v = 0; v < kVecs; ++v) q[b][v] = __ldcg(part + v * 128);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (b0 + b >= p.splits) continue;
      if (b0 + b == split) {
#pragma unroll
        for (int i = 0; i < Config<RT>::kAcc; ++i) total[i] += flat[i];
        continue;
      }
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        total[4 * v] += q[b][v].x, total[4 * v + 1] += q[b][v].y, total[4 * v + 2] += q[b][v].z;
        total[4 * v + 3] += q[b][v].w;
      }
    }
  }
  if (tid == 0) p.counters[tile] = 0;  // for the next launch
  Epilogue<RT>(p, tile, warp, lane, sum, old);
}

template <int RT>
__global__ void __launch_bounds__(kThreads, 1)
    SkinnyGemmKernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map, Params p) {
  using C = Config<RT>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full_s[C::kStages], empty_s[C::kStages];
  __shared__ int unit_s[C::kStages];  // the unit a stage belongs to; -1: no more
  __shared__ int flag_s;
  unsigned char* ring = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, cta = blockIdx.x;
  if (threadIdx.x == 0) {
    Stamp(p, cta, 0);
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&w_map)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&x_map)) : "memory");
    for (int s = 0; s < C::kStages; ++s) BarrierInit(&full_s[s], 1), BarrierInit(&empty_s[s], kConsumerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == kConsumerWarps) {  // the producer
    if (lane == 0) {
      uint64_t stream_policy, keep_policy;  // W is read once; X by every CTA
      if (p.variant & 2) {
        asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(stream_policy));
        keep_policy = stream_policy;
      } else {
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(stream_policy));
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep_policy));
      }
      // Stages before the wait get W only (constant); their X (the previous kernel's output) and
      // the work counter (which the previous launch resets at its end) wait for it.
      int pending_kb[C::kStages];
      bool waited = false;
      auto wait_previous = [&](int issued) {
        GridDependencyWait();
        for (int s = 0; s < issued && s < C::kStages; ++s) {
          TmaLoad(ring + s * C::kStageBytes + kWBytes, &x_map, pending_kb[s] * kTileK, 0, &full_s[s], keep_policy);
        }
        waited = true;
      };
      int i = 0;  // stages issued
      for (int unit = cta; unit < p.units;) {
        const int tile = unit / p.splits, kb0 = (unit % p.splits) * p.unit_blocks;
        const int kb1 = min(p.k_blocks, kb0 + p.unit_blocks);
        for (int kb = kb0; kb < kb1; ++kb, ++i) {
          const int s = i % C::kStages;
          if (i >= C::kStages) {
            if (!waited) wait_previous(C::kStages);  // the consumers need those stages' X first
            BarrierWait(&empty_s[s], ((i / C::kStages) - 1) & 1);
          }
          unit_s[s] = unit;
          BarrierExpect(&full_s[s], C::kStageBytes);
          TmaLoad(ring + s * C::kStageBytes, &w_map, kb * kTileK, tile * kTileN, &full_s[s], stream_policy);
          if (waited) {
            TmaLoad(ring + s * C::kStageBytes + kWBytes, &x_map, kb * kTileK, 0, &full_s[s], keep_policy);
          } else {
            pending_kb[s] = kb;
          }
        }
        if (!waited) wait_previous(i);
        // A dozen stages are in flight: the counter's round trip hides behind them.
        unit = p.units > int(gridDim.x) ? int(gridDim.x) + atomicAdd(p.work, 1) : p.units;
      }
      if (!waited) wait_previous(i);
      const int s = i % C::kStages;  // the end: a stage with no unit and no bytes
      if (i >= C::kStages) BarrierWait(&empty_s[s], ((i / C::kStages) - 1) & 1);
      unit_s[s] = -1;
      BarrierArrive(&full_s[s]);
    }
    return;
  }

  GridDependencyWait();  // y (beta) and the workspace are the previous kernel's
  TriggerDependents();
  float acc[2][2 * RT][4] = {};
  const uint32_t ring_addr = Smem(ring);
  // ldmatrix rows this lane addresses: of W (16 a matrix quad: rows, then the k half), of X (rows
  // 8 at a time, the k half first).
  const int w_row = 32 * warp + (lane & 7) + 8 * ((lane >> 3) & 1), w_half = lane >> 4;
  const int x_row = (lane & 7) + 8 * (lane >> 4), x_half = (lane >> 3) & 1;
  int unit = -1, left = 0, peek = -1;  // the unit being summed, its stages still to come
  for (int i = 0;; ++i) {
    const int s = i % C::kStages;
    BarrierWait(&full_s[s], (i / C::kStages) & 1);
    if (i == 0 && threadIdx.x == 0) Stamp(p, cta, 1);
    const int stage_unit = unit_s[s];
    if (stage_unit < 0) break;
    if (left == 0) {  // a new unit
      unit = stage_unit;
      const int kb0 = (unit % p.splits) * p.unit_blocks;
      left = min(p.k_blocks, kb0 + p.unit_blocks) - kb0;
      if (threadIdx.x == 0 && p.splits > 1) peek = LoadRelaxed(p.counters + unit / p.splits);
    }
    const uint32_t w_base = ring_addr + s * C::kStageBytes, x_base = w_base + kWBytes;
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks) {
      uint32_t b[RT][4];
#pragma unroll
      for (int q = 0; q < RT; ++q) LdMatrix4(x_base + Swizzled(16 * q + x_row, 2 * ks + x_half), b[q]);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        uint32_t a[4];
        LdMatrix4(w_base + Swizzled(w_row + 16 * mt, 2 * ks + w_half), a);
#pragma unroll
        for (int q = 0; q < RT; ++q) {
          Mma(acc[mt][2 * q], a, b[q][0], b[q][1]);
          Mma(acc[mt][2 * q + 1], a, b[q][2], b[q][3]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) BarrierArrive(&empty_s[s]);
    if (--left == 0) {
      Flush<RT>(p, unit, warp, lane, acc, peek, &flag_s);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int j = 0; j < 2 * RT; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.0f;
        }
      }
    }
  }
  if (threadIdx.x == 0) Stamp(p, cta, 2), Stamp(p, cta, 3);
  // The last CTA to finish resets the work counter for the next launch (every CTA's producer has
  // asked for its last unit before its end stage, which this CTA's consumers have seen).
  ConsumerSync();
  if (threadIdx.x == 0 && AddAcqRel(p.work + 1, 1) == int(gridDim.x) - 1) p.work[0] = 0, p.work[1] = 0;
}

// cuTensorMapEncodeTiled through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A [rows, k] fp16 matrix as 64 × box_rows tiles, 128-byte swizzled, zeros past its edges.
absl::Status Map(CUtensorMap* map, const __half* base, int k, int rows, int box_rows, bool promote) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = EncodeTiled();
  if (encode == nullptr) return absl::InternalError("SkinnyGemm: the driver has no cuTensorMapEncodeTiled");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * 2};
  const cuuint32_t box[2] = {kTileK, static_cast<cuuint32_t>(box_rows)}, unit[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<__half*>(base), dims, strides, box,
                            unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            promote ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_NONE,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled failed: CUresult ", r));
  return absl::OkStatus();
}

template <int RT>
absl::Status Launch(const SkinnyGemmArgs& a, int ctas, cudaStream_t stream) {
  using C = Config<RT>;
  CUtensorMap w_map, x_map;
  if (absl::Status s = Map(&w_map, a.w, a.k, a.n, kTileN, a.variant & 1); !s.ok()) return s;
  if (absl::Status s = Map(&x_map, a.x, a.k, a.rows, 16 * RT, a.variant & 1); !s.ok()) return s;
  Params p{};
  p.rows = a.rows, p.k = a.k, p.n = a.n, p.y = a.y, p.beta = a.beta, p.swiglu_out = a.swiglu_out;
  p.counters = static_cast<int*>(a.workspace);
  p.work = p.counters + kMaxTiles;
  p.partials = reinterpret_cast<float4*>(static_cast<char*>(a.workspace) + (kMaxTiles + 4) * sizeof(int));
  p.k_blocks = (a.k + kTileK - 1) / kTileK, p.tiles = (a.n + kTileN - 1) / kTileN;
  // About four units a CTA (balance at the end costs a unit's time), no more partial slots than
  // there are, and no unit shorter than it needs to be.
  int splits = std::max(1, std::min(p.k_blocks, (4 * ctas + p.tiles - 1) / p.tiles));
  if (a.variant & 4) splits = std::min(p.k_blocks, 2 * splits);
  if (a.variant & 8) splits = std::max(1, splits / 2);
  if (splits > 1) splits = std::max(1, std::min(splits, kMaxUnits / p.tiles));
  p.unit_blocks = (p.k_blocks + splits - 1) / splits;
  p.splits = (p.k_blocks + p.unit_blocks - 1) / p.unit_blocks;
  p.units = p.tiles * p.splits;
  p.stamps = a.stamps, p.variant = a.variant;
  ctas = std::min(ctas, p.units);
  // Once per instance (the attributes are the function's): room for the ring, and the whole of
  // shared memory's carveout (the kernel reads nothing through L1).
  static const cudaError_t opted = [] {
    const cudaError_t e = cudaFuncSetAttribute(SkinnyGemmKernel<RT>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
    return e != cudaSuccess ? e : cudaFuncSetAttribute(SkinnyGemmKernel<RT>, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  }();
  TAILSERVE_CUDA_RETURN_IF_ERROR(opted);
  TAILSERVE_CUDA_RETURN_IF_ERROR(LaunchMaybeOverlapped(a.overlap_previous, dim3(ctas), dim3(kThreads), C::kSmem,
                                                       stream, SkinnyGemmKernel<RT>, w_map, x_map, p));
  return absl::OkStatus();
}

}  // namespace

size_t SkinnyGemmWorkspaceBytes() {
  return (kMaxTiles + 4) * sizeof(int) + static_cast<size_t>(kMaxUnits) * Config<2>::kAcc * 128 * sizeof(float);
}

absl::Status SkinnyGemm(const SkinnyGemmArgs& a, cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (a.rows < 1 || a.rows > kSkinnyGemmMaxRows || a.k <= 0 || a.k % 8 != 0 || a.n <= 0 ||
      a.n > kMaxTiles * kTileN || a.x == nullptr || a.w == nullptr || (a.y == nullptr) == (a.swiglu_out == nullptr) ||
      (a.swiglu_out != nullptr && a.n % 2 != 0) || !aligned(a.x) || !aligned(a.w)) {
    return absl::InvalidArgumentError(
        "SkinnyGemm: 1..32 rows, k a multiple of 8, n ≤ 524288, one output (SwiGLU: n even), x and w 16-byte "
        "aligned");
  }
  int ctas = a.ctas;
  if (ctas <= 0) {
    int device = 0;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&ctas, cudaDevAttrMultiProcessorCount, device));
  }
  if (ctas > kMaxCtas || a.workspace == nullptr || a.workspace_bytes < SkinnyGemmWorkspaceBytes()) {
    return absl::InvalidArgumentError(absl::StrCat("SkinnyGemm: a workspace of ", SkinnyGemmWorkspaceBytes(),
                                                   " bytes and at most ", kMaxCtas, " CTAs"));
  }
  if (a.rows <= 16) return Launch<1>(a, ctas, stream);
  return Launch<2>(a, ctas, stream);
}

}  // namespace tailserve::cuda
