#include "worker/backends/cuda/kernels/attention_block.h"

#include <algorithm>
#include <type_traits>

#include "common/status_macros.h"
#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/attention_block_attend.cuh"
#include "worker/backends/cuda/kernels/attention_block_o.cuh"
#include "worker/backends/cuda/kernels/attention_block_shared.cuh"
#include "worker/backends/cuda/per_device.h"

namespace tailserve::cuda {
namespace attention_block {
namespace {

// Grid (S, kv_heads), kThreads threads, SmemBytes<HD>() of dynamic shared memory. The producer
// warp streams W_o (ProduceWo); the consumer warps attend (Attend), then project o (ProjectO).
template <KvDtype D, int HD>
__global__ void __launch_bounds__(kThreads, 1)
    AttentionBlockKernel(const __grid_constant__ CUtensorMap wo_map, const __grid_constant__ Params p) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full_s[kStages], empty_s[kStages];
  __shared__ __align__(8) uint64_t keys_issued_s;
  __shared__ alignas(16) float fresh_s[2][HD];
  __shared__ alignas(16) uint8_t new_row_s[2][HD];
  __shared__ float new_scale_s[2];
  __shared__ alignas(16) float scale_s[kWarps][kKeyStages + 1][32];
  unsigned char* ring = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  float* q_s = reinterpret_cast<float*>(ring + kStages * kStageBytes + kWarps * 2 * sizeof(Stage<HD>));
  static_assert((kWarps * 2 * sizeof(Stage<HD>) + 8 * HD * 4) % 1024 == 0, "aux is a swizzle base");
  const Shared<HD> sm{.ring = ring,
                      .stages = reinterpret_cast<Stage<HD>(*)[2]>(ring + kStages * kStageBytes),
                      .q_s = q_s,
                      .aux = reinterpret_cast<unsigned char*>(q_s + 8 * HD),
                      .full_s = full_s,
                      .empty_s = empty_s,
                      .keys_issued_s = &keys_issued_s,
                      .fresh_s = &fresh_s,
                      .new_row_s = new_row_s,
                      .new_scale_s = new_scale_s,
                      .scale_s = scale_s};
  const int ci = blockIdx.x, g = blockIdx.y;  // the CTA within its group, the group (KV head)
  if (threadIdx.x == 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&wo_map)) : "memory");
    for (int s = 0; s < kStages; ++s) tma::BarrierInit(&full_s[s], 1), tma::BarrierInit(&empty_s[s], kWarps);
    tma::BarrierInit(&keys_issued_s, kWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    Stamp(p, 0);
    if (Timed(p.timeline)) {  // not a time: the SM, + 1 (0 reads as no stamp)
      uint32_t sm_id;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_id));
      Record(p, kAttentionBlockSmSlot, sm_id + 1);
    }
  }
  __syncthreads();
  if ((threadIdx.x >> 5) == kWarps) {
    ProduceWo<HD>(p, sm, wo_map, ci, g);
    __syncwarp();
  } else {
    Attend<D, HD>(p, sm, ci, g);
    ProjectO<HD>(p, sm, ci, g);
  }
  // The last CTA out leaves the counters zeroed for the next launch: every CTA has passed every
  // wait before it counts itself finished.
  __syncthreads();
  if (threadIdx.x == 0) {
    Stamp(p, 6);
    __threadfence();
    const int total = static_cast<int>(gridDim.x * gridDim.y);
    if (atomicAdd(p.counters + p.kvh, 1) == total - 1) {
      __threadfence();
      for (int i = 0; i <= p.kvh; ++i) p.counters[i] = 0;
      __threadfence();
    }
  }
}

// Calls f(dtype tag, head_dim tag) for the geometry's instance (FP8, head_dim 32/64/128).
template <typename F>
auto WithInstance(const KvGeometry& g, F&& f) {
  auto by_dim = [&](auto dtype_tag) {
    if (g.head_dim == 32) return f(dtype_tag, std::integral_constant<int, 32>{});
    if (g.head_dim == 64) return f(dtype_tag, std::integral_constant<int, 64>{});
    return f(dtype_tag, std::integral_constant<int, 128>{});
  };
  if (g.dtype == KvDtype::kFp8E5M2) return by_dim(std::integral_constant<KvDtype, KvDtype::kFp8E5M2>{});
  return by_dim(std::integral_constant<KvDtype, KvDtype::kFp8E4M3>{});
}

// S: the CTAs of a group, as many as fit (16 at most) with the whole grid resident at once.
int GroupCtas(int sms, int kv_heads) { return std::min(kMaxGroupCtas, kv_heads > 0 ? sms / kv_heads : 0); }

}  // namespace
}  // namespace attention_block

absl::Status AttentionBlockTakes(int rows, int hidden, int heads, const KvGeometry& g, int sliding_window) {
  using namespace attention_block;  // NOLINT: the launch's own constants
  absl::StatusOr<int> sms = CurrentDeviceSmCount();
  if (!sms.ok()) return sms.status();
  const int kvh = g.kv_heads, hd = g.head_dim;
  const int ctas = GroupCtas(*sms, kvh);
  if (g.dtype == KvDtype::kFp16 || (hd != 32 && hd != 64 && hd != 128)) {
    return absl::InvalidArgumentError("AttentionBlock: an FP8 cache with head_dim 32, 64 or 128");
  }
  if (kvh <= 0 || heads % kvh != 0 || heads / kvh > 8 || sliding_window < 0) {
    return absl::InvalidArgumentError("AttentionBlock: 1-8 query heads a KV head");
  }
  if ((static_cast<size_t>(kvh) + 1) * sizeof(int) > kAttentionBlockWorkspaceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("AttentionBlock: ", kvh, " KV heads outgrow the counters"));
  }
  const int group = heads / kvh;
  if (rows < 1 || rows > std::min(kMaxRows, ctas)) {
    return absl::InvalidArgumentError(absl::StrCat("AttentionBlock: 1..", std::min(kMaxRows, ctas), " rows"));
  }
  if (group * hd % tma::kBoxK != 0 || group * hd > kMaxGroupDims || hidden % (16 * ctas) != 0 ||
      hidden / (16 * ctas) > kMaxOTiles) {
    return absl::InvalidArgumentError(absl::StrCat("AttentionBlock: a shape it does not tile (hidden ", hidden,
                                                   ", group ", group, ", head_dim ", hd, ", ", ctas, " CTAs a group)"));
  }
  return absl::OkStatus();
}

absl::Status AttentionBlock(const AttentionBlockArgs& a, cudaStream_t stream) {
  using namespace attention_block;  // NOLINT: the launch's own constants
  TAILSERVE_RETURN_IF_ERROR(AttentionBlockTakes(a.rows, a.hidden, a.heads, a.geometry, a.sliding_window));
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const Partials parts = a.qkv_parts.OrNone();
  const int64_t width = int64_t{a.rows} * (a.heads + 2 * a.geometry.kv_heads) * a.geometry.head_dim;
  if (parts.count < 1 || parts.count > kMaxPartials || parts.stride < width) {
    return absl::InvalidArgumentError(
        absl::StrCat("AttentionBlock: q/k/v as 1..", kMaxPartials, " partials of [rows, q/k/v width] each"));
  }
  if (a.w_o == nullptr || !aligned(a.w_o) || !aligned(a.attn) || a.attn == nullptr || a.x == nullptr || !aligned(a.x) ||
      a.inv_freq == nullptr || a.clamps == nullptr || a.workspace == nullptr || a.meta.pos == nullptr ||
      a.meta.seq == nullptr || a.meta.block_table == nullptr) {
    return absl::InvalidArgumentError(
        "AttentionBlock: w_o, attn and x 16-byte aligned; inv_freq, clamps, the row metadata and a workspace");
  }
  if (a.timeline != nullptr && !kTimelineBuild) {
    return absl::InvalidArgumentError("AttentionBlock: a timeline needs the kernels built with TAILSERVE_KERNEL_TIMELINE");
  }
  absl::StatusOr<int> sms = CurrentDeviceSmCount();
  if (!sms.ok()) return sms.status();
  const KvGeometry& g = a.geometry;
  Params p{};
  p.rows = a.rows, p.hidden = a.hidden, p.heads = a.heads, p.kvh = g.kv_heads, p.group = a.heads / g.kv_heads;
  p.qd = a.heads * g.head_dim, p.qkvw = (a.heads + 2 * g.kv_heads) * g.head_dim;
  p.ctas = GroupCtas(*sms, g.kv_heads);
  p.o_tiles = a.hidden / (16 * p.ctas);
  p.o_boxes = p.group * g.head_dim / tma::kBoxK;
  p.sliding_window = a.sliding_window, p.scale = a.scale, p.bias = a.bias, p.inv_freq = a.inv_freq;
  p.parts = parts;
  p.meta = a.meta, p.g = g, p.layer = a.layer;
  p.attn = a.attn, p.x = a.x, p.clamps = a.clamps, p.counters = static_cast<int*>(a.workspace);
  p.overlap = a.overlap_previous, p.timeline = a.timeline;
  CUtensorMap wo_map{};
  TAILSERVE_RETURN_IF_ERROR(tma::Map(&wo_map, a.w_o, p.qd, a.hidden, 16 * p.o_tiles));
  cudaError_t launched = cudaSuccess;
  WithInstance(g, [&](auto dtype_tag, auto hd_tag) {
    constexpr KvDtype D = decltype(dtype_tag)::value;
    constexpr int HD = decltype(hd_tag)::value;
    auto kernel = AttentionBlockKernel<D, HD>;
    constexpr int smem = SmemBytes<HD>();
    static PerDeviceInt opted;  // the instance's shared-memory attribute, once a device
    absl::Status set = opted
                           .Get([&]() -> absl::StatusOr<int> {
                             TAILSERVE_CUDA_RETURN_IF_ERROR(
                                 cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                             return 1;
                           })
                           .status();
    if (!set.ok()) {
      launched = cudaErrorInvalidConfiguration;
      return;
    }
    launched = LaunchMaybeOverlapped(a.overlap_previous, dim3(p.ctas, g.kv_heads), dim3(kThreads), smem, stream,
                                     kernel, wo_map, p);
  });
  TAILSERVE_CUDA_RETURN_IF_ERROR(launched);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
