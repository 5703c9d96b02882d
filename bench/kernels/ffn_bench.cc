// The MLP block's forms at 2+ rows: cuBLASLt's chain on one stream (the engine above 16 rows), two
// halves on graph branches, one StreamFfn launch (the engine at 3-16 rows) over its (chunks, lag,
// k boxes, last chunks) shapes, and chains of StreamGemm launches; then StreamFfn's timeline: where
// one launch's time goes beyond its bytes.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/kernels/common.h"
#include "bench/kernels/modes.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/kernels/rows.h"
#include "worker/backends/cuda/kernels/stream_gemm.h"
#include "worker/backends/cuda/plan/decode_plan.h"

namespace tailserve::bench {
namespace {

// StreamFfn's (chunks, lag, k boxes a stage, last chunk, last chunks) shapes the MLP bench times.
// The lag (in gate/up groups) must cover a gate/up item's time in flight, or down's first items
// wait; the chunks set the size of down's items, which the tail is made of (lag = chunks: every
// gate/up item first, then down's). Smaller last chunks shorten the tail (the 8B's 14336 =
// 3 · 4096 + 2048, 2 · 5120 + 2 · 2048, 2 · 4608 + 2 · 2560, 6656 + 3 · 2560, 8192 + 3 · 2048,
// 9728 + 3 · 1536). More than 4 chunks would be more partials than the next norm adds; 8 and 16
// lost or tied (docs/cuda-decode.md section 5).
constexpr std::tuple<int, int, int, int, int> kStreamFfnShapes[] = {
    {4, 3, 2, 0, 1},    {8, 6, 2, 0, 1},    {4, 3, 4, 0, 1},    {4, 4, 4, 0, 1},    {4, 3, 4, 2048, 1},
    {4, 3, 4, 2048, 2}, {4, 2, 4, 2048, 2}, {4, 3, 4, 2560, 2},
    {4, cuda::kStreamFfnLag, 4, 2560, cuda::kStreamFfnLastChunks},  // the engine's at the 8B shape
    {4, 3, 4, 2048, 3}, {4, 3, 4, 1536, 3}, {4, 2, 4, 2560, 3}};

// The row label's suffix for a StreamFfn shape's k boxes and last chunks (the defaults: none).
std::string StreamFfnShapeSuffix(int k_boxes, int last_chunk, int last_chunks) {
  return absl::StrCat(k_boxes == 2 ? "" : absl::StrCat(", ", k_boxes, " k boxes a stage"),
                      last_chunk == 0 ? ""
                      : last_chunks == 1 ? absl::StrCat(", last chunk ", last_chunk)
                                         : absl::StrCat(", last ", last_chunks, " chunks ", last_chunk));
}

// Streams, runners and buffers of the MLP forms at up to `max_rows` rows.
struct MlpSetup {
  int sms = 0;
  CudaStream sa, sb, sl;  // A and B at the device's greatest priority, the low-priority B at its least
  std::unique_ptr<cuda::GemmRunner> gemm_a, gemm_b, gemm_l;
  DeviceMemory x16, gu, act, y, y2, work_a, work_b, work_l;
  DeviceMemory counters, partials;         // StreamFfn's: its counters and down's k-chunk partials
  DeviceMemory gu_parts, chain_counters;   // the StreamGemm chain's: gate/up's partials, a region a projection
  RotatingCopies w;  // whole-MLP weight copies: gate/up then down
  CudaEvent fork, mid, join;
};

absl::StatusOr<std::unique_ptr<MlpSetup>> MakeMlpSetup(const Shape& m, int max_rows) {
  auto u = std::make_unique<MlpSetup>();
  const int h = m.hidden, f = m.ffn;
  TAILSERVE_ASSIGN_OR_RETURN(u->sms, SmCount());
  // The least priority is also the default: the engine's streams have it.
  int lo_prio = 0, hi_prio = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&lo_prio, &hi_prio));
  for (auto [stream, prio] : {std::pair{&u->sa, hi_prio}, {&u->sb, hi_prio}, {&u->sl, lo_prio}}) {
    cudaStream_t raw = nullptr;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&raw, cudaStreamNonBlocking, prio));
    *stream = CudaStream(raw);
  }
  TAILSERVE_ASSIGN_OR_RETURN(u->x16, Filled(size_t(max_rows) * h * 2, 0x2c));
  TAILSERVE_ASSIGN_OR_RETURN(u->gu, Filled(size_t(max_rows) * 2 * f * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(u->act, Filled(size_t(max_rows) * f * 2, 0));
  TAILSERVE_ASSIGN_OR_RETURN(u->y, Filled(size_t(max_rows) * h * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(u->y2, Filled(size_t(max_rows) * h * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(u->counters, Filled(cuda::kStreamGemmWorkspaceBytes, 0));
  TAILSERVE_ASSIGN_OR_RETURN(u->partials, Filled(size_t(8) * max_rows * h * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(u->gu_parts, Filled(size_t(2) * max_rows * 2 * f * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(u->chain_counters, Filled(2 * cuda::kStreamGemmWorkspaceBytes, 0));
  for (auto [work, gemm, stream] : {std::tuple{&u->work_a, &u->gemm_a, &u->sa}, {&u->work_b, &u->gemm_b, &u->sb},
                                    {&u->work_l, &u->gemm_l, &u->sl}}) {
    TAILSERVE_ASSIGN_OR_RETURN(*work, DeviceAlloc(32 << 20));
    TAILSERVE_ASSIGN_OR_RETURN(*gemm, cuda::GemmRunner::Create(stream->get(), work->get(), 32 << 20));
  }
  // Weight copies of the whole MLP (352 MB at the 8B shape): each timed MLP reads its own from
  // DRAM. A half's weights are the first or second half of a copy's bytes.
  TAILSERVE_ASSIGN_OR_RETURN(u->w, RotatingCopies::Make((size_t(2) * f * h + size_t(h) * f) * 2, 3));
  TAILSERVE_ASSIGN_OR_RETURN(u->fork, MakeEvent());
  TAILSERVE_ASSIGN_OR_RETURN(u->mid, MakeEvent());
  TAILSERVE_ASSIGN_OR_RETURN(u->join, MakeEvent());
  return u;
}

// One StreamFfn launch (weights from DRAM) with its %globaltimer timeline, summarised as a table
// row: where the launch's time goes beyond its bytes (the ramp, items' streaming rate an SM,
// down's waits for act, the tail).
absl::Status StreamFfnTimeline(const Shape& m, int rows, int chunks, int lag, int k_boxes, int last_chunk,
                               int last_chunks, int ctas, MlpSetup& u) {
  const int h = m.hidden, f = m.ffn;
  const std::vector<bool> down = cuda::StreamFfnItemIsDown(h, f, chunks, lag, last_chunk, last_chunks);
  const int items = static_cast<int>(down.size());
  // Room for a CTA an item, the most the launch takes; the CTAs that ran are those with an end.
  const size_t words = size_t(4) * items + 6 * items;
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory buf, Filled(words * 8, 0));
  const size_t gu_elems = size_t(2) * f * h;
  std::vector<uint64_t> t(words);
  for (int rep = 0; rep < 3; ++rep) {  // the last of three: the function attributes set, clocks up
    const __half* wc = u.w.Next<const __half>();
    TAILSERVE_RETURN_IF_ERROR(cuda::StreamFfn(
        {.x = static_cast<const __half*>(u.x16.get()), .rows = rows, .hidden = h, .w_gate_up = wc, .ffn = f,
         .w_down = wc + gu_elems, .act = static_cast<__half*>(u.act.get()), .chunks = chunks, .lag = lag,
         .partials = static_cast<float*>(u.partials.get()), .partial_stride = int64_t(rows) * h,
         .workspace = u.counters.get(), .ctas = ctas, .k_boxes = k_boxes, .last_chunk = last_chunk,
         .last_chunks = last_chunks, .timeline = static_cast<uint64_t*>(buf.get())},
        u.sa.get()));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(u.sa.get()));
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(t.data(), buf.get(), words * 8, cudaMemcpyDeviceToHost));
  int ran = 0;  // CTAs that ran
  const uint64_t* cta = t.data() + 4 * items;  // 6 words a CTA
  while (ran < items && cta[6 * ran + 1] != 0) ++ran;
  uint64_t t0 = ~0ull, t_end = 0;
  std::vector<double> ends;
  double consumer_waits = 0, producer_waits = 0;  // shares of each CTA's cycles, summed
  for (int b = 0; b < ran; ++b) {
    t0 = std::min(t0, cta[6 * b]);
    t_end = std::max(t_end, cta[6 * b + 1]);
    const double cycles = std::max<double>(1, double(cta[6 * b + 3] - cta[6 * b + 2]));
    consumer_waits += cta[6 * b + 4] / cycles, producer_waits += cta[6 * b + 5] / cycles;
  }
  for (int b = 0; b < ran; ++b) ends.push_back((cta[6 * b + 1] - t0) * 1e-3);
  std::sort(ends.begin(), ends.end());
  // Per SM, items in the order they finished: an item's service time is from the previous one's
  // finish (the first's from the launch's start: its ramp).
  std::vector<std::vector<int>> by_sm(1024);
  for (int i = 0; i < items; ++i) by_sm[t[4 * i + 3] % 1024].push_back(i);
  double service[2] = {0, 0}, first_done = 0;
  int n_service[2] = {0, 0}, firsts = 0;
  for (auto& list : by_sm) {
    if (list.empty()) continue;
    std::sort(list.begin(), list.end(), [&](int a, int b) { return t[4 * a + 2] < t[4 * b + 2]; });
    first_done += (t[4 * list[0] + 2] - t0) * 1e-3, ++firsts;
    for (size_t j = 1; j < list.size(); ++j) {
      service[down[list[j]]] += (t[4 * list[j] + 2] - t[4 * list[j - 1] + 2]) * 1e-3, ++n_service[down[list[j]]];
    }
  }
  double wait_sum = 0, wait_max = 0;
  int waited = 0;
  for (int i = 0; i < items; ++i) {
    if (!down[i]) continue;
    const double wt = t[4 * i + 1] * 1e-3;
    wait_sum += wt, wait_max = std::max(wait_max, wt), waited += wt > 0.5;
  }
  const double span = (t_end - t0) * 1e-3, bytes = 2.0 * (gu_elems + size_t(h) * f);
  const double gu_kb = 64.0 * h * 2 / 1024, down_kb = 64.0 * (f / chunks) * 2 / 1024;
  const double gu_us = n_service[0] ? service[0] / n_service[0] : 0, down_us = n_service[1] ? service[1] / n_service[1] : 0;
  std::printf("| %s | %d | %d | %d | %.1f | %.2f | %.1f | %.2f (%.0f) | %.2f (%.0f) | %d (%.1f, %.1f) | %.1f, %.1f, %.1f, %.1f "
              "| %.0f%% | %.0f%% |\n",
              absl::StrCat(StreamFfnShapeSuffix(k_boxes, last_chunk, last_chunks),
                           ctas > 0 ? absl::StrCat(", ", ctas, " CTAs") : "")
                  .c_str(),
              rows, chunks, lag, span, bytes / (span * 1e-6) / 1e12, firsts ? first_done / firsts : 0.0, gu_us,
              gu_us > 0 ? gu_kb * 1024 / (gu_us * 1e3) : 0.0, down_us, down_us > 0 ? down_kb * 1024 / (down_us * 1e3) : 0.0,
              waited, wait_sum, wait_max, ends.front(), ends[ends.size() / 2], ends[ends.size() * 9 / 10], ends.back(),
              100 * consumer_waits / ran, 100 * producer_waits / ran);
  return absl::OkStatus();
}

// StreamFfn's timeline at each row count: every shape of kStreamFfnShapes on all SMs, then the
// first shape's chunks and lag at 1 / 2 / 4 k boxes on an eighth and on half of the SMs. On an
// eighth the DRAM leaves each SM far more than it takes (a bare ring: 88-158 GB/s an SM,
// --ring-probe), so an item's rate shows what one SM's pipeline does; on half an H100's, the
// DRAM's ~45 GB/s an SM caps a fast pipeline (docs/cuda-decode.md).
absl::Status PrintStreamFfnTimelines(const Shape& m, const std::vector<int>& rows_list, MlpSetup& u) {
  std::printf(
      "\n| StreamFfn timeline | rows | chunks | lag | span µs | TB/s | first item done | gate/up item µs (GB/s an SM) "
      "| down item µs (GB/s an SM) | down waits > 0.5 µs (sum, max µs) | CTA ends: first, median, 90%%, last "
      "| consumer waits | producer waits |\n"
      "|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|---:|\n");
  for (int rows : rows_list) {
    if (rows < 2 || rows > cuda::kStreamGemmMaxRows) continue;
    for (auto [chunks, lag, k_boxes, last, count] : kStreamFfnShapes) {
      if (!cuda::StreamFfnSplits(m.ffn, chunks, last, count)) continue;
      TAILSERVE_RETURN_IF_ERROR(StreamFfnTimeline(m, rows, chunks, lag, k_boxes, last, count, 0, u));
    }
    if (!cuda::StreamFfnSplits(m.ffn, 4)) continue;
    for (int ctas : {u.sms / 8, u.sms / 2}) {
      for (int k_boxes : {1, 2, 4}) {
        TAILSERVE_RETURN_IF_ERROR(StreamFfnTimeline(m, rows, 4, 3, k_boxes, 0, 1, ctas, u));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

// Can two cuBLASLt chains on forked graph branches fill each other's ramps, tails and small
// kernels? The MLP block at `rows` rows on one stream (gate/up → SwiGLU → down with the residual)
// against the same bytes split in two halves along the FFN dimension (each half: gate/up of f/2
// features → SwiGLU → down over those f/2 inputs, a column slice of W_down, into its own output), the
// halves on two branches: started together, B's gate/up after A's (A's SwiGLU and down then run
// beside it), and started together with B at a lower stream priority. Then (2-16 rows) the block
// as one StreamFfn launch and as StreamGemm chains. Constant data: only time.
absl::Status BenchMlpBranches(const BenchConfig& c) {
  const Shape& m = c.m;
  const int h = m.hidden, f = m.ffn;
  const int max_rows = *std::max_element(c.rows.begin(), c.rows.end());
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<MlpSetup> setup, MakeMlpSetup(m, max_rows));
  MlpSetup& u = *setup;
  const size_t gu_elems = size_t(2) * f * h, down_elems = size_t(h) * f;
  const auto* x = static_cast<const __half*>(u.x16.get());
  auto* gu_out = static_cast<float*>(u.gu.get());
  auto* act_out = static_cast<__half*>(u.act.get());
  auto* y = static_cast<float*>(u.y.get());
  cudaStream_t sa = u.sa.get();
  std::printf("\n| MLP block, %d × %d (gate/up) + %d × %d (down) | rows | µs | of 4.26 TB/s |\n|---|---:|---:|---:|\n",
              2 * f, h, h, f);
  for (int rows : c.rows) {
    if (rows < 2) continue;
    auto weights = [&] { return u.w.Next<const __half>(); };
    // One half (0 or 1) of the MLP on `gemm`'s stream.
    auto half = [&](cuda::GemmRunner& gemm, cudaStream_t st, const __half* wc, int which, float* out, float beta,
                    cudaEvent_t after_gate_up) -> absl::Status {
      const __half* wg = wc + size_t(which) * gu_elems / 2;
      const __half* wd = wc + gu_elems + size_t(which) * (f / 2);  // columns of W_down, as the engine
      float* g = gu_out + size_t(which) * rows * f;
      __half* a = act_out + size_t(which) * rows * f / 2;
      TAILSERVE_RETURN_IF_ERROR(gemm.Run(x, rows, h, wg, f, 0.0f, g));
      if (after_gate_up) TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(after_gate_up, st));
      TAILSERVE_RETURN_IF_ERROR(cuda::SwiGlu(g, rows, f / 2, a, st));
      return gemm.Run(a, rows, f / 2, wd, h, beta, out, /*ldw=*/f);
    };
    auto serial = [&]() -> absl::Status {
      const __half* wc = weights();
      TAILSERVE_RETURN_IF_ERROR(u.gemm_a->Run(x, rows, h, wc, 2 * f, 0.0f, gu_out));
      TAILSERVE_RETURN_IF_ERROR(cuda::SwiGlu(gu_out, rows, f, act_out, sa));
      return u.gemm_a->Run(act_out, rows, f, wc + gu_elems, h, 1.0f, y);
    };
    // mode 0: both halves at once; 1: B's gate/up after A's; 2: both at once, B at low priority.
    auto branches = [&](int mode) {
      return [&, mode]() -> absl::Status {
        const __half* wc = weights();
        cuda::GemmRunner& gb = mode == 2 ? *u.gemm_l : *u.gemm_b;
        cudaStream_t b = mode == 2 ? u.sl.get() : u.sb.get();
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(u.fork.get(), sa));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(b, u.fork.get(), 0));
        cudaEvent_t after_a_gate_up = mode == 1 ? u.mid.get() : nullptr;
        TAILSERVE_RETURN_IF_ERROR(half(*u.gemm_a, sa, wc, 0, y, 1.0f, after_a_gate_up));
        if (after_a_gate_up) TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(b, after_a_gate_up, 0));
        TAILSERVE_RETURN_IF_ERROR(half(gb, b, wc, 1, static_cast<float*>(u.y2.get()), 0.0f, nullptr));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(u.join.get(), b));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(sa, u.join.get(), 0));
        return absl::OkStatus();
      };
    };
    // cuBLASLt's timing for every shape on every runner first, as the engine does at start.
    const std::vector<cuda::GemmRunner*> runners = {u.gemm_a.get(), u.gemm_b.get(), u.gemm_l.get()};
    for (cuda::GemmRunner* g : runners) g->set_tuning(true);
    TAILSERVE_RETURN_IF_ERROR(serial());
    for (int mode = 0; mode < 3; ++mode) TAILSERVE_RETURN_IF_ERROR(branches(mode)());
    for (cuda::GemmRunner* g : runners) g->set_tuning(false);
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    const double bytes = 2.0 * (gu_elems + down_elems);
    const char* names[] = {"two halves at once", "B's gate/up after A's", "two halves at once, B at low priority"};
    std::vector<std::pair<std::string, std::function<absl::Status()>>> variants = {{"one stream (the engine)", serial}};
    for (int mode = 0; mode < 3; ++mode) variants.push_back({names[mode], branches(mode)});
    // The whole block in one persistent launch (ctas 0: one an SM).
    auto stream_ffn = [&](int chunks, int lag, int k_boxes, int last, int count, int ctas) {
      return [&, chunks, lag, k_boxes, last, count, ctas]() -> absl::Status {
        const __half* wc = weights();
        return cuda::StreamFfn({.x = x, .rows = rows, .hidden = h, .w_gate_up = wc, .ffn = f, .w_down = wc + gu_elems,
                                .act = act_out, .chunks = chunks, .lag = lag,
                                .partials = static_cast<float*>(u.partials.get()), .partial_stride = int64_t(rows) * h,
                                .workspace = u.counters.get(), .ctas = ctas, .k_boxes = k_boxes, .last_chunk = last,
                                .last_chunks = count},
                               sa);
      };
    };
    for (auto [chunks, lag, k_boxes, last, count] : kStreamFfnShapes) {
      if (rows > cuda::kStreamGemmMaxRows || !cuda::StreamFfnSplits(f, chunks, last, count)) continue;
      variants.push_back({absl::StrCat("StreamFfn, down in ", chunks, " k chunks, lag ", lag,
                                       StreamFfnShapeSuffix(k_boxes, last, count)),
                          stream_ffn(chunks, lag, k_boxes, last, count, 0)});
    }
    // On an eighth of the SMs, without the timeline: what one SM's pipeline streams (bytes ÷ µs ÷ CTAs).
    for (int k_boxes : {1, 2, 4}) {
      if (rows > cuda::kStreamGemmMaxRows || !cuda::StreamFfnSplits(f, 4)) continue;
      variants.push_back({absl::StrCat("StreamFfn, down in 4 k chunks, lag 3", StreamFfnShapeSuffix(k_boxes, 0, 1), ", ",
                                       u.sms / 8, " CTAs"),
                          stream_ffn(4, 3, k_boxes, 0, 1, u.sms / 8)});
    }
    // One stream of StreamGemm launches: gate/up in 2 k chunks, SwiGLU adding them, down in
    // `down_chunks`; programmatic, each one's W copies run while its predecessor finishes (the
    // four projections chained that way beat cuBLASLt's by 4 µs, docs/cuda-decode.md).
    for (int variant : {1, 4}) {
      for (int down_chunks : {2, 4}) {
        for (bool overlap : {false, true}) {
          const int k_step = cuda::StreamGemmKStep(variant);
          if (rows > cuda::kStreamGemmMaxRows || h % (k_step * 2) != 0 || f % (k_step * down_chunks) != 0) continue;
          variants.push_back(
              {absl::StrCat("StreamGemm chain, variant ", variant, ", down in ", down_chunks, " chunks",
                            overlap ? ", programmatic" : ""),
               [&, variant, down_chunks, overlap]() -> absl::Status {
                 const __half* wc = weights();
                 auto* parts = static_cast<float*>(u.gu_parts.get());
                 auto* region = static_cast<char*>(u.chain_counters.get());
                 const int64_t gu_stride = int64_t(rows) * 2 * f;
                 TAILSERVE_RETURN_IF_ERROR(cuda::StreamGemm({.x = x, .rows = rows, .k = h, .w = wc, .n = 2 * f,
                                                             .chunks = 2, .partials = parts,
                                                             .partial_stride = gu_stride, .workspace = region,
                                                             .overlap_previous = overlap, .variant = variant},
                                                            sa));
                 TAILSERVE_RETURN_IF_ERROR(cuda::SwiGlu(nullptr, rows, f, act_out, sa, overlap,
                                                        {.data = parts, .count = 2, .stride = gu_stride}));
                 return cuda::StreamGemm({.x = act_out, .rows = rows, .k = f, .w = wc + gu_elems, .n = h,
                                          .chunks = down_chunks, .partials = static_cast<float*>(u.partials.get()),
                                          .partial_stride = int64_t(rows) * h,
                                          .workspace = region + cuda::kStreamGemmWorkspaceBytes,
                                          .overlap_previous = overlap, .variant = variant},
                                         sa);
               }});
        }
      }
    }
    for (auto& [name, launch] : variants) {
      TAILSERVE_ASSIGN_OR_RETURN(const double us,
                                 TimeGraph(sa, c.reps, launch, cudaGraphInstantiateFlagUseNodePriority));
      std::printf("| %s | %d | %.1f | %.0f%% |\n", name.c_str(), rows, us,
                  100.0 * bytes / (us * 1e-6) / kCopyBandwidth);
    }
  }
  return PrintStreamFfnTimelines(m, c.rows, u);
}

}  // namespace tailserve::bench
