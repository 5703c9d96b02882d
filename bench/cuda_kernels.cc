// tailserve-bench-kernels: the decode projections and paged attention alone, at a model's shapes
// (default Llama-3.1-8B), on constant data: no checkpoint to make or load, so a kernel change costs
// seconds of device time instead of minutes. Each row is the mean of `reps` launches captured in
// one CUDA graph (so launch overhead is not counted), timed with CUDA events, beside the bytes the
// launch must read ÷ 4.26 TB/s. Projections run as the engine runs them: the Gemv with its
// epilogue for 1 row, the SkinnyGemm for 2..64 rows beside cuBLASLt (algorithm timed first), where
// the RMSNorm and SwiGLU are separate kernels this table does not include.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/cuda_resources.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/kernels/attention.h"
#include "worker/backends/cuda/kernels/gemv.h"
#include "worker/backends/cuda/kernels/skinny_gemm.h"

namespace tailserve {
namespace {

constexpr double kCopyBandwidth = 4.26e12;  // bytes/s, ../shared/gpu/README.md

std::vector<int> Ints(const std::string& csv) {
  std::vector<int> v;
  for (absl::string_view s : absl::StrSplit(csv, ',', absl::SkipEmpty())) v.push_back(std::stoi(std::string(s)));
  return v;
}

// Device memory filled with one byte value: every fp16 / fp32 / E4M3 element finite and small.
absl::StatusOr<DeviceMemory> Filled(size_t bytes, int byte) {
  absl::StatusOr<DeviceMemory> m = DeviceAlloc(bytes);
  if (!m.ok()) return m.status();
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(m->get(), byte, bytes));
  return m;
}

// As many copies of a weight matrix as keep timed launches reading DRAM (the engine's layers each
// have their own weights; one copy would be served from the 50 MB L2 after the first launch).
absl::StatusOr<std::vector<DeviceMemory>> WeightCopies(size_t w_bytes) {
  const int copies = int(std::max<size_t>(1, (size_t(256) << 20) / w_bytes + 1));
  std::vector<DeviceMemory> w;
  for (int c = 0; c < copies; ++c) {
    absl::StatusOr<DeviceMemory> m = Filled(w_bytes, 0x3c);
    if (!m.ok()) return m.status();
    w.push_back(*std::move(m));
  }
  return w;
}

// Mean microseconds of `launch` over `reps` launches captured into one graph (after one warm replay).
absl::StatusOr<double> TimeGraph(cudaStream_t s, int reps, const std::function<absl::Status()>& launch) {
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  absl::Status st;
  for (int i = 0; i < reps && st.ok(); ++i) st = launch();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  CudaGraph owned(graph);
  if (!st.ok()) return st;
  TAILSERVE_CUDA_RETURN_IF_ERROR(ended);
  cudaGraphExec_t exec = nullptr;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
  CudaGraphExec owned_exec(exec);
  absl::StatusOr<CudaEvent> start = MakeEvent(), stop = MakeEvent();
  if (!start.ok()) return start.status();
  if (!stop.ok()) return stop.status();
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start->get(), s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop->get(), s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop->get()));
  float ms = 0.0f;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start->get(), stop->get()));
  return 1e3 * ms / reps;
}

struct Shape {
  int hidden, ffn, heads, kv_heads, head_dim;
};

// A decode layer's projection at the shape: W is n × k; at batch 1 the Gemv reads the fp32 residual
// (f32_in, normed in its epilogue), adds into y (residual) or applies SwiGLU (swiglu).
struct Projection {
  const char* name;
  int n, k;
  bool f32_in, residual, swiglu;
};

std::vector<Projection> Projections(const Shape& m) {
  const int qd = m.heads * m.head_dim, kvd = m.kv_heads * m.head_dim;
  return {{"qkv", qd + 2 * kvd, m.hidden, true, false, false},
          {"o", m.hidden, qd, false, true, false},
          {"gate_up", 2 * m.ffn, m.hidden, true, false, true},
          {"down", m.hidden, m.ffn, false, true, false}};
}

// The largest k and n of the projections (sizes of the shared X and Y buffers).
std::pair<int, int> MaxKN(const std::vector<Projection>& projections) {
  int max_k = 0, max_n = 0;
  for (const Projection& p : projections) max_k = std::max(max_k, p.k), max_n = std::max(max_n, p.n);
  return {max_k, max_n};
}

// One SkinnyGemm launch (after two others, as in a graph) with each CTA's %globaltimer stamps: where
// a projection's time goes besides streaming W.
absl::Status SkinnyTimeline(const Projection& p, int rows, const std::vector<DeviceMemory>& w, void* x, void* y,
                            int variant, cudaStream_t s) {
  int sms = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t work_bytes = cuda::SkinnyGemmWorkspaceBytes();
  auto work = Filled(work_bytes, 0), stamps = Filled(size_t(sms) * 4 * 8, 0);
  if (!work.ok()) return work.status();
  if (!stamps.ok()) return stamps.status();
  const int ctas = std::min(sms, ((p.n + 127) / 128) * ((p.k + 63) / 64));
  for (int v : {0, 4, 8}) {  // the unit split as chosen, twice as fine, half as fine
    int launches = 0;
    absl::StatusOr<double> us = TimeGraph(s, 50, [&]() -> absl::Status {
      return cuda::SkinnyGemm({.x = static_cast<const __half*>(x), .rows = rows, .k = p.k,
                               .w = static_cast<const __half*>(w[launches++ % w.size()].get()), .n = p.n,
                               .y = static_cast<float*>(y), .beta = p.residual ? 1.0f : 0.0f,
                               .workspace = work->get(), .workspace_bytes = work_bytes, .overlap_previous = true,
                               .variant = v},
                              s);
    });
    if (!us.ok()) return us.status();
    const double tbs = (2.0 * p.n * p.k + 2.0 * rows * p.k) / (*us * 1e-6) / 1e12;
    std::printf("| %s | %d | %d × %d | SkinnyGemm overlapped, variant %d | %.1f | %.2f | %.0f%% |\n", p.name, rows, p.n,
                p.k, v, *us, tbs, 100.0 * tbs * 1e12 / kCopyBandwidth);
  }
  // Two stamped launches (each after two unstamped ones): are the slow CTAs on the same SMs?
  std::vector<std::vector<double>> stream_of_sm(2, std::vector<double>(sms, -1.0));
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 3; ++i) {
      cuda::SkinnyGemmArgs a{.x = static_cast<const __half*>(x), .rows = rows, .k = p.k,
                             .w = static_cast<const __half*>(w[(3 * round + i) % w.size()].get()), .n = p.n,
                             .y = static_cast<float*>(y), .beta = p.residual ? 1.0f : 0.0f, .workspace = work->get(),
                             .workspace_bytes = work_bytes, .overlap_previous = true, .variant = variant};
      if (i == 2) a.stamps = static_cast<unsigned long long*>(stamps->get());
      if (absl::Status st = cuda::SkinnyGemm(a, s); !st.ok()) return st;
    }
    std::vector<unsigned long long> t(size_t(sms) * 4);
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(t.data(), stamps->get(), t.size() * 8, cudaMemcpyDeviceToHost, s));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    constexpr unsigned long long kTime = (1ull << 56) - 1;
    unsigned long long t0 = ~0ull, t_end = 0;
    for (int c = 0; c < ctas; ++c) t0 = std::min(t0, t[c * 4] & kTime), t_end = std::max(t_end, t[c * 4 + 3]);
    std::vector<double> ramp, stream, tail, start;
    std::vector<std::pair<double, int>> slow;  // (streaming µs, CTA)
    for (int c = 0; c < ctas; ++c) {
      const unsigned long long begin = t[c * 4] & kTime;
      const int sm = int(t[c * 4] >> 56);
      start.push_back((begin - t0) * 1e-3), ramp.push_back((t[c * 4 + 1] - begin) * 1e-3);
      stream.push_back((t[c * 4 + 2] - t[c * 4 + 1]) * 1e-3), tail.push_back((t[c * 4 + 3] - t[c * 4 + 2]) * 1e-3);
      if (sm < sms) stream_of_sm[round][sm] = stream.back();
      slow.push_back({stream.back(), c});
    }
    std::sort(slow.rbegin(), slow.rend());
    auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    auto max = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
    std::string slowest;
    for (int i = 0; i < 6 && i < int(slow.size()); ++i) {
      absl::StrAppend(&slowest, i ? ", " : "", "CTA ", slow[i].second, " SM ", int(t[slow[i].second * 4] >> 56), " ",
                      absl::StrFormat("%.1f", slow[i].first));
    }
    std::printf("| %s | %d | variant %d timeline: span %.1f µs; CTA start +%.1f (max +%.1f); first stage after %.1f "
                "(max %.1f); streaming %.1f (max %.1f); last flush %.1f (max %.1f); slowest: %s |\n",
                p.name, rows, variant, (t_end - t0) * 1e-3, med(start), max(start), med(ramp), max(ramp), med(stream),
                max(stream), med(tail), max(tail), slowest.c_str());
  }
  // Correlation of an SM's streaming time between the two launches (1: the SM, 0: chance).
  double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
  int n = 0;
  for (int sm = 0; sm < sms; ++sm) {
    const double a = stream_of_sm[0][sm], b = stream_of_sm[1][sm];
    if (a < 0 || b < 0) continue;
    sx += a, sy += b, sxx += a * a, syy += b * b, sxy += a * b, ++n;
  }
  const double cov = sxy / n - sx / n * sy / n, va = sxx / n - sx / n * sx / n, vb = syy / n - sy / n * sy / n;
  std::printf("| %s | %d | variant %d: streaming time of an SM, launch 1 against 2: correlation %.2f over %d SMs |\n",
              p.name, rows, variant, cov / std::sqrt(std::max(va * vb, 1e-30)), n);
  return absl::OkStatus();
}

absl::Status BenchProjections(const Shape& m, const std::vector<int>& rows_list, int reps,
                              const std::vector<int>& skinny_ctas, bool timeline, cudaStream_t s) {
  const std::vector<Projection> projections = Projections(m);
  const int max_rows = *std::max_element(rows_list.begin(), rows_list.end());
  const auto [max_k, max_n] = MaxKN(projections);
  auto x16 = Filled(size_t(max_rows) * max_k * 2, 0x2c), x32 = Filled(size_t(max_rows) * max_k * 4, 0x3c);
  auto y = Filled(size_t(max_rows) * max_n * 4, 0), act = Filled(size_t(max_rows) * max_n * 2, 0);
  auto sums = Filled(size_t(max_rows) * 4, 0x3c), work = DeviceAlloc(cuda::GemmRunner::WorkspaceBytes());
  for (auto* b : {&x16, &x32, &y, &act, &sums, &work}) {
    if (!b->ok()) return b->status();
  }
  absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> gemm =
      cuda::GemmRunner::Create(s, work->get(), cuda::GemmRunner::WorkspaceBytes());
  if (!gemm.ok()) return gemm.status();
  std::printf("| projection | rows | n × k | kernel | µs | TB/s | of 4.26 TB/s |\n|---|---:|---|---|---:|---:|---:|\n");
  for (const Projection& p : projections) {
    absl::StatusOr<std::vector<DeviceMemory>> copies_or = WeightCopies(size_t(p.n) * p.k * 2);
    if (!copies_or.ok()) return copies_or.status();
    const std::vector<DeviceMemory>& w = *copies_or;
    const int copies = int(w.size());
    for (int rows : rows_list) {
      const bool gemv = rows == 1;
      int launches = 0;  // picks the weight copy
      cuda::GemvArgs a{.k = p.k, .n = p.n};
      if (p.f32_in) {
        a.x_f32 = static_cast<const float*>(x32->get()), a.in_sumsq = static_cast<const float*>(sums->get()), a.eps = 1e-5f;
      } else {
        a.x = static_cast<const __half*>(x16->get());
      }
      if (p.swiglu) a.swiglu_out = static_cast<__half*>(act->get());
      else a.y = static_cast<float*>(y->get());
      if (p.residual) a.beta = 1.0f, a.out_sumsq = static_cast<float*>(sums->get());
      bool overlap = false;
      auto launch = [&]() -> absl::Status {
        const auto* wp = static_cast<const __half*>(w[launches++ % copies].get());
        a.w = wp;
        if (gemv) return cuda::Gemv(a, s);
        return (*gemm)->Run(static_cast<const __half*>(x16->get()), rows, p.k, wp, p.n, p.residual ? 1.0f : 0.0f,
                            static_cast<float*>(y->get()), overlap);
      };
      const double bytes = 2.0 * p.n * p.k + (p.f32_in && gemv ? 4.0 : 2.0) * rows * p.k;  // the GEMMs read fp16 X
      auto row = [&](const std::string& kernel) -> absl::Status {
        absl::StatusOr<double> us = TimeGraph(s, reps, launch);
        if (!us.ok()) return us.status();
        const double tbs = bytes / (*us * 1e-6) / 1e12;
        std::printf("| %s | %d | %d × %d | %s | %.1f | %.2f | %.0f%% |\n", p.name, rows, p.n, p.k, kernel.c_str(),
                    *us, tbs, 100.0 * tbs * 1e12 / kCopyBandwidth);
        return absl::OkStatus();
      };
      if (gemv) {
        if (absl::Status st = row("Gemv"); !st.ok()) return st;
        continue;
      }
      // cuBLASLt with its candidates for this shape timed first, as the engine does at start.
      (*gemm)->set_skinny(false);
      (*gemm)->set_tuning(true);
      if (absl::Status st = launch(); !st.ok()) return st;
      (*gemm)->set_tuning(false);
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
      if (absl::Status st = row("cuBLASLt"); !st.ok()) return st;
      (*gemm)->set_skinny(true);
      if (rows > cuda::kSkinnyGemmMaxRows) continue;
      // The SkinnyGemm alone, then each launch overlapping the one before (as o, gate/up and down
      // follow each other once the norm and SwiGLU ride in their epilogues).
      for (int ctas : skinny_ctas) {
        (*gemm)->set_skinny_ctas(ctas);
        const std::string split = ctas == 0 ? std::string() : absl::StrCat(", ", ctas, " CTAs");
        for (bool o : {false, true}) {
          overlap = o;
          if (absl::Status st = row(absl::StrCat("SkinnyGemm", o ? " overlapped" : "", split)); !st.ok()) return st;
        }
        overlap = false;
      }
      (*gemm)->set_skinny_ctas(0);
      for (int v = 0; timeline && v < 1; ++v) {
        if (absl::Status st = SkinnyTimeline(p, rows, w, x16->get(), y->get(), v, s); !st.ok()) return st;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status BenchAttention(const Shape& m, KvDtype dtype, const std::vector<int>& rows_list,
                            const std::vector<int>& contexts, int reps, cudaStream_t s) {
  const int block = 16, hd = m.head_dim, kvh = m.kv_heads, q_stride = (m.heads + 2 * kvh) * hd;
  absl::StatusOr<int> per_sm = cuda::AttentionCtasPerSm({.heads = m.heads}, {block, kvh, hd, 1, dtype});
  if (!per_sm.ok()) return per_sm.status();
  std::printf("\ndecode attention, %s cache, %d CTAs per SM; one row per sequence at position `context`\n\n",
              KvDtypeName(dtype), *per_sm);
  std::printf("| rows | context | splits | µs | KV GB/s read | of 4.26 TB/s |\n|---:|---:|---:|---:|---:|---:|\n");
  const double elem = KvElementBytes(dtype), scale = dtype == KvDtype::kFp16 ? 0 : 4;
  for (int rows : rows_list) {
    for (int context : contexts) {
      const int per_seq = (context + block) / block, blocks = rows * per_seq + 1;
      const size_t entries = size_t(blocks) * block * kvh;
      auto k = Filled(entries * hd * size_t(elem), 0x38), v = Filled(entries * hd * size_t(elem), 0x38);
      auto ks = Filled(entries * 4, 0x3c), vs = Filled(entries * 4, 0x3c), q = Filled(size_t(rows) * q_stride * 4, 0x3c);
      std::vector<int32_t> table(size_t(rows) * per_seq), seq(rows), pos(rows, context);
      for (size_t i = 0; i < table.size(); ++i) table[i] = 1 + int32_t(i);
      for (int r = 0; r < rows; ++r) seq[r] = r;
      auto dtable = DeviceAlloc(table.size() * 4), dseq = DeviceAlloc(rows * 4), dpos = DeviceAlloc(rows * 4);
      auto out = DeviceAlloc(size_t(rows) * m.heads * hd * 2);
      for (auto* b : {&k, &v, &ks, &vs, &q, &dtable, &dseq, &dpos, &out}) {
        if (!b->ok()) return b->status();
      }
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dtable->get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dseq->get(), seq.data(), rows * 4, cudaMemcpyHostToDevice));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dpos->get(), pos.data(), rows * 4, cudaMemcpyHostToDevice));
      const KvGeometry g{block, kvh, hd, per_seq, dtype};
      const RowMeta meta{static_cast<const int32_t*>(dseq->get()), static_cast<const int32_t*>(dpos->get()),
                         static_cast<const int32_t*>(dtable->get())};
      const KvLayerView layer{k->get(), v->get(), static_cast<float*>(ks->get()), static_cast<float*>(vs->get())};
      const double kv_bytes = double(rows) * (context + 1) * kvh * (hd * elem + scale) * 2;
      for (int splits : {1, 2, 4, 8, 16, 32}) {
        const cuda::AttentionShape shape{.rows = rows, .heads = m.heads, .q_stride = q_stride, .splits = splits,
                                         .scale = 1.0f / std::sqrt(float(hd))};
        auto ws = DeviceAlloc(cuda::AttentionWorkspaceFloats(shape, hd) * 4);
        if (!ws.ok()) return ws.status();
        absl::StatusOr<double> us = TimeGraph(s, reps, [&] {
          return cuda::PagedAttention(static_cast<const float*>(q->get()), shape, meta, g, layer,
                                      static_cast<float*>(ws->get()), static_cast<__half*>(out->get()), s);
        });
        if (!us.ok()) return us.status();
        const double gbs = kv_bytes / (*us * 1e-6) / 1e9;
        std::printf("| %d | %d | %d | %.1f | %.0f | %.0f%% |\n", rows, context, splits, *us, gbs,
                    100.0 * gbs * 1e9 / kCopyBandwidth);
      }
    }
  }
  return absl::OkStatus();
}


// One cuBLASLt configuration of Yᵀ[n, rows] = W[n, k]ᵀ-op · Xᵀ[k, rows] (GemmRunner's layout).
struct LtConfig {
  cublasLtMatmulAlgo_t algo;
  std::string name;
  double us = 0;
};

template <typename T>
std::vector<T> CapArray(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0) return {};
  std::vector<T> v(bytes / sizeof(T));
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, v.data(), bytes, &bytes) != CUBLAS_STATUS_SUCCESS) return {};
  return v;
}

template <typename T>
T CapValue(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  T v{};
  size_t bytes = 0;
  cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &v, sizeof(v), &bytes);
  return v;
}

// Experiment, not the engine's path: how far cuBLASLt's whole configuration space (algorithm ×
// tile × stages × split-K × cluster) is from the pick GemmRunner's tuning makes among the
// heuristic's 8 first candidates, on the decode projections at `rows` > 1.
absl::Status SearchGemm(const Shape& m, const std::vector<int>& rows_list, int reps, cudaStream_t s) {
  const std::vector<Projection> projections = Projections(m);
  const int max_rows = *std::max_element(rows_list.begin(), rows_list.end());
  const auto [max_k, max_n] = MaxKN(projections);
  constexpr size_t kWork = 64 << 20;
  auto x16 = Filled(size_t(max_rows) * max_k * 2, 0x2c), y = Filled(size_t(max_rows) * max_n * 4, 0);
  auto work = DeviceAlloc(kWork);
  for (auto* b : {&x16, &y, &work}) {
    if (!b->ok()) return b->status();
  }
  CublasLtHandle lt;
  {
    absl::StatusOr<CublasLtHandle> h = MakeCublasLt();
    if (!h.ok()) return h.status();
    lt = *std::move(h);
  }
  absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> gemm = cuda::GemmRunner::Create(s, work->get(), kWork);
  if (!gemm.ok()) return gemm.status();
  (*gemm)->set_skinny(false);  // cuBLASLt against cuBLASLt
  absl::StatusOr<CudaEvent> start = MakeEvent(), stop = MakeEvent();
  if (!start.ok()) return start.status();
  if (!stop.ok()) return stop.status();
  std::printf("\n| projection | rows | tuned (GemmRunner) µs | heuristic best of 100 µs | search best µs | of 4.26 TB/s | configs timed | best config |\n"
              "|---|---:|---:|---:|---:|---:|---:|---|\n");
  for (const Projection& p : projections) {
    absl::StatusOr<std::vector<DeviceMemory>> copies_or = WeightCopies(size_t(p.n) * p.k * 2);
    if (!copies_or.ok()) return copies_or.status();
    const std::vector<DeviceMemory>& w = *copies_or;
    const int copies = int(w.size());
    for (int rows : rows_list) {
      if (rows == 1) continue;
      const float beta = p.residual ? 1.0f : 0.0f, alpha = 1.0f;
      const auto* x = static_cast<const __half*>(x16->get());
      auto* yp = static_cast<float*>(y->get());
      int launches = 0;
      auto wp = [&] { return static_cast<const __half*>(w[launches++ % copies].get()); };
      // GemmRunner's pick, timed in a graph as the engine replays it.
      (*gemm)->set_tuning(true);
      if (absl::Status st = (*gemm)->Run(x, rows, p.k, wp(), p.n, beta, yp); !st.ok()) return st;
      (*gemm)->set_tuning(false);
      absl::StatusOr<double> tuned = TimeGraph(s, reps, [&] { return (*gemm)->Run(x, rows, p.k, wp(), p.n, beta, yp); });
      if (!tuned.ok()) return tuned.status();

      cublasLtMatmulDesc_t op = nullptr;
      cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
      TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
      TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&a, CUDA_R_16F, p.k, p.n, p.k));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&b, CUDA_R_16F, p.k, rows, p.k));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, p.n, rows, p.n));
      auto matmul = [&](const cublasLtMatmulAlgo_t& algo) {
        return cublasLtMatmul(lt.get(), op, &alpha, wp(), a, x, b, &beta, yp, c, yp, c, &algo, work->get(), kWork, s);
      };
      // Stream-timed mean of 8 launches after 2 warm-ups: ranks configurations; the best few are re-timed in a graph.
      auto quick = [&](const cublasLtMatmulAlgo_t& algo) -> double {
        for (int i = 0; i < 2; ++i) {
          if (matmul(algo) != CUBLAS_STATUS_SUCCESS) return -1;
        }
        cudaEventRecord(start->get(), s);
        for (int i = 0; i < 8; ++i) matmul(algo);
        cudaEventRecord(stop->get(), s);
        if (cudaEventSynchronize(stop->get()) != cudaSuccess) return -1;
        float ms = 0;
        cudaEventElapsedTime(&ms, start->get(), stop->get());
        return 1e3 * ms / 8;
      };
      std::vector<LtConfig> timed;
      // (1) the heuristic's first 100.
      cublasLtMatmulPreference_t pref = nullptr;
      TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
      const uint64_t wb = kWork;
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wb, sizeof(wb));
      std::vector<cublasLtMatmulHeuristicResult_t> heur(100);
      int found = 0;
      cublasLtMatmulAlgoGetHeuristic(lt.get(), op, a, b, c, c, pref, 100, heur.data(), &found);
      cublasLtMatmulPreferenceDestroy(pref);
      double heur_best = 1e30;
      for (int i = 0; i < found; ++i) {
        const double us = quick(heur[i].algo);
        if (us > 0) timed.push_back({heur[i].algo, absl::StrCat("heuristic #", i), us}), heur_best = std::min(heur_best, us);
      }
      // (2) each algorithm id the heuristic proposes (the others time out the search without winning)
      // × tile × stages × split-K {1,2,3,4,6,8,16} × cluster {auto,1,2x1,1x2} that passes AlgoCheck.
      std::vector<int> heur_ids;
      for (int i = 0; i < found; ++i) {
        int32_t id = 0;
        size_t written = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&heur[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written);
        if (std::find(heur_ids.begin(), heur_ids.end(), id) == heur_ids.end()) heur_ids.push_back(id);
      }
      std::string id_list;
      for (int id : heur_ids) absl::StrAppend(&id_list, id_list.empty() ? "" : ",", id);
      std::fprintf(stderr, "%s rows %d: heuristic algorithm ids %s\n", p.name, rows, id_list.c_str());
      int checked = 0;
      for (int id : heur_ids) {
        cublasLtMatmulAlgo_t base;
        if (cublasLtMatmulAlgoInit(lt.get(), CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16F, CUDA_R_16F, CUDA_R_32F,
                                   CUDA_R_32F, id, &base) != CUBLAS_STATUS_SUCCESS) {
          continue;
        }
        std::vector<uint32_t> tiles = CapArray<uint32_t>(base, CUBLASLT_ALGO_CAP_TILE_IDS);
        std::vector<uint32_t> stages = CapArray<uint32_t>(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
        if (tiles.empty()) tiles = {CUBLASLT_MATMUL_TILE_UNDEFINED};
        stages.insert(stages.begin(), CUBLASLT_MATMUL_STAGES_UNDEFINED);
        const bool splitk = CapValue<int32_t>(base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) != 0;
        const uint32_t schemes = CapValue<uint32_t>(base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
        for (uint32_t tile : tiles) {
          for (uint32_t stage : stages) {
            for (int32_t split : {1, 2, 3, 4, 6, 8, 16}) {
              if (split > 1 && !splitk) break;
              for (uint32_t scheme : {0u, 1u, 2u, 4u}) {
                if ((split == 1) != (scheme == 0) || (scheme && !(schemes & scheme))) continue;
                for (uint16_t cluster : {uint16_t(0), uint16_t(2), uint16_t(3), uint16_t(5)}) {
                  cublasLtMatmulAlgo_t algo = base;
                  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile));
                  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stage, sizeof(stage));
                  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split));
                  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme));
                  if (cluster != 0 &&
                      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                                           sizeof(cluster)) != CUBLAS_STATUS_SUCCESS) {
                    continue;
                  }
                  cublasLtMatmulHeuristicResult_t r{};
                  if (cublasLtMatmulAlgoCheck(lt.get(), op, a, b, c, c, &algo, &r) != CUBLAS_STATUS_SUCCESS) continue;
                  if (r.workspaceSize > kWork || ++checked > 12000) continue;
                  const double us = quick(algo);
                  if (us > 0) {
                    timed.push_back({algo, absl::StrCat("id ", id, " tile ", tile, " stages ", stage, " splitk ",
                                                        split, " scheme ", scheme, " cluster ", cluster),
                                     us});
                  }
                }
              }
            }
          }
        }
      }
      cudaGetLastError();
      std::sort(timed.begin(), timed.end(), [](const LtConfig& l, const LtConfig& r) { return l.us < r.us; });
      // Re-time the 6 best in a graph.
      double best = 1e30;
      std::string best_name = "-";
      for (size_t i = 0; i < std::min<size_t>(6, timed.size()); ++i) {
        absl::StatusOr<double> us = TimeGraph(s, reps, [&]() -> absl::Status {
          TAILSERVE_CUDA_RETURN_IF_ERROR(matmul(timed[i].algo));
          return absl::OkStatus();
        });
        if (us.ok() && *us < best) best = *us, best_name = timed[i].name;
      }
      const double tbs = (2.0 * p.n * p.k + 2.0 * rows * p.k) / (best * 1e-6) / 1e12;
      std::printf("| %s | %d | %.1f | %.1f | %.1f | %.0f%% | %zu | %s |\n", p.name, rows, *tuned, heur_best, best,
                  100.0 * tbs * 1e12 / kCopyBandwidth, timed.size(), best_name.c_str());
      std::fflush(stdout);
      cublasLtMatrixLayoutDestroy(c), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(a);
      cublasLtMatmulDescDestroy(op);
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tailserve

int main(int argc, char** argv) {
  using namespace tailserve;
  CLI::App app{"tailserve-bench-kernels: decode projections and paged attention alone, on constant data"};
  Shape m{4096, 14336, 32, 8, 128};
  std::string rows = "1,16,64", contexts = "512,2048", kv = "fp8_e4m3";
  int reps = 50;
  bool gemm_search = false;
  app.add_option("--hidden", m.hidden, "hidden size");
  app.add_option("--ffn", m.ffn, "FFN (intermediate) size");
  app.add_option("--heads", m.heads, "query heads");
  app.add_option("--kv-heads", m.kv_heads, "KV heads");
  app.add_option("--head-dim", m.head_dim, "head dimension");
  app.add_option("--rows", rows, "rows (batch sizes), comma-separated");
  app.add_option("--contexts", contexts, "attention context lengths, comma-separated");
  app.add_option("--kv", kv, "KV cache dtype: fp8_e4m3, fp8_e5m2, fp16");
  app.add_option("--reps", reps, "launches per timed graph");
  app.add_flag("--gemm-search", gemm_search, "only: time cuBLASLt's whole configuration space per projection");
  std::string skinny_ctas = "0";
  bool timeline = false;
  app.add_flag("--skinny-timeline", timeline, "also one SkinnyGemm launch's per-CTA timeline per projection");
  app.add_option("--skinny-ctas", skinny_ctas, "SkinnyGemm stream-K CTAs to time, comma-separated (0: one an SM)");
  CLI11_PARSE(app, argc, argv);
  absl::StatusOr<KvDtype> dtype = ParseKvDtype(kv);
  if (!dtype.ok()) {
    std::fprintf(stderr, "%s\n", std::string(dtype.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<CudaStream> stream = MakeStream();
  if (!stream.ok()) {
    std::fprintf(stderr, "no GPU: %s\n", std::string(stream.status().message()).c_str());
    return 1;
  }
  std::printf("shape: hidden %d, ffn %d, heads %d/%d, head_dim %d; %d launches a timed graph\n\n", m.hidden, m.ffn,
              m.heads, m.kv_heads, m.head_dim, reps);
  absl::Status st = gemm_search ? SearchGemm(m, Ints(rows), reps, stream->get())
                                : BenchProjections(m, Ints(rows), reps, Ints(skinny_ctas), timeline, stream->get());
  if (gemm_search) {
    if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return st.ok() ? 0 : 1;
  }
  if (st.ok()) st = BenchAttention(m, *dtype, Ints(rows), Ints(contexts), reps, stream->get());
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
