// The decode attention block at 2-16 rows: the engine's three kernels (cuBLASLt's q/k/v, the
// 16-warp attention, cuBLASLt's o) against cuBLASLt's q/k/v followed by AttentionBlock (the
// attention and o in one launch, the engine's path at 4-16 rows), then one AttentionBlock
// launch's timeline: when each CTA's phases end, each warp's key tiles, its slowest CTAs.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/kernels/common.h"
#include "bench/kernels/modes.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/kernels/attention.h"
#include "worker/backends/cuda/kernels/attention_block.h"
#include "worker/backends/cuda/plan/decode_plan.h"

namespace tailserve::bench {
namespace {

// One launch's stamps (AttentionBlockArgs::timeline) for its first `ctas` CTAs, as µs after the
// earliest CTA's start.
class BlockTimeline {
 public:
  BlockTimeline(std::vector<uint64_t> t, int ctas) : t_(std::move(t)), ctas_(ctas) {
    for (int b = 0; b < ctas_; ++b) t0_ = std::min(t0_, Cta(b, 0));
  }

  uint64_t Cta(int b, int which) const { return t_[size_t(b) * cuda::kAttentionBlockStamps + which]; }
  // Event e of warp w's key tile i in CTA b.
  uint64_t Tile(int b, int w, int i, int e) const {
    return Cta(b, cuda::kAttentionBlockCtaStamps +
                      (w * cuda::kAttentionBlockStampedTiles + i) * cuda::kAttentionBlockTileEvents + e);
  }
  double Us(uint64_t x) const { return (double(x) - double(t0_)) / 1e3; }
  std::string UsCell(uint64_t x) const { return x == 0 ? std::string("-") : absl::StrFormat("%.2f", Us(x)); }

  // [stamp] = {median, max} over the CTAs that wrote it; {-1, -1}: none did.
  std::vector<std::pair<double, double>> CtaStamps() const {
    std::vector<std::pair<double, double>> out(cuda::kAttentionBlockCtaStamps, {-1.0, -1.0});
    for (int which = 0; which < cuda::kAttentionBlockCtaStamps; ++which) {
      if (which == cuda::kAttentionBlockSmSlot) continue;
      std::vector<double> v;
      for (int b = 0; b < ctas_; ++b) {
        if (Cta(b, which) != 0) v.push_back(Us(Cta(b, which)));
      }
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      out[which] = {v[v.size() / 2], v.back()};
    }
    return out;
  }

  // The key tiles' stamps as a table: median (p90) over CTAs and warps.
  std::string KeyTiles() const {
    auto cell = [](std::vector<double> v) {
      if (v.empty()) return std::string("-");
      std::sort(v.begin(), v.end());
      return absl::StrFormat("%.2f (%.2f)", v[v.size() / 2], v[v.size() * 9 / 10]);
    };
    std::string out =
        "| key tile of a warp | issue begun | issued | landed | computed | block-table load "
        "(issued − begun) | in flight (landed − issued) | compute (computed − landed) | "
        "compute, SM cycles |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    constexpr int kTimes = 4;  // the tile's events that are times; the fifth counts cycles
    static_assert(cuda::kAttentionBlockTileEvents == kTimes + 1);
    for (int i = 0; i < cuda::kAttentionBlockStampedTiles; ++i) {
      std::vector<double> ev[kTimes], gap[3], cycles;
      for (int b = 0; b < ctas_; ++b) {
        for (int w = 0; w < cuda::kAttentionBlockStampedWarps; ++w) {
          if (Tile(b, w, i, 3) != 0) cycles.push_back(double(Tile(b, w, i, kTimes)));
          bool all = true;
          for (int e = 0; e < kTimes; ++e) {
            if (Tile(b, w, i, e) == 0) {
              all = false;
              continue;
            }
            ev[e].push_back(Us(Tile(b, w, i, e)));
          }
          if (!all) continue;
          for (int e = 0; e < 3; ++e) gap[e].push_back((double(Tile(b, w, i, e + 1)) - double(Tile(b, w, i, e))) / 1e3);
        }
      }
      absl::StrAppend(&out, "| ", i, " | ", cell(ev[0]), " | ", cell(ev[1]), " | ", cell(ev[2]), " | ", cell(ev[3]),
                      " | ", cell(gap[0]), " | ", cell(gap[1]), " | ", cell(gap[2]), " | ", cell(cycles), " |\n");
    }
    return out;
  }

  // o waits for its group's last CTA: the four whose keys were computed last (stamp 8), the warp
  // that held each (the writer of the new position is warp (pos / 16) % 8) and its tiles.
  std::string SlowestCtas(int kv_heads) const {
    constexpr int kKeysComputed = 8;
    const int per_group = ctas_ / kv_heads;
    std::vector<int> late;
    for (int b = 0; b < ctas_; ++b) {
      if (Cta(b, kKeysComputed) != 0) late.push_back(b);
    }
    std::sort(late.begin(), late.end(), [&](int a, int b) { return Cta(a, kKeysComputed) > Cta(b, kKeysComputed); });
    std::string out =
        "\nits slowest CTAs (every warp's keys computed, latest first; µs as above)\n\n"
        "| CTA (group.index) | SM | keys computed | warp last done | its tiles landed | its tiles "
        "computed | the CTA's median warp done |\n|---|---:|---:|---:|---|---|---:|\n";
    for (size_t j = 0; j < std::min<size_t>(4, late.size()); ++j) {
      const int b = late[j];
      std::vector<uint64_t> done(cuda::kAttentionBlockStampedWarps, 0);  // a warp's last tile computed
      for (int w = 0; w < cuda::kAttentionBlockStampedWarps; ++w) {
        for (int i = 0; i < cuda::kAttentionBlockStampedTiles; ++i) done[w] = std::max(done[w], Tile(b, w, i, 3));
      }
      const int slow = static_cast<int>(std::max_element(done.begin(), done.end()) - done.begin());
      std::sort(done.begin(), done.end());
      std::string landed, computed;
      for (int i = 0; i < cuda::kAttentionBlockStampedTiles; ++i) {
        absl::StrAppend(&landed, i ? " / " : "", UsCell(Tile(b, slow, i, 2)));
        absl::StrAppend(&computed, i ? " / " : "", UsCell(Tile(b, slow, i, 3)));
      }
      absl::StrAppend(&out, "| ", b / per_group, ".", b % per_group, " | ",
                      int64_t(Cta(b, cuda::kAttentionBlockSmSlot)) - 1, " | ", UsCell(Cta(b, kKeysComputed)), " | ",
                      slow, " | ", landed, " | ", computed, " | ", UsCell(done[done.size() / 2]), " |\n");
    }
    return out;
  }

 private:
  std::vector<uint64_t> t_;
  int ctas_;
  uint64_t t0_ = ~uint64_t{0};
};

// The CTA stamps' names (AttentionBlockArgs::timeline), and the order the table lists them in.
constexpr const char* kStampNames[] = {"start", "(unused)", "attention starts", "attention ends", "o starts",
                                       "o products done (before the adds into x)", "end",
                                       "RoPE done (q in shared memory)", "every warp's keys computed",
                                       "heads merged and written (before the count)", "SM + 1 (not a time)"};
static_assert(std::size(kStampNames) == cuda::kAttentionBlockCtaStamps);
constexpr int kStampOrder[] = {0, 2, 7, 8, 9, 3, 4, 5, 6};

// The timeline's tables for one launch.
std::string TimelineTables(const BlockTimeline& t, int rows, int context, int kv_heads) {
  const std::vector<std::pair<double, double>> stamps = t.CtaStamps();
  std::string out = absl::StrCat("\ntimeline (q/k/v given), ", rows, " rows, ", context,
                                 " tokens (µs after the first CTA's start)\n\n",
                                 "| stamp | median | max |\n|---|---:|---:|\n");
  for (int k : kStampOrder) {
    if (stamps[k].first < 0) continue;
    absl::StrAppend(&out, "| ", kStampNames[k], " | ", absl::StrFormat("%.2f", stamps[k].first), " | ",
                    absl::StrFormat("%.2f", stamps[k].second), " |\n");
  }
  absl::StrAppend(&out, "\nits key tiles (µs after the first CTA's start; median (p90) over CTAs and warps)\n\n",
                  t.KeyTiles(), t.SlowestCtas(kv_heads));
  return out;
}

}  // namespace

// Weights and KV rotate past L2. The timelines print after the timed table.
absl::Status BenchAttentionBlock(const BenchConfig& c) {
  const Shape& m = c.m;
  cudaStream_t s = c.stream;
  const int h = m.hidden, hd = m.head_dim, kvh = m.kv_heads, qd = m.heads * hd, qkvw = qd + 2 * kvh * hd;
  TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies wqkv, WeightCopies(size_t(qkvw) * h * 2));
  TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies wo, WeightCopies(size_t(h) * qd * 2));
  const int max_rows = 16;
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory xn, Filled(size_t(max_rows) * h * 2, 0x2c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory x, Filled(size_t(max_rows) * h * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory qkv, Filled(size_t(max_rows) * qkvw * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory parts, Filled(size_t(cuda::kDecodeKSplits) * max_rows * qkvw * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory attn, Filled(size_t(max_rows) * qd * 2, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory o_parts, Filled(size_t(cuda::kDecodeKSplits) * max_rows * h * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory clamps, Filled(8, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory block_ws, Filled(cuda::kAttentionBlockWorkspaceBytes, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory inv, Filled(size_t(hd / 2) * 4, 0x3c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory attn_ws, DeviceAlloc(size_t(64) << 20));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory work, DeviceAlloc(32 << 20));
  TAILSERVE_ASSIGN_OR_RETURN(const int sms, SmCount());
  const size_t timeline_bytes = size_t(sms) * cuda::kAttentionBlockStamps * 8;
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory timeline, Filled(timeline_bytes, 0));
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cuda::GemmRunner> gemm, cuda::GemmRunner::Create(s, work.get(), 32 << 20));
  const auto* xn16 = static_cast<const __half*>(xn.get());
  auto* attn16 = static_cast<__half*>(attn.get());
  auto* parts32 = static_cast<float*>(parts.get());
  auto* count = static_cast<unsigned long long*>(clamps.get());
  const int64_t parts_stride = int64_t{max_rows} * qkvw;
  std::printf("\nattention block: %s cache, weights %.1f MB, rotating past L2\n\n", KvDtypeName(c.kv),
              (double(qkvw) * h + double(h) * qd) * 2 / 1e6);
  std::printf("| rows | context | cuBLASLt q/k/v µs | q/k/v + attention + o µs | cuBLASLt q/k/v + "
              "AttentionBlock (attention + o) µs | bytes at 4.26 TB/s µs |\n"
              "|---:|---:|---:|---:|---:|---:|\n");
  std::vector<std::string> timelines;
  for (int rows : c.rows) {
    if (rows < 2 || rows > max_rows) continue;
    for (int context : c.contexts) {
      TAILSERVE_ASSIGN_OR_RETURN(AttentionInputs in, MakeAttentionInputs(m, c.kv, rows, context, false));
      TAILSERVE_RETURN_IF_ERROR(cuda::AttentionBlockTakes(rows, h, m.heads, in.g, 0));
      // The engine's attention without the block: 16 warps, new_kv, RoPE summing q/k/v's chunks.
      const cuda::AttentionShape shape{
          .rows = rows, .heads = m.heads, .q_stride = qkvw, .splits = 1, .scale = 1.0f / std::sqrt(float(hd)),
          .new_kv = true, .overlap_previous = true, .warps = 16,
          .rope = {.inv_freq = static_cast<const float*>(inv.get()),
                   .parts = {parts32, cuda::kDecodeKSplits, parts_stride}}};
      int qkv_chunks = 0;
      auto qkv_gemm = [&]() -> absl::Status {
        TAILSERVE_ASSIGN_OR_RETURN(
            qkv_chunks, gemm->RunSplitK(xn16, rows, h, wqkv.Next(), qkvw, cuda::kDecodeKSplits, parts32, parts_stride));
        return absl::OkStatus();
      };
      auto unfused = [&]() -> absl::Status {
        TAILSERVE_RETURN_IF_ERROR(qkv_gemm());
        TAILSERVE_RETURN_IF_ERROR(cuda::PagedAttention(static_cast<const float*>(qkv.get()), shape, in.meta, in.g,
                                                       in.Layer(), static_cast<float*>(attn_ws.get()), attn16, s,
                                                       count));
        return gemm->RunSplitK(attn16, rows, qd, wo.Next(), h, cuda::kDecodeKSplits, static_cast<float*>(o_parts.get()),
                               int64_t{max_rows} * h)
            .status();
      };
      // q/k/v from qkv_gemm's partials, the launch programmatic after it as in the engine.
      auto block = [&](uint64_t* stamps) {
        return cuda::AttentionBlock(
            {.rows = rows, .hidden = h, .heads = m.heads, .w_o = wo.Next(),
             .inv_freq = static_cast<const float*>(inv.get()), .scale = 1.0f / std::sqrt(float(hd)),
             .meta = in.meta, .geometry = in.g, .layer = in.Layer(),
             .qkv_parts = cuda::Partials{parts32, qkv_chunks, parts_stride}, .attn = attn16,
             .x = static_cast<float*>(x.get()), .clamps = count, .workspace = block_ws.get(),
             .overlap_previous = true, .timeline = stamps},
            s);
      };
      gemm->set_tuning(true);
      TAILSERVE_RETURN_IF_ERROR(unfused());
      gemm->set_tuning(false);
      TAILSERVE_ASSIGN_OR_RETURN(const double qkv_alone, TimeGraph(s, c.reps, qkv_gemm));
      TAILSERVE_ASSIGN_OR_RETURN(const double base, TimeGraph(s, c.reps, unfused));
      TAILSERVE_ASSIGN_OR_RETURN(const double after_qkv, TimeGraph(s, c.reps, [&]() -> absl::Status {
                                   TAILSERVE_RETURN_IF_ERROR(qkv_gemm());
                                   return block(nullptr);
                                 }));
      const double bytes = (double(qkvw) * h + double(h) * qd) * 2 + in.kv_bytes;
      std::printf("| %d | %d | %.1f | %.1f | %.1f | %.1f |\n", rows, context, qkv_alone, base, after_qkv,
                  bytes / kCopyBandwidth * 1e6);
      // One launch's timeline: the block alone, q/k/v's partials left by the runs above.
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(timeline.get(), 0, timeline_bytes));
      TAILSERVE_RETURN_IF_ERROR(block(static_cast<uint64_t*>(timeline.get())));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
      const int ctas = std::min(16, sms / kvh) * kvh;  // the grid: up to 16 CTAs a KV-head group
      std::vector<uint64_t> t(size_t(ctas) * cuda::kAttentionBlockStamps);
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(t.data(), timeline.get(), t.size() * 8, cudaMemcpyDeviceToHost));
      timelines.push_back(TimelineTables(BlockTimeline(std::move(t), ctas), rows, context, kvh));
    }
  }
  for (const std::string& table : timelines) std::printf("%s", table.c_str());
  return absl::OkStatus();
}

}  // namespace tailserve::bench
