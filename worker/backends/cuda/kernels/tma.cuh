#pragma once
// The Hopper copy machinery the persistent GEMM kernels share (stream_gemm.cu, attention_block.cu):
// mbarriers, 2D and boxes-along-k TMA tile loads with an L2 cache hint, ldmatrix over the TMA's
// 128-byte swizzle and the m16n8k16 MMA it feeds, an acquire load for cross-CTA counters, and the
// host side's tensor-map encoding.
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tailserve::cuda::tma {

inline constexpr int kBoxK = 64;  // k elements a box: one 128-byte swizzle row of fp16

__device__ __forceinline__ int LoadAcquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
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
// `boxes` such tiles in a row along k in one copy (a map from MapBoxes), landing one after
// another: a copy per stage instead of one per box, since the producer lane's issue is what caps
// a ring's rate (docs/cuda-decode.md). k_box: the first tile's k / kBoxK.
__device__ __forceinline__ void TmaLoadBoxes(void* dst, const CUtensorMap* map, int k_box, int row0, uint64_t* bar,
                                             uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(Smem(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(row0), "r"(k_box), "r"(Smem(bar)), "l"(policy)
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

// cuTensorMapEncodeTiled through the runtime (no link against libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
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

// The encoding both maps share: fp16, 128-byte swizzle, no L2 promotion, zeros past the edges.
template <int kRank>
absl::Status Encode(CUtensorMap* map, const __half* base, const cuuint64_t (&dims)[kRank],
                    const cuuint64_t (&strides)[kRank - 1], const cuuint32_t (&box)[kRank]) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = EncodeTiled();
  if (encode == nullptr) return absl::InternalError("the driver has no cuTensorMapEncodeTiled");
  cuuint32_t unit[kRank];
  for (cuuint32_t& u : unit) u = 1;
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, kRank, const_cast<__half*>(base), dims, strides, box,
                            unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled (", kRank, "D) failed: CUresult ", r));
  }
  return absl::OkStatus();
}

// A [rows, k] fp16 matrix (k a multiple of kBoxK) for TmaLoadBoxes: viewed as [k / kBoxK, rows,
// kBoxK], a copy takes `boxes` kBoxK × box_rows tiles along k, each laid out as Map's.
inline absl::Status MapBoxes(CUtensorMap* map, const __half* base, int k, int rows, int box_rows, int boxes) {
  if (k % kBoxK != 0) return absl::InvalidArgumentError("MapBoxes: k a multiple of 64");
  return Encode<3>(map, base,
                   {static_cast<cuuint64_t>(kBoxK), static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(k / kBoxK)},
                   {static_cast<cuuint64_t>(k) * 2, kBoxK * 2},
                   {kBoxK, static_cast<cuuint32_t>(box_rows), static_cast<cuuint32_t>(boxes)});
}

// A [rows, k] fp16 matrix as kBoxK × box_rows tiles, 128-byte swizzled, zeros past its edges.
inline absl::Status Map(CUtensorMap* map, const __half* base, int k, int rows, int box_rows) {
  return Encode<2>(map, base, {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)},
                   {static_cast<cuuint64_t>(k) * 2}, {kBoxK, static_cast<cuuint32_t>(box_rows)});
}

}  // namespace tailserve::cuda::tma
