// tailserve-bench-kernels: the decode projections and paged attention alone, at a model's shapes
// (default Llama-3.1-8B), on constant data: no checkpoint to make or load, so a kernel change costs
// seconds of device time instead of minutes. Each row is the mean of `reps` launches captured in
// one CUDA graph (so launch overhead is not counted), timed with CUDA events, beside the bytes the
// launch must read ÷ 4.26 TB/s. Projections run as the engine runs them: the Gemv with its
// epilogue for 1 row, cuBLASLt (algorithm timed first) above, where the RMSNorm and SwiGLU are
// separate kernels this table does not include.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_profiler_api.h>
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
#include "bench/overlap_probe.h"
#include "bench/ring_probe.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/cuda_resources.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/kernels/attention.h"
#include "worker/backends/cuda/kernels/attention_block.h"
#include "worker/backends/cuda/kernels/gemv.h"
#include "worker/backends/cuda/kernels/rows.h"
#include "worker/backends/cuda/kernels/stream_gemm.h"

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

// Copies of one buffer (weights, a layer's KV), handed out in turn, so that timed launches read
// DRAM as the engine's layers do, each from its own buffer; one copy would be served from the
// 50 MB L2 after the first launch.
class RotatingCopies {
 public:
  // As many copies of `bytes` as keep the reads past L2 (256 MB in all). `l2_hot`: one copy, on
  // purpose: what a kernel would take with its data already in L2 (the ceiling of a prefetch).
  static int PastL2(size_t bytes, bool l2_hot) {
    return l2_hot ? 1 : int(std::max<size_t>(1, (size_t(256) << 20) / bytes + 1));
  }
  // One allocation, copies `stride()` bytes apart (as the engine's layers are, so GemmRunner's
  // tuning can rotate over them too).
  static absl::StatusOr<RotatingCopies> Make(size_t bytes, int count, int fill = 0x3c) {
    RotatingCopies r;
    r.stride_ = (bytes + 255) / 256 * 256, r.count_ = count;
    absl::StatusOr<DeviceMemory> m = Filled(r.stride_ * size_t(count), fill);
    if (!m.ok()) return m.status();
    r.memory_ = *std::move(m);
    return r;
  }
  // The next copy (the first after the last).
  template <typename T = __half>
  T* Next() {
    return reinterpret_cast<T*>(static_cast<char*>(memory_.get()) + (next_++ % size_t(count_)) * stride_);
  }
  const void* first() const { return memory_.get(); }
  size_t stride() const { return stride_; }
  int count() const { return count_; }

 private:
  DeviceMemory memory_;
  size_t stride_ = 0;
  int count_ = 1;
  size_t next_ = 0;
};

absl::StatusOr<RotatingCopies> WeightCopies(size_t w_bytes, bool l2_hot = false) {
  return RotatingCopies::Make(w_bytes, RotatingCopies::PastL2(w_bytes, l2_hot));
}

// Mean microseconds of `launch` over `reps` launches captured into one graph (after one warm replay).
// `instantiate_flags`: cudaGraphInstantiateFlagUseNodePriority keeps the capturing streams' priorities.
absl::StatusOr<double> TimeGraph(cudaStream_t s, int reps, const std::function<absl::Status()>& launch,
                                 unsigned long long instantiate_flags = 0) {
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  absl::Status st;
  for (int i = 0; i < reps && st.ok(); ++i) st = launch();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  CudaGraph owned(graph);
  if (!st.ok()) return st;
  TAILSERVE_CUDA_RETURN_IF_ERROR(ended);
  cudaGraphExec_t exec = nullptr;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, instantiate_flags));
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

// The batch-1 Gemv of projection p as the engine launches it (without the preload and the
// programmatic launch, which the caller sets).
cuda::GemvArgs GemvFor(const Projection& p, const DeviceMemory& x16, const DeviceMemory& x32, const DeviceMemory& y,
                       const DeviceMemory& act, const DeviceMemory& sums) {
  cuda::GemvArgs a{.k = p.k, .n = p.n};
  if (p.f32_in) {
    a.x_f32 = static_cast<const float*>(x32.get()), a.in_sumsq = static_cast<const float*>(sums.get()), a.eps = 1e-5f;
  } else {
    a.x = static_cast<const __half*>(x16.get());
  }
  if (p.swiglu) a.swiglu_out = static_cast<__half*>(act.get());
  else a.y = static_cast<float*>(y.get());
  if (p.residual) a.beta = 1.0f, a.out_sumsq = static_cast<float*>(sums.get());
  return a;
}

// The batch-1 Gemv of each projection at every k split, launched plain (each launch drains before
// the next starts), programmatically (the next launch's CTAs wait on the GPU, as in the engine's
// chain), and programmatically with W's first loads copied to shared memory before the wait;
// weights rotating past L2.
absl::Status BenchGemvSplits(const Shape& m, int reps, cudaStream_t s) {
  const std::vector<Projection> projections = Projections(m);
  const auto [max_k, max_n] = MaxKN(projections);
  auto x16 = Filled(size_t(max_k) * 2, 0x2c), x32 = Filled(size_t(max_k) * 4, 0x3c);
  auto y = Filled(size_t(max_n) * 4, 0), act = Filled(size_t(max_n) * 2, 0), sums = Filled(4, 0x3c);
  for (auto* b : {&x16, &x32, &y, &act, &sums}) {
    if (!b->ok()) return b->status();
  }
  absl::StatusOr<int> wave = cuda::GemvWave();
  if (!wave.ok()) return wave.status();
  std::printf("batch-1 Gemv by k split (0: the engine's rule), %d CTAs a wave\n\n", *wave);
  std::printf("| projection | n × k | k split | µs plain | µs chained | µs chained + preload | best chained of 4.26 TB/s |\n|---|---|---:|---:|---:|---:|---:|\n");
  for (const Projection& p : projections) {
    absl::StatusOr<RotatingCopies> w = WeightCopies(size_t(p.n) * p.k * 2);
    if (!w.ok()) return w.status();
    for (int split : {0, 1, 2, 4, 8}) {
      double us[3] = {};
      for (int mode = 0; mode < 3; ++mode) {
        cuda::GemvArgs a = GemvFor(p, *x16, *x32, *y, *act, *sums);
        a.k_split = split, a.overlap_previous = mode > 0, a.preload_w = mode == 2;
        absl::StatusOr<double> t = TimeGraph(s, reps, [&]() -> absl::Status {
          a.w = w->Next();
          return cuda::Gemv(a, s);
        });
        if (!t.ok()) return t.status();
        us[mode] = *t;
      }
      const double bytes = 2.0 * p.n * p.k + (p.f32_in ? 4.0 : 2.0) * p.k;
      std::printf("| %s | %d × %d | %d | %.1f | %.1f | %.1f | %.0f%% |\n", p.name, p.n, p.k, split, us[0], us[1],
                  us[2], 100.0 * bytes / (std::min(us[1], us[2]) * 1e-6) / kCopyBandwidth);
    }
  }
  return absl::OkStatus();
}

absl::Status BenchProjections(const Shape& m, const std::vector<int>& rows_list, int reps, bool l2_hot, cudaStream_t s) {
  const std::vector<Projection> projections = Projections(m);
  const int max_rows = *std::max_element(rows_list.begin(), rows_list.end());
  const auto [max_k, max_n] = MaxKN(projections);
  auto x16 = Filled(size_t(max_rows) * max_k * 2, 0x2c), x32 = Filled(size_t(max_rows) * max_k * 4, 0x3c);
  auto y = Filled(size_t(max_rows) * max_n * 4, 0), act = Filled(size_t(max_rows) * max_n * 2, 0);
  auto sums = Filled(size_t(max_rows) * 4, 0x3c), work = DeviceAlloc(32 << 20);
  for (auto* b : {&x16, &x32, &y, &act, &sums, &work}) {
    if (!b->ok()) return b->status();
  }
  absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> gemm = cuda::GemmRunner::Create(s, work->get(), 32 << 20);
  if (!gemm.ok()) return gemm.status();
  if (l2_hot) std::printf("weights: one copy each (--l2-hot): read from L2 after the first launch where they fit\n\n");
  std::printf("| projection | rows | n × k | kernel | µs | TB/s | of 4.26 TB/s |\n|---|---:|---|---|---:|---:|---:|\n");
  for (const Projection& p : projections) {
    absl::StatusOr<RotatingCopies> w = WeightCopies(size_t(p.n) * p.k * 2, l2_hot);
    if (!w.ok()) return w.status();
    for (int rows : rows_list) {
      const bool gemv = rows == 1;
      cuda::GemvArgs a = GemvFor(p, *x16, *x32, *y, *act, *sums);
      auto launch = [&]() -> absl::Status {
        const __half* wp = w->Next();
        a.w = wp;
        if (gemv) return cuda::Gemv(a, s);
        return (*gemm)->Run(static_cast<const __half*>(x16->get()), rows, p.k, wp, p.n, p.residual ? 1.0f : 0.0f,
                            static_cast<float*>(y->get()));
      };
      if (!gemv) {  // time cuBLASLt's candidates for this shape first, as the engine does at start
        (*gemm)->set_tuning(true);
        if (absl::Status st = launch(); !st.ok()) return st;
        (*gemm)->set_tuning(false);
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
      }
      if (rows == 1) {  // what `ncu --profile-from-start off` sees: one launch of each batch-1 kernel
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaProfilerStart());
        if (absl::Status st = launch(); !st.ok()) return st;
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaProfilerStop());
      }
      absl::StatusOr<double> us = TimeGraph(s, reps, launch);
      if (!us.ok()) return us.status();
      const double bytes = 2.0 * p.n * p.k + (p.f32_in && gemv ? 4.0 : 2.0) * rows * p.k;  // cuBLASLt reads fp16 X
      const double tbs = bytes / (*us * 1e-6) / 1e12;
      std::printf("| %s | %d | %d × %d | %s | %.1f | %.2f | %.0f%% |\n", p.name, rows, p.n, p.k,
                  gemv ? "Gemv" : "cuBLASLt", *us, tbs, 100.0 * tbs * 1e12 / kCopyBandwidth);
    }
  }
  return absl::OkStatus();
}

// One layer's decode attention inputs at `rows` sequences of `context` cached tokens: q, the block
// tables, and KV (with scales) in copies past L2 unless `l2_hot`, each launch reading the next (in a
// step the attention finds its layer's KV in DRAM).
struct AttentionInputs {
  RotatingCopies k, v, ks, vs;
  DeviceMemory q, table, seq, pos, out;
  KvGeometry g;
  RowMeta meta;
  int q_stride = 0;
  double kv_bytes = 0;  // what one launch reads
  KvLayerView Layer() { return KvLayerView{k.Next<void>(), v.Next<void>(), ks.Next<float>(), vs.Next<float>()}; }
  const float* Q() const { return static_cast<const float*>(q.get()); }
  __half* Out() const { return static_cast<__half*>(out.get()); }
};

absl::StatusOr<AttentionInputs> MakeAttentionInputs(const Shape& m, KvDtype dtype, int rows, int context, bool l2_hot) {
  const int block = 16, hd = m.head_dim, kvh = m.kv_heads;
  const int per_seq = (context + block) / block, blocks = rows * per_seq + 1;
  const size_t entries = size_t(blocks) * block * kvh;
  const double elem = KvElementBytes(dtype), scale = dtype == KvDtype::kFp16 ? 0 : 4;
  const int copies = RotatingCopies::PastL2(entries * (hd * size_t(elem) + 4) * 2, l2_hot);
  auto k = RotatingCopies::Make(entries * hd * size_t(elem), copies, 0x38);
  auto v = RotatingCopies::Make(entries * hd * size_t(elem), copies, 0x38);
  auto ks = RotatingCopies::Make(entries * 4, copies), vs = RotatingCopies::Make(entries * 4, copies);
  for (auto* b : {&k, &v, &ks, &vs}) {
    if (!b->ok()) return b->status();
  }
  const int q_stride = (m.heads + 2 * kvh) * hd;
  auto q = Filled(size_t(rows) * q_stride * 4, 0x3c);
  std::vector<int32_t> table(size_t(rows) * per_seq), seq(rows), pos(rows, context);
  for (size_t i = 0; i < table.size(); ++i) table[i] = 1 + int32_t(i);
  for (int r = 0; r < rows; ++r) seq[r] = r;
  auto dtable = DeviceAlloc(table.size() * 4), dseq = DeviceAlloc(rows * 4), dpos = DeviceAlloc(rows * 4);
  auto out = DeviceAlloc(size_t(rows) * m.heads * hd * 2);
  for (auto* b : {&q, &dtable, &dseq, &dpos, &out}) {
    if (!b->ok()) return b->status();
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dtable->get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dseq->get(), seq.data(), rows * 4, cudaMemcpyHostToDevice));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dpos->get(), pos.data(), rows * 4, cudaMemcpyHostToDevice));
  AttentionInputs in{*std::move(k),    *std::move(v),      *std::move(ks),
                     *std::move(vs),   *std::move(q),      *std::move(dtable),
                     *std::move(dseq), *std::move(dpos),   *std::move(out),
                     KvGeometry{block, kvh, hd, per_seq, dtype}, RowMeta{}};
  in.meta = RowMeta{static_cast<const int32_t*>(in.seq.get()), static_cast<const int32_t*>(in.pos.get()),
                    static_cast<const int32_t*>(in.table.get())};
  in.q_stride = q_stride;
  in.kv_bytes = double(rows) * (context + 1) * kvh * (hd * elem + scale) * 2;
  return in;
}

absl::Status BenchAttention(const Shape& m, KvDtype dtype, const std::vector<int>& rows_list,
                            const std::vector<int>& contexts, int reps, bool l2_hot, cudaStream_t s) {
  const int hd = m.head_dim;
  absl::StatusOr<int> per_sm = cuda::AttentionCtasPerSm({.heads = m.heads}, {16, m.kv_heads, hd, 1, dtype});
  if (!per_sm.ok()) return per_sm.status();
  std::printf("\ndecode attention, %s cache, %d CTAs per SM; one row per sequence at position `context`; KV %s\n\n",
              KvDtypeName(dtype), *per_sm, l2_hot ? "one copy (L2-hot where it fits)" : "rotating copies past L2");
  std::printf("| rows | context | splits | warps | µs | KV GB/s read | of 4.26 TB/s |\n|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int rows : rows_list) {
    for (int context : contexts) {
      absl::StatusOr<AttentionInputs> in = MakeAttentionInputs(m, dtype, rows, context, l2_hot);
      if (!in.ok()) return in.status();
      // 4·s warps in one split stream as s splits of 4 warps (FP8 decode on the tensor cores).
      const bool wide = cuda::AttentionTakesNewKv(in->g);
      for (auto [splits, warps] : {std::pair{1, 4}, {2, 4}, {4, 4}, {8, 4}, {16, 4}, {32, 4}, {1, 8}, {1, 16}, {2, 16}}) {
        if (warps != 4 && !wide) continue;
        const cuda::AttentionShape shape{.rows = rows, .heads = m.heads, .q_stride = in->q_stride, .splits = splits,
                                         .scale = 1.0f / std::sqrt(float(hd)), .warps = warps};
        auto ws = DeviceAlloc(cuda::AttentionWorkspaceFloats(shape, hd) * 4);
        if (!ws.ok()) return ws.status();
        absl::StatusOr<double> us = TimeGraph(s, reps, [&] {
          return cuda::PagedAttention(in->Q(), shape, in->meta, in->g, in->Layer(), static_cast<float*>(ws->get()),
                                      in->Out(), s);
        });
        if (!us.ok()) return us.status();
        const double gbs = in->kv_bytes / (*us * 1e-6) / 1e9;
        std::printf("| %d | %d | %d | %d | %.1f | %.0f | %.0f%% |\n", rows, context, splits, warps, *us, gbs,
                    100.0 * gbs * 1e9 / kCopyBandwidth);
      }
    }
  }
  return absl::OkStatus();
}

// What this GPU's memory does for a pure stream, so that a machine other than the H200 of
// ../shared/gpu/README.md can be read against its own ceilings: a device-to-device copy (bytes read
// + written, the README's measure), then a read-only stream (StreamRead, the best of 1-8 CTAs an
// SM) of each decode op's bytes at the 8B shape, from DRAM (copies rotate past L2). The read of an
// op's bytes is the least that op can take here, ramp and tail included.
absl::Status BenchCeilings(const Shape& m, int vocab, int reps, cudaStream_t s) {
  int sms = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t copy_bytes = size_t(1) << 30;
  auto src = Filled(copy_bytes, 0x3c), dst = Filled(copy_bytes, 0), sink = Filled(64, 0);
  for (auto* b : {&src, &dst, &sink}) {
    if (!b->ok()) return b->status();
  }
  // Timed on the stream, not in a graph: captured, the same copy read 2.77 TB/s on the H200
  // against the H200's 4.26 that ../shared/gpu/README.md gives.
  const int copy_reps = std::max(2, reps / 10);
  absl::StatusOr<CudaEvent> start = MakeEvent(), stop = MakeEvent();
  if (!start.ok()) return start.status();
  if (!stop.ok()) return stop.status();
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst->get(), src->get(), copy_bytes, cudaMemcpyDeviceToDevice, s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start->get(), s));
  for (int i = 0; i < copy_reps; ++i) {
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst->get(), src->get(), copy_bytes, cudaMemcpyDeviceToDevice, s));
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop->get(), s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop->get()));
  float ms = 0.0f;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start->get(), stop->get()));
  const double copy_us = 1e3 * ms / copy_reps, copy_tbs = 2.0 * copy_bytes / (copy_us * 1e-6) / 1e12;
  std::printf("\nceilings: %d SMs; device-to-device copy of 1 GiB on the stream: %.1f µs, %.2f TB/s read + written "
              "(the H200's: 4.26)\n\n", sms, copy_us, copy_tbs);
  const size_t h = m.hidden, qkv = size_t(m.heads + 2 * m.kv_heads) * m.head_dim, qd = size_t(m.heads) * m.head_dim;
  const std::vector<std::pair<const char*, size_t>> ops = {
      {"o", h * qd * 2},           {"q/k/v", qkv * h * 2},          {"down", h * m.ffn * 2},
      {"gate/up", 2 * h * m.ffn * 2}, {"FFN (gate/up + down)", 3 * h * m.ffn * 2}, {"LM head", size_t(vocab) * h * 2}};
  std::printf("| bytes of | MB | read µs | read TB/s | CTAs an SM | µs at this GPU's copy rate | µs at 4.26 TB/s |\n"
              "|---|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& [name, bytes] : ops) {
    absl::StatusOr<RotatingCopies> w = RotatingCopies::Make(bytes, RotatingCopies::PastL2(bytes, false));
    if (!w.ok()) return w.status();
    double best = 0.0;
    int best_per_sm = 0;
    for (int per_sm : {1, 2, 4, 8}) {
      absl::StatusOr<double> us = TimeGraph(s, reps, [&]() {
        return bench::StreamRead(w->Next(), bytes, per_sm * sms, static_cast<unsigned*>(sink->get()), s);
      });
      if (!us.ok()) return us.status();
      if (best_per_sm == 0 || *us < best) best = *us, best_per_sm = per_sm;
    }
    std::printf("| %s | %.1f | %.1f | %.2f | %d | %.1f | %.1f |\n", name, bytes / 1e6, best, bytes / (best * 1e-6) / 1e12,
                best_per_sm, bytes / (copy_tbs * 1e12) * 1e6, bytes / kCopyBandwidth * 1e6);
  }
  return absl::OkStatus();
}

// What one CTA's TMA ring streams an SM (bench/ring_probe.h), from a bare ring (W boxes, 4 consumer
// warps that only wait and release) up to StreamFfn's gate/up item one piece at a time: X's
// boxes, tiles claimed from a counter, the per-tile epilogue, the MMAs. The gate/up matrix's
// 64-row tiles over the whole k, at 1 / 2 / 4 boxes a stage, on an eighth of the SMs (where the
// DRAM leaves each SM far more than it takes: the SM's own cap; an H100's bare ring: 88 / 129 /
// 158 GB/s an SM, StreamFfn's gate/up items 17 / 28 / 41) and on half.
absl::Status BenchRingProbe(const Shape& m, int reps, cudaStream_t s) {
  int sms = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int rows = 2 * m.ffn, k = m.hidden;
  const size_t bytes = size_t(rows) * k * 2;
  absl::StatusOr<RotatingCopies> w = RotatingCopies::Make(bytes, RotatingCopies::PastL2(bytes, false));
  if (!w.ok()) return w.status();
  auto x = Filled(size_t(16) * k * 2, 0x2c), out = Filled(size_t(16) * rows * 4, 0), counters = Filled(64, 0);
  for (auto* b : {&x, &out, &counters}) {
    if (!b->ok()) return b->status();
  }
  static constexpr const char* kLevels[bench::kRingLevels] = {"bare ring", "+ X boxes", "+ claimed tiles",
                                                              "+ epilogue", "+ MMAs (StreamFfn's item)"};
  std::printf("\nring probe: a [%d, %d] fp16 matrix (%.0f MB) in 64-row × 64-k TMA boxes\n\n"
              "| k boxes a stage | level | CTAs | µs | TB/s | GB/s an SM |\n|---:|---|---:|---:|---:|---:|\n",
              rows, k, bytes / 1e6);
  for (int k_boxes : {1, 2, 4}) {
    for (int level = 0; level < bench::kRingLevels; ++level) {
      for (int ctas : {sms / 8, sms / 2}) {
        absl::StatusOr<double> us = TimeGraph(s, reps, [&]() {
          return bench::RingProbe({.w = w->Next<const __half>(), .rows = rows, .k = k, .k_boxes = k_boxes,
                                   .level = static_cast<bench::RingLevel>(level),
                                   .x = static_cast<const __half*>(x->get()), .out = static_cast<float*>(out->get()),
                                   .counters = static_cast<int*>(counters->get()), .ctas = ctas},
                                  s);
        });
        if (!us.ok()) return us.status();
        const double tbs = bytes / (*us * 1e-6) / 1e12;
        std::printf("| %d | %s | %d | %.1f | %.2f | %.0f |\n", k_boxes, kLevels[level], ctas, *us, tbs, tbs * 1e3 / ctas);
      }
    }
  }
  return absl::OkStatus();
}

// The probe before a dataflow attention + o design at batch 16: can o's W (or any W) stream on the
// room an attention CTA leaves on its SM while the attention runs, without slowing it? Times the
// attention (8 or 16 warps a CTA, one split), a pure DRAM read of o's bytes (StreamRead, 1-4 CTAs
// an SM) and cuBLASLt's o (two k chunks, as the engine) alone, then in pairs on two graph branches
// with no dependency between them (the data is not what a layer computes: only time). If a pair
// takes about the longer of its two, the SMs can stream W beside the attention.
absl::Status BenchOverlap(const Shape& m, KvDtype dtype, int reps, cudaStream_t s) {
  const int rows = 16, context = 512, hd = m.head_dim, h = m.hidden, qd = m.heads * hd;
  absl::StatusOr<AttentionInputs> in = MakeAttentionInputs(m, dtype, rows, context, false);
  if (!in.ok()) return in.status();
  int sms = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t o_bytes = size_t(h) * qd * 2;
  absl::StatusOr<RotatingCopies> w = RotatingCopies::Make(o_bytes, RotatingCopies::PastL2(o_bytes, false));
  if (!w.ok()) return w.status();
  auto x = Filled(size_t(rows) * qd * 2, 0x2c), partials = Filled(size_t(2) * rows * h * 4, 0);
  auto sink = Filled(64, 0), work = DeviceAlloc(32 << 20), ws = DeviceAlloc(size_t(64) << 20);
  for (auto* b : {&x, &partials, &sink, &work, &ws}) {
    if (!b->ok()) return b->status();
  }
  absl::StatusOr<CudaStream> side = MakeStream();
  if (!side.ok()) return side.status();
  auto gemm = cuda::GemmRunner::Create(side->get(), work->get(), 32 << 20);
  if (!gemm.ok()) return gemm.status();
  absl::StatusOr<CudaEvent> fork = MakeEvent(), join = MakeEvent();
  if (!fork.ok()) return fork.status();
  if (!join.ok()) return join.status();
  using Launch = std::function<absl::Status(cudaStream_t)>;
  auto attention = [&](int warps) -> Launch {
    return [&, warps](cudaStream_t st) {
      const cuda::AttentionShape shape{.rows = rows, .heads = m.heads, .q_stride = in->q_stride, .splits = 1,
                                       .scale = 1.0f / std::sqrt(float(hd)), .warps = warps};
      return cuda::PagedAttention(in->Q(), shape, in->meta, in->g, in->Layer(), static_cast<float*>(ws->get()),
                                  in->Out(), st);
    };
  };
  // The runner is bound to the side stream: o always runs on the side branch.
  const Launch o_gemm = [&](cudaStream_t) -> absl::Status {
    absl::StatusOr<int> chunks = (*gemm)->RunSplitK(static_cast<const __half*>(x->get()), rows, qd, w->Next(), h, 2,
                                                    static_cast<float*>(partials->get()), int64_t{rows} * h);
    return chunks.ok() ? absl::OkStatus() : chunks.status();
  };
  auto read = [&](int per_sm) -> Launch {
    return [&, per_sm](cudaStream_t st) {
      return bench::StreamRead(w->Next(), o_bytes, per_sm * sms, static_cast<unsigned*>(sink->get()), st);
    };
  };
  const Launch nothing = [](cudaStream_t) { return absl::OkStatus(); };
  // a on the main stream and b on a side branch, joined: at once (b captured first when b_first)
  // or b after a (serial).
  auto pair = [&](Launch a, Launch b, bool b_first, bool serial) -> std::function<absl::Status()> {
    return [&, a, b, b_first, serial]() -> absl::Status {
      if (serial) {
        if (absl::Status e = a(s); !e.ok()) return e;
      }
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork->get(), s));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side->get(), fork->get(), 0));
      if (b_first || serial) {
        if (absl::Status e = b(side->get()); !e.ok()) return e;
      }
      if (!serial) {
        if (absl::Status e = a(s); !e.ok()) return e;
      }
      if (!b_first && !serial) {
        if (absl::Status e = b(side->get()); !e.ok()) return e;
      }
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(join->get(), side->get()));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, join->get(), 0));
      return absl::OkStatus();
    };
  };
  (*gemm)->set_tuning(true);
  if (absl::Status e = o_gemm(side->get()); !e.ok()) return e;
  (*gemm)->set_tuning(false);
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  std::printf("\noverlap probe: 16 rows, 512 tokens, %s; o's W %.1f MB (%.1f µs at 4.26 TB/s), KV %.1f MB\n\n",
              KvDtypeName(dtype), o_bytes / 1e6, o_bytes / kCopyBandwidth * 1e6, in->kv_bytes / 1e6);
  std::printf("| what | µs |\n|---|---:|\n");
  std::vector<std::pair<std::string, std::function<absl::Status()>>> cases;
  for (int warps : {8, 16}) {
    cases.emplace_back(absl::StrCat("attention, ", warps, " warps a CTA, alone"),
                       pair(attention(warps), nothing, false, true));
  }
  for (int per_sm : {1, 2, 4}) {
    cases.emplace_back(absl::StrCat("read o's bytes alone, ", per_sm, " CTAs an SM"),
                       pair(read(per_sm), nothing, false, true));
  }
  cases.emplace_back("cuBLASLt o alone (2 k chunks)", pair(nothing, o_gemm, false, true));
  for (int warps : {8, 16}) {
    cases.emplace_back(absl::StrCat("attention ", warps, " warps, then cuBLASLt o (the engine's chain)"),
                       pair(attention(warps), o_gemm, false, true));
    for (bool b_first : {false, true}) {
      for (int per_sm : {1, 2, 4}) {
        cases.emplace_back(absl::StrCat("attention ", warps, " warps beside the read, ", per_sm, " CTAs an SM",
                                        b_first ? " (read captured first)" : ""),
                           pair(attention(warps), read(per_sm), b_first, false));
      }
      cases.emplace_back(
          absl::StrCat("attention ", warps, " warps beside cuBLASLt o", b_first ? " (o captured first)" : ""),
          pair(attention(warps), o_gemm, b_first, false));
    }
  }
  for (auto& [name, launch] : cases) {
    absl::StatusOr<double> us = TimeGraph(s, reps, launch);
    if (!us.ok()) return us.status();
    std::printf("| %s | %.1f |\n", name.c_str(), *us);
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

// The engine's cuBLASLt call above batch 1 for projection p: RunSplitK's two chunks into fp32
// partials (rows · n floats apart), or (whole) one GEMM, as gate/up feeds SwiGLU.
absl::Status RunLikeEngine(cuda::GemmRunner& gemm, const Projection& p, int rows, const __half* x, const __half* w,
                           float* y, bool whole = false) {
  return whole ? gemm.Run(x, rows, p.k, w, p.n, 0.0f, y)
               : gemm.RunSplitK(x, rows, p.k, w, p.n, 2, y, int64_t(p.n) * rows).status();
}

// A runner of its own (plans are tuned once) whose plan for p at `rows` is tuned as the engine
// tunes it since b38bd08: each candidate timed over the weight copies in turn, as over the layers.
absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> LayerTunedRunner(cudaStream_t s, void* work, size_t work_bytes,
                                                                   const RotatingCopies& w, const Projection& p,
                                                                   int rows, const __half* x, float* y,
                                                                   bool whole = false) {
  absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> gemm = cuda::GemmRunner::Create(s, work, work_bytes);
  if (!gemm.ok()) return gemm.status();
  (*gemm)->set_tuning_layers(w.first(), int64_t(w.stride()), w.count());
  (*gemm)->set_tuning(true);
  absl::Status st = RunLikeEngine(**gemm, p, rows, x, static_cast<const __half*>(w.first()), y, whole);
  (*gemm)->set_tuning(false);
  if (!st.ok()) return st;
  return gemm;
}

// GemmRunner's pick for the projection at `rows` (its candidates timed on the first call, as the
// engine does at start), then that pick's mean µs in a graph as the engine replays it; each call
// of `weights` gives the next weight copy.
absl::StatusOr<double> TunedGemmRunnerUs(cuda::GemmRunner& gemm, const Projection& p, int rows, const __half* x,
                                         const std::function<const __half*()>& weights, float* y, int reps,
                                         cudaStream_t s) {
  const float beta = p.residual ? 1.0f : 0.0f;
  gemm.set_tuning(true);
  if (absl::Status st = gemm.Run(x, rows, p.k, weights(), p.n, beta, y); !st.ok()) return st;
  gemm.set_tuning(false);
  return TimeGraph(s, reps, [&] { return gemm.Run(x, rows, p.k, weights(), p.n, beta, y); });
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
  absl::StatusOr<CudaEvent> start = MakeEvent(), stop = MakeEvent();
  if (!start.ok()) return start.status();
  if (!stop.ok()) return stop.status();
  std::printf("\n| projection | rows | tuned (GemmRunner) µs | heuristic best of 100 µs | search best µs | of 4.26 TB/s | configs timed | best config |\n"
              "|---|---:|---:|---:|---:|---:|---:|---|\n");
  for (const Projection& p : projections) {
    absl::StatusOr<RotatingCopies> w = WeightCopies(size_t(p.n) * p.k * 2);
    if (!w.ok()) return w.status();
    for (int rows : rows_list) {
      if (rows == 1) continue;
      const float beta = p.residual ? 1.0f : 0.0f, alpha = 1.0f;
      const auto* x = static_cast<const __half*>(x16->get());
      auto* yp = static_cast<float*>(y->get());
      auto wp = [&] { return w->Next<const __half>(); };
      absl::StatusOr<double> tuned = TunedGemmRunnerUs(**gemm, p, rows, x, wp, yp, reps, s);
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

// StreamFfn's (chunks, lag) pairs the MLP-block bench times: the lag (in gate/up groups) must
// cover a gate/up item's time in flight, or down's first items wait, and the chunks set the size of
// down's items, which the tail is made of (lag = chunks: every gate/up item first, then down's).
// (chunks, lag, k boxes a stage, last chunk, last chunks): StreamFfnArgs::k_boxes 4 beside the
// default 2, and smaller last chunks (the 8B's 14336 = 3 · 4096 + 2048, 2 · 5120 + 2 · 2048,
// 2 · 4608 + 2 · 2560, 6656 + 3 · 2560, 8192 + 3 · 2048, 9728 + 3 · 1536), which shorten the
// tail (more than 4 chunks: more partials than the next norm adds; 8 and 16 lost or tied,
// bench/RESULTS.md).
constexpr std::tuple<int, int, int, int, int> kStreamFfnShapes[] = {
    {4, 3, 2, 0, 1},    {8, 6, 2, 0, 1},    {4, 3, 4, 0, 1},    {4, 4, 4, 0, 1},    {4, 3, 4, 2048, 1},
    {4, 3, 4, 2048, 2}, {4, 2, 4, 2048, 2}, {4, 3, 4, 2560, 2}, {4, 3, 4, 2560, 3},
    {4, 3, 4, 2048, 3}, {4, 3, 4, 1536, 3}, {4, 2, 4, 2560, 3}};

// The row label's suffix for a StreamFfn shape's k boxes and last chunks (the defaults: none).
std::string StreamFfnShapeSuffix(int k_boxes, int last_chunk, int last_chunks) {
  return absl::StrCat(k_boxes == 2 ? "" : absl::StrCat(", ", k_boxes, " k boxes a stage"),
                      last_chunk == 0 ? ""
                      : last_chunks == 1 ? absl::StrCat(", last chunk ", last_chunk)
                                         : absl::StrCat(", last ", last_chunks, " chunks ", last_chunk));
}

// One StreamFfn launch (weights from DRAM) with its %globaltimer timeline, summarised: where the
// launch's time goes beyond its bytes (the ramp, items' streaming rate an SM, down's waits for
// act, the tail). Printed once per rows × chunks after the timed table.
absl::Status StreamFfnTimeline(const Shape& m, int rows, int chunks, int lag, int k_boxes, int last_chunk,
                               int last_chunks, int ctas, int max_ring_bytes, const __half* x, RotatingCopies& w,
                               __half* act, float* partials, void* counters, cudaStream_t s) {
  const int h = m.hidden, f = m.ffn;
  const std::vector<bool> down = cuda::StreamFfnItemIsDown(h, f, chunks, lag, last_chunk, last_chunks);
  const int items = static_cast<int>(down.size());
  // Room for a CTA an item, the most the launch takes; the CTAs that ran are those with an end.
  const size_t words = size_t(4) * items + 6 * items;
  absl::StatusOr<DeviceMemory> buf = Filled(words * 8, 0);
  if (!buf.ok()) return buf.status();
  const size_t gu_elems = size_t(2) * f * h;
  std::vector<uint64_t> t(words);
  for (int rep = 0; rep < 3; ++rep) {  // the last of three: the function attributes set, clocks up
    const __half* wc = w.Next<const __half>();
    if (absl::Status e = cuda::StreamFfn({.x = x, .rows = rows, .hidden = h, .w_gate_up = wc, .ffn = f,
                                          .w_down = wc + gu_elems, .act = act, .chunks = chunks, .lag = lag,
                                          .partials = partials, .partial_stride = int64_t(rows) * h,
                                          .workspace = counters, .ctas = ctas, .k_boxes = k_boxes,
                                          .last_chunk = last_chunk, .last_chunks = last_chunks,
                                          .max_ring_bytes = max_ring_bytes,
                                          .timeline = static_cast<uint64_t*>(buf->get())},
                                         s);
        !e.ok()) {
      return e;
    }
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(t.data(), buf->get(), words * 8, cudaMemcpyDeviceToHost));
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
  const std::string ring = max_ring_bytes > 0 ? absl::StrCat(", ring ", max_ring_bytes / 1024, " KB") : "";
  std::printf("| %s | %d | %d | %d | %.1f | %.2f | %.1f | %.2f (%.0f) | %.2f (%.0f) | %d (%.1f, %.1f) | %.1f, %.1f, %.1f, %.1f "
              "| %.0f%% | %.0f%% |\n",
              absl::StrCat(StreamFfnShapeSuffix(k_boxes, last_chunk, last_chunks),
                           ctas > 0 ? absl::StrCat(", ", ctas, " CTAs") : "", ring)
                  .c_str(),
              rows, chunks, lag, span, bytes / (span * 1e-6) / 1e12, firsts ? first_done / firsts : 0.0, gu_us,
              gu_us > 0 ? gu_kb * 1024 / (gu_us * 1e3) : 0.0, down_us, down_us > 0 ? down_kb * 1024 / (down_us * 1e3) : 0.0,
              waited, wait_sum, wait_max, ends.front(), ends[ends.size() / 2], ends[ends.size() * 9 / 10], ends.back(),
              100 * consumer_waits / ran, 100 * producer_waits / ran);
  return absl::OkStatus();
}

// Can two cuBLASLt chains on forked graph branches fill each other's ramps, tails and small
// kernels? The MLP block at `rows` rows on one stream (gate/up → SwiGLU → down with the residual)
// against the same bytes split in two halves along the FFN dimension (each half: gate/up of f/2
// features → SwiGLU → down over those f/2 inputs, a column slice of W_down, into its own output), the
// halves on two branches: started together, B's gate/up after A's (A's SwiGLU and down then run
// beside it), and started together with B at a lower stream priority. Constant data: only time.
absl::Status BenchMlpBranches(const Shape& m, const std::vector<int>& rows_list, int reps) {
  int sms = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int h = m.hidden, f = m.ffn;
  // A and B at the device's greatest priority, the low-priority B at its least (which is also the
  // default: the engine's streams have it).
  int lo_prio = 0, hi_prio = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&lo_prio, &hi_prio));
  cudaStream_t raw_a = nullptr, raw_b = nullptr, raw_low = nullptr;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&raw_a, cudaStreamNonBlocking, hi_prio));
  CudaStream sa(raw_a);
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&raw_b, cudaStreamNonBlocking, hi_prio));
  CudaStream sb(raw_b);
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&raw_low, cudaStreamNonBlocking, lo_prio));
  CudaStream sl(raw_low);
  const int max_rows = *std::max_element(rows_list.begin(), rows_list.end());
  auto x16 = Filled(size_t(max_rows) * h * 2, 0x2c), gu = Filled(size_t(max_rows) * 2 * f * 4, 0);
  auto act = Filled(size_t(max_rows) * f * 2, 0), y = Filled(size_t(max_rows) * h * 4, 0),
       y2 = Filled(size_t(max_rows) * h * 4, 0);
  auto work_a = DeviceAlloc(32 << 20), work_b = DeviceAlloc(32 << 20), work_l = DeviceAlloc(32 << 20);
  // StreamFfn's: its counters and down's k-chunk partials.
  auto counters = Filled(cuda::kStreamGemmWorkspaceBytes, 0), partials = Filled(size_t(8) * max_rows * h * 4, 0);
  // The StreamGemm chain's: gate/up's two k-chunk partials, and a counter region a projection.
  auto gu_parts = Filled(size_t(2) * max_rows * 2 * f * 4, 0);
  auto chain_counters = Filled(2 * cuda::kStreamGemmWorkspaceBytes, 0);
  for (auto* b :
       {&x16, &gu, &act, &y, &y2, &work_a, &work_b, &work_l, &counters, &partials, &gu_parts, &chain_counters}) {
    if (!b->ok()) return b->status();
  }
  auto gemm_a = cuda::GemmRunner::Create(sa.get(), work_a->get(), 32 << 20);
  auto gemm_b = cuda::GemmRunner::Create(sb.get(), work_b->get(), 32 << 20);
  auto gemm_l = cuda::GemmRunner::Create(sl.get(), work_l->get(), 32 << 20);
  if (!gemm_a.ok()) return gemm_a.status();
  if (!gemm_b.ok()) return gemm_b.status();
  if (!gemm_l.ok()) return gemm_l.status();
  // Weight copies of the whole MLP (gate/up then down, 352 MB at the 8B shape): each timed MLP
  // reads its own from DRAM. A half's weights are the first or second half of a copy's bytes.
  const size_t gu_elems = size_t(2) * f * h, down_elems = size_t(h) * f;
  absl::StatusOr<RotatingCopies> w = RotatingCopies::Make((gu_elems + down_elems) * 2, 3);
  if (!w.ok()) return w.status();
  absl::StatusOr<CudaEvent> fork = MakeEvent(), mid = MakeEvent(), join = MakeEvent();
  if (!fork.ok()) return fork.status();
  if (!mid.ok()) return mid.status();
  if (!join.ok()) return join.status();
  const auto* x = static_cast<const __half*>(x16->get());
  auto* gu_out = static_cast<float*>(gu->get());
  auto* act_out = static_cast<__half*>(act->get());
  std::printf("\n| MLP block, %d × %d (gate/up) + %d × %d (down) | rows | µs | of 4.26 TB/s |\n|---|---:|---:|---:|\n",
              2 * f, h, h, f);
  for (int rows : rows_list) {
    if (rows < 2) continue;
    auto weights = [&] { return w->Next<const __half>(); };
    // One half (0 or 1) of the MLP on `gemm`'s stream.
    auto half = [&](cuda::GemmRunner& gemm, cudaStream_t st, const __half* wc, int which, float* out, float beta,
                    cudaEvent_t after_gate_up) -> absl::Status {
      const __half* wg = wc + size_t(which) * gu_elems / 2;
      const __half* wd = wc + gu_elems + size_t(which) * (f / 2);  // columns of W_down, as the engine
      float* g = gu_out + size_t(which) * rows * f;
      __half* a = act_out + size_t(which) * rows * f / 2;
      if (absl::Status e = gemm.Run(x, rows, h, wg, f, 0.0f, g); !e.ok()) return e;
      if (after_gate_up) TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(after_gate_up, st));
      if (absl::Status e = cuda::SwiGlu(g, rows, f / 2, a, st); !e.ok()) return e;
      return gemm.Run(a, rows, f / 2, wd, h, beta, out, /*ldw=*/f);
    };
    auto serial = [&]() -> absl::Status {
      const __half* wc = weights();
      if (absl::Status e = (*gemm_a)->Run(x, rows, h, wc, 2 * f, 0.0f, gu_out); !e.ok()) return e;
      if (absl::Status e = cuda::SwiGlu(gu_out, rows, f, act_out, sa.get()); !e.ok()) return e;
      return (*gemm_a)->Run(act_out, rows, f, wc + gu_elems, h, 1.0f, static_cast<float*>(y->get()));
    };
    // mode 0: both halves at once; 1: B's gate/up after A's; 2: both at once, B at low priority.
    auto branches = [&](int mode) {
      return [&, mode]() -> absl::Status {
        const __half* wc = weights();
        cuda::GemmRunner& gb = mode == 2 ? **gemm_l : **gemm_b;
        cudaStream_t b = mode == 2 ? sl.get() : sb.get();
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork->get(), sa.get()));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(b, fork->get(), 0));
        cudaEvent_t after_a_gate_up = mode == 1 ? mid->get() : nullptr;
        if (absl::Status e = half(**gemm_a, sa.get(), wc, 0, static_cast<float*>(y->get()), 1.0f, after_a_gate_up);
            !e.ok()) {
          return e;
        }
        if (after_a_gate_up) TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(b, after_a_gate_up, 0));
        if (absl::Status e = half(gb, b, wc, 1, static_cast<float*>(y2->get()), 0.0f, nullptr); !e.ok()) return e;
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(join->get(), b));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(sa.get(), join->get(), 0));
        return absl::OkStatus();
      };
    };
    // cuBLASLt's timing for every shape on every runner first, as the engine does at start.
    for (auto* g : {&gemm_a, &gemm_b, &gemm_l}) (**g)->set_tuning(true);
    if (absl::Status e = serial(); !e.ok()) return e;
    for (int mode = 0; mode < 3; ++mode) {
      if (absl::Status e = branches(mode)(); !e.ok()) return e;
    }
    for (auto* g : {&gemm_a, &gemm_b, &gemm_l}) (**g)->set_tuning(false);
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
                                .partials = static_cast<float*>(partials->get()), .partial_stride = int64_t(rows) * h,
                                .workspace = counters->get(), .ctas = ctas, .k_boxes = k_boxes, .last_chunk = last,
                                .last_chunks = count},
                               sa.get());
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
                                       sms / 8, " CTAs"),
                          stream_ffn(4, 3, k_boxes, 0, 1, sms / 8)});
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
                 auto* parts = static_cast<float*>(gu_parts->get());
                 auto* region = static_cast<char*>(chain_counters->get());
                 const int64_t gu_stride = int64_t(rows) * 2 * f;
                 if (absl::Status e = cuda::StreamGemm({.x = x, .rows = rows, .k = h, .w = wc, .n = 2 * f, .chunks = 2,
                                                        .partials = parts, .partial_stride = gu_stride,
                                                        .workspace = region, .overlap_previous = overlap,
                                                        .variant = variant},
                                                       sa.get());
                     !e.ok()) {
                   return e;
                 }
                 if (absl::Status e = cuda::SwiGlu(nullptr, rows, f, act_out, sa.get(), overlap,
                                                   {.data = parts, .count = 2, .stride = gu_stride});
                     !e.ok()) {
                   return e;
                 }
                 return cuda::StreamGemm({.x = act_out, .rows = rows, .k = f, .w = wc + gu_elems, .n = h,
                                          .chunks = down_chunks, .partials = static_cast<float*>(partials->get()),
                                          .partial_stride = int64_t(rows) * h,
                                          .workspace = region + cuda::kStreamGemmWorkspaceBytes,
                                          .overlap_previous = overlap, .variant = variant},
                                         sa.get());
               }});
        }
      }
    }
    for (auto& [name, launch] : variants) {
      absl::StatusOr<double> us = TimeGraph(sa.get(), reps, launch, cudaGraphInstantiateFlagUseNodePriority);
      if (!us.ok()) return us.status();
      std::printf("| %s | %d | %.1f | %.0f%% |\n", name.c_str(), rows, *us, 100.0 * bytes / (*us * 1e-6) / kCopyBandwidth);
    }
  }
  std::printf(
      "\n| StreamFfn timeline | rows | chunks | lag | span µs | TB/s | first item done | gate/up item µs (GB/s an SM) "
      "| down item µs (GB/s an SM) | down waits > 0.5 µs (sum, max µs) | CTA ends: first, median, 90%%, last "
      "| consumer waits | producer waits |\n"
      "|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|---:|\n");
  for (int rows : rows_list) {
    if (rows < 2 || rows > cuda::kStreamGemmMaxRows) continue;
    auto timeline = [&](int chunks, int lag, int k_boxes, int last, int count, int ctas, int ring) {
      return StreamFfnTimeline(m, rows, chunks, lag, k_boxes, last, count, ctas, ring, x, *w, act_out,
                               static_cast<float*>(partials->get()), counters->get(), sa.get());
    };
    for (auto [chunks, lag, k_boxes, last, count] : kStreamFfnShapes) {
      if (!cuda::StreamFfnSplits(f, chunks, last, count)) continue;
      if (absl::Status e = timeline(chunks, lag, k_boxes, last, count, 0, 0); !e.ok()) return e;
    }
    if (!cuda::StreamFfnSplits(f, 4)) continue;
    // On an eighth of the SMs the DRAM leaves each SM far more than it takes (a bare ring: 88-158
    // GB/s an SM, --ring-probe), so an item's rate shows what one SM's pipeline does; on half an
    // H100's, the DRAM's ~45 GB/s an SM caps a fast pipeline (docs/cuda-decode.md).
    for (int ctas : {sms / 8, sms / 2}) {
      for (int k_boxes : {1, 2, 4}) {
        if (absl::Status e = timeline(4, 3, k_boxes, 0, 1, ctas, 0); !e.ok()) return e;
      }
    }
    // Two CTAs an SM, each with half a ring: two pipelines an SM (against one CTA with the same
    // half ring, and the full ring above).
    for (int k_boxes : {2, 4}) {
      for (int ctas : {sms, 2 * sms}) {
        if (absl::Status e = timeline(4, 3, k_boxes, 0, 1, ctas, cuda::kStreamFfnHalfRingBytes); !e.ok()) return e;
      }
    }
  }
  return absl::OkStatus();
}


// Do two cuBLASLt q/k/v GEMMs on forked graph branches stream their 50 MB (8B shape) faster than
// the engine's one? The q/k/v projection at `rows` rows as the engine runs it (RunSplitK, two k
// chunks, one launch: the in-situ pick uses 96 of 132 SMs on the H200) against the same W split
// by output columns into two parts started together on two streams (the FFN halves' trick), each
// part two k chunks into its own partials. Constant data: only time. Measured (H100, 16 rows):
// the parts 20.9-23.0 µs against one launch's 19.9, and the engine's two-part q/k/v (an engine
// option, deleted) lost 0.03-0.04 ms at b16 (docs/cuda-decode.md).
absl::Status BenchQkvBranches(const Shape& m, const std::vector<int>& rows_list, int reps) {
  const int h = m.hidden, n = (m.heads + 2 * m.kv_heads) * m.head_dim;
  // Both at the default priority, as the engine's main and side streams.
  absl::StatusOr<CudaStream> stream_a = MakeStream(), stream_b = MakeStream();
  if (!stream_a.ok()) return stream_a.status();
  if (!stream_b.ok()) return stream_b.status();
  CudaStream& sa = *stream_a;
  CudaStream& sb = *stream_b;
  const int max_rows = *std::max_element(rows_list.begin(), rows_list.end());
  auto x16 = Filled(size_t(max_rows) * h * 2, 0x2c), parts_a = Filled(size_t(4) * max_rows * n * 4, 0),
       parts_b = Filled(size_t(4) * max_rows * n * 4, 0);
  auto work_a = DeviceAlloc(32 << 20), work_b = DeviceAlloc(32 << 20);
  for (auto* b : {&x16, &parts_a, &parts_b, &work_a, &work_b}) {
    if (!b->ok()) return b->status();
  }
  auto gemm_a = cuda::GemmRunner::Create(sa.get(), work_a->get(), 32 << 20);
  auto gemm_b = cuda::GemmRunner::Create(sb.get(), work_b->get(), 32 << 20);
  if (!gemm_a.ok()) return gemm_a.status();
  if (!gemm_b.ok()) return gemm_b.status();
  absl::StatusOr<RotatingCopies> w = WeightCopies(size_t(n) * h * 2);
  if (!w.ok()) return w.status();
  absl::StatusOr<CudaEvent> fork = MakeEvent(), join = MakeEvent();
  if (!fork.ok()) return fork.status();
  if (!join.ok()) return join.status();
  for (auto* g : {&gemm_a, &gemm_b}) (**g)->set_tuning_layers(w->first(), int64_t(w->stride()), w->count());
  const auto* x = static_cast<const __half*>(x16->get());
  std::printf("\n| q/k/v, %d × %d | rows | µs | of 4.26 TB/s |\n|---|---:|---:|---:|\n", n, h);
  for (int rows : rows_list) {
    if (rows < 2) continue;
    const int64_t stride = int64_t(rows) * n;
    // Columns [0, first) on A's stream, the rest on B's; first = n: one launch on A's (the engine).
    // While tuning, the first copy (the runner rotates each candidate over the copies itself).
    bool tuning = true;
    auto split = [&](int first, int splits) {
      return [&, first, splits]() -> absl::Status {
        const __half* wc = tuning ? static_cast<const __half*>(w->first()) : w->Next<const __half>();
        auto* pa = static_cast<float*>(parts_a->get());
        auto* pb = static_cast<float*>(parts_b->get());
        if (first == n) return (*gemm_a)->RunSplitK(x, rows, h, wc, n, splits, pa, stride).status();
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork->get(), sa.get()));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(sb.get(), fork->get(), 0));
        if (absl::Status e = (*gemm_a)->RunSplitK(x, rows, h, wc, first, splits, pa, stride).status(); !e.ok()) {
          return e;
        }
        if (absl::Status e =
                (*gemm_b)->RunSplitK(x, rows, h, wc + size_t(first) * h, n - first, splits, pb, stride).status();
            !e.ok()) {
          return e;
        }
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(join->get(), sb.get()));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(sa.get(), join->get(), 0));
        return absl::OkStatus();
      };
    };
    const int q = m.heads * m.head_dim;
    std::vector<std::pair<std::string, std::function<absl::Status()>>> variants = {
        {"one launch, 2 k chunks (the engine)", split(n, 2)},
        {"one launch, 4 k chunks", split(n, 4)},
        {absl::StrCat("columns ", n / 2, " + ", n / 2, " at once, 2 k chunks each"), split(n / 2, 2)},
        {absl::StrCat("columns ", q, " (q) + ", n - q, " (k, v) at once, 2 k chunks each"), split(q, 2)},
        {absl::StrCat("columns ", n / 2, " + ", n / 2, " at once, 4 k chunks each"), split(n / 2, 4)},
    };
    // cuBLASLt's timing of every shape first (over the weight copies, as the engine over its layers).
    for (auto* g : {&gemm_a, &gemm_b}) (**g)->set_tuning(true);
    for (auto& [name, launch] : variants) {
      if (absl::Status e = launch(); !e.ok()) return e;
    }
    for (auto* g : {&gemm_a, &gemm_b}) (**g)->set_tuning(false);
    tuning = false;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    const double bytes = 2.0 * n * h;
    for (auto& [name, launch] : variants) {
      absl::StatusOr<double> us = TimeGraph(sa.get(), reps, launch, cudaGraphInstantiateFlagUseNodePriority);
      if (!us.ok()) return us.status();
      std::printf("| %s | %d | %.1f | %.0f%% |\n", name.c_str(), rows, *us, 100.0 * bytes / (*us * 1e-6) / kCopyBandwidth);
    }
  }
  return absl::OkStatus();
}

// StreamGemm (a persistent CTA an SM taking (64-column tile, k chunk) items from a counter) against
// the engine's path for the same partials: GemmRunner::RunSplitK's two chunks, tuned over the
// weight copies as the engine tunes over its layers. Both over rotating copies of W (past L2).
// Each variant runs with each ring size of rings_kb (0: the whole 227 KB): a smaller ring leaves
// room on the SM for another kernel's CTA (docs/cuda-decode.md, the attention beside q/k/v).
absl::Status BenchStreamGemm(const Shape& m, const std::vector<int>& rows_list, const std::vector<int>& rings_kb,
                             int reps, cudaStream_t s) {
  const std::vector<Projection> projections = Projections(m);
  const auto [max_k, max_n] = MaxKN(projections);
  constexpr size_t kWork = 32 << 20;
  auto x16 = Filled(size_t(cuda::kStreamGemmMaxRows) * max_k * 2, 0x2c);
  auto y = Filled(size_t(8) * cuda::kStreamGemmMaxRows * max_n * 4, 0), work = DeviceAlloc(kWork);
  auto counters = Filled(cuda::kStreamGemmWorkspaceBytes, 0);
  for (auto* b : {&x16, &y, &work, &counters}) {
    if (!b->ok()) return b->status();
  }
  std::printf("| projection | rows | kernel | µs: RunSplitK 2, or StreamGemm 2 chunks | 4 chunks | 8 chunks |\n"
              "|---|---:|---|---:|---:|---:|\n");
  for (const Projection& p : projections) {
    absl::StatusOr<RotatingCopies> w = WeightCopies(size_t(p.n) * p.k * 2);
    if (!w.ok()) return w.status();
    for (int rows : rows_list) {
      if (rows < 2 || rows > cuda::kStreamGemmMaxRows) continue;
      const auto* x = static_cast<const __half*>(x16->get());
      auto* yp = static_cast<float*>(y->get());
      const int64_t stride = int64_t(p.n) * rows;
      absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> gemm = LayerTunedRunner(s, work->get(), kWork, *w, p, rows, x, yp);
      if (!gemm.ok()) return gemm.status();
      absl::StatusOr<double> lt =
          TimeGraph(s, reps, [&]() -> absl::Status { return RunLikeEngine(**gemm, p, rows, x, w->Next(), yp); });
      if (!lt.ok()) return lt.status();
      std::printf("| %s | %d | cuBLASLt | %.1f | | | |\n", p.name, rows, *lt);
      for (int variant = 0; variant < 5; ++variant) {
        for (int ring_kb : rings_kb) {
          std::printf("| %s | %d | variant %d, ring %s |", p.name, rows, variant,
                      ring_kb > 0 ? absl::StrCat(ring_kb, " KB").c_str() : "all");
          for (int chunks : {2, 4, 8}) {
            if (p.k % (cuda::StreamGemmKStep(variant) * chunks) != 0) {
              std::printf(" – |");
              continue;
            }
            absl::StatusOr<double> us = TimeGraph(s, reps, [&]() -> absl::Status {
              return cuda::StreamGemm({.x = x, .rows = rows, .k = p.k, .w = w->Next(), .n = p.n, .chunks = chunks,
                                       .partials = yp, .partial_stride = stride, .workspace = counters->get(),
                                       .max_ring_bytes = ring_kb * 1024, .variant = variant},
                                      s);
            });
            if (!us.ok()) return us.status();
            std::printf(" %.1f |", *us);
          }
          std::printf("\n");
        }
      }
    }
  }
  return absl::OkStatus();
}

// The LM head (vocab × hidden, one matrix, past L2 by itself) at 2-16 rows: cuBLASLt as the engine
// ran it (GemmRunner::Run, tuned on its first call) against StreamGemm over the whole k (one
// partial: the logits), per variant.
absl::Status BenchLmHead(const Shape& m, int vocab, const std::vector<int>& rows_list, int reps, cudaStream_t s) {
  const Projection p{"lm_head", vocab, m.hidden, false, false, false};
  constexpr size_t kWork = 32 << 20;
  auto x16 = Filled(size_t(cuda::kStreamGemmMaxRows) * p.k * 2, 0x2c), w = Filled(size_t(p.n) * p.k * 2, 0x3c);
  auto y = Filled(size_t(cuda::kStreamGemmMaxRows) * p.n * 4, 0), work = DeviceAlloc(kWork);
  auto counters = Filled(cuda::kStreamGemmWorkspaceBytes, 0);
  for (auto* b : {&x16, &w, &y, &work, &counters}) {
    if (!b->ok()) return b->status();
  }
  const auto* x = static_cast<const __half*>(x16->get());
  const auto* wp = static_cast<const __half*>(w->get());
  auto* yp = static_cast<float*>(y->get());
  std::printf("| lm_head %d × %d, rows | cuBLASLt µs | StreamGemm variant 1 | variant 3 | variant 4 | best TB/s |\n"
              "|---:|---:|---:|---:|---:|---:|\n", p.n, p.k);
  for (int rows : rows_list) {
    if (rows < 1 || rows > cuda::kStreamGemmMaxRows) continue;
    absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> gemm = cuda::GemmRunner::Create(s, work->get(), kWork);
    if (!gemm.ok()) return gemm.status();
    absl::StatusOr<double> lt = TunedGemmRunnerUs(**gemm, p, rows, x, [&] { return wp; }, yp, reps, s);
    if (!lt.ok()) return lt.status();
    std::printf("| %d | %.1f |", rows, *lt);
    double best = *lt;
    for (int variant : {1, 3, 4}) {
      absl::StatusOr<double> us = TimeGraph(s, reps, [&]() -> absl::Status {
        return cuda::StreamGemm({.x = x, .rows = rows, .k = p.k, .w = wp, .n = p.n, .partials = yp,
                                 .workspace = counters->get(), .variant = variant},
                                s);
      });
      if (!us.ok()) return us.status();
      best = std::min(best, *us);
      std::printf(" %.1f |", *us);
    }
    std::printf(" %.2f |\n", double(p.n) * p.k * 2 / best * 1e-6);
  }
  return absl::OkStatus();
}

// A layer's four projections back to back at `rows` rows, as one chain per timed launch: cuBLASLt
// as the engine runs it (RunSplitK for q/k/v, o and down, gate/up whole) against StreamGemm
// launched programmatically (each copies its first W while its predecessor finishes; 4 chunks,
// gate/up 2), each projection with its own counters.
absl::Status BenchStreamGemmChain(const Shape& m, int rows, int reps, cudaStream_t s) {
  const std::vector<Projection> projections = Projections(m);
  const auto [max_k, max_n] = MaxKN(projections);
  constexpr size_t kWork = 32 << 20;
  auto x16 = Filled(size_t(cuda::kStreamGemmMaxRows) * max_k * 2, 0x2c);
  auto y = Filled(size_t(8) * cuda::kStreamGemmMaxRows * max_n * 4, 0), work = DeviceAlloc(kWork);
  auto counters = Filled(4 * 64 + cuda::kStreamGemmWorkspaceBytes, 0);
  for (auto* b : {&x16, &y, &work, &counters}) {
    if (!b->ok()) return b->status();
  }
  std::vector<RotatingCopies> weights;
  for (const Projection& p : projections) {
    absl::StatusOr<RotatingCopies> w = WeightCopies(size_t(p.n) * p.k * 2);
    if (!w.ok()) return w.status();
    weights.push_back(*std::move(w));
  }
  const auto* x = static_cast<const __half*>(x16->get());
  auto* yp = static_cast<float*>(y->get());
  std::vector<std::unique_ptr<cuda::GemmRunner>> runners;
  for (size_t i = 0; i < projections.size(); ++i) {  // tuned as the engine tunes: over the copies
    const Projection& p = projections[i];
    absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> g =
        LayerTunedRunner(s, work->get(), kWork, weights[i], p, rows, x, yp, p.swiglu);
    if (!g.ok()) return g.status();
    runners.push_back(*std::move(g));
  }
  absl::StatusOr<double> lt = TimeGraph(s, reps, [&]() -> absl::Status {
    for (size_t i = 0; i < projections.size(); ++i) {
      const Projection& p = projections[i];
      if (absl::Status st = RunLikeEngine(*runners[i], p, rows, x, weights[i].Next(), yp, p.swiglu); !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  });
  if (!lt.ok()) return lt.status();
  std::printf("\n| chain of q/k/v, o, gate/up, down at %d rows | µs a chain |\n|---|---:|\n| cuBLASLt | %.1f |\n", rows,
              *lt);
  for (int variant : {1, 4}) {
    for (bool overlap : {false, true}) {
      absl::StatusOr<double> us = TimeGraph(s, reps, [&]() -> absl::Status {
        for (size_t i = 0; i < projections.size(); ++i) {
          const Projection& p = projections[i];
          const int chunks = p.swiglu ? 2 : 4;
          absl::Status st = cuda::StreamGemm(
              {.x = x, .rows = rows, .k = p.k, .w = weights[i].Next(), .n = p.n, .chunks = chunks, .partials = yp,
               .partial_stride = int64_t(p.n) * rows, .workspace = static_cast<char*>(counters->get()) + 64 * i,
               .overlap_previous = overlap, .variant = variant},
              s);
          if (!st.ok()) return st;
        }
        return absl::OkStatus();
      });
      if (!us.ok()) return us.status();
      std::printf("| StreamGemm variant %d%s | %.1f |\n", variant, overlap ? ", programmatic" : "", *us);
    }
  }
  return absl::OkStatus();
}

// k split into S chunks as one strided-batched cuBLASLt GEMM writing S fp32 partials, which the
// next kernel (the norm after o, RoPE after q/k/v) would sum: cuBLASLt's own split-K pays a
// separate reduce kernel (2.4 µs a layer at 16 rows on o). Times the GEMM alone, best of up to 32
// heuristic candidates each timed in a graph, against GemmRunner's pick (its reduce included).
absl::Status BenchBatchedSplitK(const Shape& m, const std::vector<int>& rows_list, int reps, cudaStream_t s) {
  const std::vector<Projection> projections = Projections(m);
  const int max_rows = *std::max_element(rows_list.begin(), rows_list.end());
  const auto [max_k, max_n] = MaxKN(projections);
  constexpr size_t kWork = 32 << 20;
  constexpr int kMaxSplits = 8;
  auto x16 = Filled(size_t(max_rows) * max_k * 2, 0x2c), y = Filled(size_t(kMaxSplits) * max_rows * max_n * 4, 0);
  auto work = DeviceAlloc(kWork);
  for (auto* b : {&x16, &y, &work}) {
    if (!b->ok()) return b->status();
  }
  absl::StatusOr<CublasLtHandle> lt = MakeCublasLt();
  if (!lt.ok()) return lt.status();
  absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> gemm = cuda::GemmRunner::Create(s, work->get(), kWork);
  if (!gemm.ok()) return gemm.status();
  std::printf("\n| projection | rows | GemmRunner µs | GemmRunner RunSplitK 2 µs (chunks) | RunSplitK 2 tuned over the copies µs | S = 1 | S = 2 | S = 3 | S = 4 | S = 6 | S = 8 | best of 4.26 TB/s |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Projection& p : projections) {
    absl::StatusOr<RotatingCopies> w = WeightCopies(size_t(p.n) * p.k * 2);
    if (!w.ok()) return w.status();
    for (int rows : rows_list) {
      if (rows == 1) continue;
      const auto* x = static_cast<const __half*>(x16->get());
      auto* yp = static_cast<float*>(y->get());
      auto wp = [&] { return w->Next<const __half>(); };
      absl::StatusOr<double> base = TunedGemmRunnerUs(**gemm, p, rows, x, wp, yp, reps, s);
      if (!base.ok()) return base.status();
      // The engine's path above batch 1 (q/k/v, o, down): RunSplitK's two-chunk pick, tuned as the
      // engine tunes it (its first call, one weight matrix, L2-hot), timed over the rotating copies.
      const int64_t stride = int64_t(p.n) * rows;
      (*gemm)->set_tuning(true);
      absl::StatusOr<int> chunks = (*gemm)->RunSplitK(x, rows, p.k, wp(), p.n, 2, yp, stride);
      (*gemm)->set_tuning(false);
      if (!chunks.ok()) return chunks.status();
      absl::StatusOr<double> engine_s2 = TimeGraph(s, reps, [&]() -> absl::Status {
        return (*gemm)->RunSplitK(x, rows, p.k, wp(), p.n, 2, yp, stride).status();
      });
      if (!engine_s2.ok()) return engine_s2.status();
      // The engine's tuning since b38bd08: each candidate timed over the copies in turn.
      absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> layered =
          LayerTunedRunner(s, work->get(), kWork, *w, p, rows, x, yp);
      if (!layered.ok()) return layered.status();
      absl::StatusOr<double> layered_s2 =
          TimeGraph(s, reps, [&]() -> absl::Status { return RunLikeEngine(**layered, p, rows, x, wp(), yp); });
      if (!layered_s2.ok()) return layered_s2.status();
      std::printf("| %s | %d | %.1f | %.1f (%d) | %.1f |", p.name, rows, *base, *engine_s2, *chunks, *layered_s2);
      double best_all = std::min({*base, *engine_s2, *layered_s2});
      for (int S : {1, 2, 3, 4, 6, 8}) {
        const int kc = p.k / S;
        if (p.k % S != 0 || kc % 8 != 0) {
          std::printf(" – |");
          continue;
        }
        cublasLtMatmulDesc_t op = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
        TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
        TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&a, CUDA_R_16F, kc, p.n, p.k));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&b, CUDA_R_16F, kc, rows, p.k));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, p.n, rows, p.n));
        const int32_t count = S;
        const int64_t k_stride = kc, c_stride = int64_t(p.n) * rows;
        for (auto [layout, stride] : {std::pair{a, k_stride}, {b, k_stride}, {c, c_stride}}) {
          TAILSERVE_CUDA_RETURN_IF_ERROR(
              cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
          TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
              layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
        }
        cublasLtMatmulPreference_t pref = nullptr;
        TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
        const uint64_t wb = kWork;
        TAILSERVE_CUDA_RETURN_IF_ERROR(
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wb, sizeof(wb)));
        cublasLtMatmulHeuristicResult_t results[32];
        int found = 0;
        TAILSERVE_CUDA_RETURN_IF_ERROR(
            cublasLtMatmulAlgoGetHeuristic(lt->get(), op, a, b, c, c, pref, 32, results, &found));
        cublasLtMatmulPreferenceDestroy(pref);
        const float alpha = 1.0f, zero = 0.0f;
        double best = 1e30;
        for (int i = 0; i < found; ++i) {
          auto run = [&]() -> absl::Status {
            TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmul(lt->get(), op, &alpha, wp(), a, x, b, &zero, yp, c, yp, c,
                                                          &results[i].algo, work->get(), kWork, s));
            return absl::OkStatus();
          };
          if (!run().ok()) continue;
          absl::StatusOr<double> us = TimeGraph(s, 20, run);
          if (us.ok() && *us < best) best = *us;
        }
        for (auto layout : {a, b, c}) cublasLtMatrixLayoutDestroy(layout);
        cublasLtMatmulDescDestroy(op);
        if (best > 1e29) {
          std::printf(" none |");
          continue;
        }
        best_all = std::min(best_all, best);
        std::printf(" %.1f |", best);
      }
      std::printf(" %.0f%% |\n", 100.0 * 2.0 * p.n * p.k / (best_all * 1e-6) / kCopyBandwidth);
    }
  }
  return absl::OkStatus();
}

// The decode attention block at the shape: cuBLASLt's q/k/v (two k chunks), the 16-warp attention
// (new_kv, RoPE summing the chunks, launched programmatically) and cuBLASLt's o (two k chunks), as
// the engine runs them at 2-16 rows, against AttentionBlock in one launch, and against cuBLASLt's
// q/k/v followed by AttentionBlock doing the attention and o (q/k/v given); weights and KV rotating
// past L2. Then one launch's timeline of each AttentionBlock form: when each CTA's phases end,
// after the earliest CTA's start (median and max over CTAs). With `variants`, the block again with each of
// its knobs (ring stages, early key tiles, wide W boxes) and its q/k/v phase from the timeline.
absl::Status BenchAttentionBlock(const Shape& m, KvDtype dtype, const std::vector<int>& rows_list,
                                 const std::vector<int>& contexts, int reps, bool variants, cudaStream_t s) {
  const int h = m.hidden, hd = m.head_dim, kvh = m.kv_heads, qd = m.heads * hd, qkvw = qd + 2 * kvh * hd;
  absl::StatusOr<RotatingCopies> wqkv = WeightCopies(size_t(qkvw) * h * 2), wo = WeightCopies(size_t(h) * qd * 2);
  if (!wqkv.ok()) return wqkv.status();
  if (!wo.ok()) return wo.status();
  const int max_rows = 16;
  auto xn = Filled(size_t(max_rows) * h * 2, 0x2c), x = Filled(size_t(max_rows) * h * 4, 0);
  auto qkv = Filled(size_t(max_rows) * qkvw * 4, 0), parts = Filled(size_t(2) * max_rows * qkvw * 4, 0);
  auto attn = Filled(size_t(max_rows) * qd * 2, 0), o_parts = Filled(size_t(2) * max_rows * h * 4, 0);
  auto clamps = Filled(8, 0), block_ws = Filled(cuda::kAttentionBlockWorkspaceBytes, 0);
  auto inv = Filled(size_t(hd / 2) * 4, 0x3c), attn_ws = DeviceAlloc(size_t(64) << 20), work = DeviceAlloc(32 << 20);
  int sms = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto timeline = Filled(size_t(sms) * cuda::kAttentionBlockStamps * 8, 0);
  for (auto* b : {&xn, &x, &qkv, &parts, &attn, &o_parts, &clamps, &block_ws, &inv, &attn_ws, &work, &timeline}) {
    if (!b->ok()) return b->status();
  }
  auto gemm = cuda::GemmRunner::Create(s, work->get(), 32 << 20);
  if (!gemm.ok()) return gemm.status();
  const auto* xn16 = static_cast<const __half*>(xn->get());
  auto* attn16 = static_cast<__half*>(attn->get());
  auto* count = static_cast<unsigned long long*>(clamps->get());
  std::printf("\nattention block: %s cache, weights %.1f MB, rotating past L2\n\n", KvDtypeName(dtype),
              (double(qkvw) * h + double(h) * qd) * 2 / 1e6);
  std::printf("| rows | context | cuBLASLt q/k/v µs | q/k/v + attention + o µs | AttentionBlock µs | cuBLASLt q/k/v + "
              "AttentionBlock (attention + o) µs | the same, o_waits_for_keys %s | bytes at 4.26 TB/s µs |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---:|\n", cuda::AttentionBlockArgs{}.o_waits_for_keys ? "off" : "on");
  std::vector<std::string> timelines;
  std::string sweep = "\nAttentionBlock variants (µs, given: with cuBLASLt's q/k/v; stamps: median CTA after the first "
                      "CTA's start, -1: none)\n\n| rows | context | q/k/v | ring stages | early key tiles | wide boxes | "
                      "vector adds | key stages | late o stages | o waits for keys | µs | q/k/v counted | max | keys computed | "
                      "max | attention ends | o products done | end |\n"
                      "|---:|---:|---|---:|---:|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (int rows : rows_list) {
    if (rows < 2 || rows > max_rows) continue;
    for (int context : contexts) {
      absl::StatusOr<AttentionInputs> in = MakeAttentionInputs(m, dtype, rows, context, false);
      if (!in.ok()) return in.status();
      if (absl::Status t = cuda::AttentionBlockTakes(rows, h, m.heads, in->g, 0); !t.ok()) return t;
      const cuda::AttentionShape shape{
          .rows = rows, .heads = m.heads, .q_stride = qkvw, .splits = 1, .scale = 1.0f / std::sqrt(float(hd)),
          .new_kv = true, .overlap_previous = true, .warps = 16,
          .rope = {.inv_freq = static_cast<const float*>(inv->get()),
                   .parts = {static_cast<float*>(parts->get()), 2, int64_t{max_rows} * qkvw}}};
      int qkv_chunks = 0;
      auto qkv_gemm = [&]() -> absl::Status {
        absl::StatusOr<int> c1 = (*gemm)->RunSplitK(xn16, rows, h, wqkv->Next(), qkvw, 2,
                                                    static_cast<float*>(parts->get()), int64_t{max_rows} * qkvw);
        if (!c1.ok()) return c1.status();
        qkv_chunks = *c1;
        return absl::OkStatus();
      };
      auto unfused = [&]() -> absl::Status {
        if (absl::Status e = qkv_gemm(); !e.ok()) return e;
        if (absl::Status e = cuda::PagedAttention(static_cast<const float*>(qkv->get()), shape, in->meta, in->g,
                                                  in->Layer(), static_cast<float*>(attn_ws->get()), attn16, s, count);
            !e.ok()) {
          return e;
        }
        absl::StatusOr<int> c2 = (*gemm)->RunSplitK(attn16, rows, qd, wo->Next(), h, 2,
                                                    static_cast<float*>(o_parts->get()), int64_t{max_rows} * h);
        return c2.ok() ? absl::OkStatus() : c2.status();
      };
      struct Knobs {  // AttentionBlockArgs' defaults unless set
        int stages = cuda::AttentionBlockArgs{}.ring_stages, early = cuda::AttentionBlockArgs{}.early_key_tiles;
        bool wide = cuda::AttentionBlockArgs{}.wide_boxes, vector = cuda::AttentionBlockArgs{}.vector_adds;
        int keys = cuda::AttentionBlockArgs{}.key_stages;
        bool late = cuda::AttentionBlockArgs{}.late_o_stages;
        bool o_waits = cuda::AttentionBlockArgs{}.o_waits_for_keys;
      };
      // given: q/k/v from qkv_gemm's partials, the launch after it programmatic as in the engine.
      auto args = [&](uint64_t* stamps, Knobs k = {}, bool given = false) {
        return cuda::AttentionBlockArgs{
            .xn = xn16, .rows = rows, .hidden = h, .heads = m.heads, .w_qkv = wqkv->Next(), .w_o = wo->Next(),
            .inv_freq = static_cast<const float*>(inv->get()), .scale = 1.0f / std::sqrt(float(hd)),
            .meta = in->meta, .geometry = in->g, .layer = in->Layer(), .qkv = static_cast<float*>(qkv->get()),
            .qkv_parts = given ? cuda::Partials{static_cast<float*>(parts->get()), qkv_chunks, int64_t{max_rows} * qkvw}
                               : cuda::Partials{},
            .attn = attn16, .x = static_cast<float*>(x->get()), .clamps = count, .workspace = block_ws->get(),
            .overlap_previous = given, .timeline = stamps, .ring_stages = k.stages, .early_key_tiles = k.early,
            .wide_boxes = k.wide, .vector_adds = k.vector, .key_stages = k.keys, .late_o_stages = k.late,
            .o_waits_for_keys = k.o_waits};
      };
      // One launch's stamps: [stamp] = {median, max} over CTAs in µs after the first CTA's start.
      const int ctas = std::min(16, sms / kvh) * kvh;
      // tiles (if given): the key tiles' stamps as a table, median and p90 over CTAs and warps.
      auto stamps = [&](Knobs k, bool given = false,
                        std::string* tiles = nullptr) -> absl::StatusOr<std::vector<std::pair<double, double>>> {
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(timeline->get(), 0, size_t(sms) * cuda::kAttentionBlockStamps * 8));
        if (absl::Status e = cuda::AttentionBlock(args(static_cast<uint64_t*>(timeline->get()), k, given), s); !e.ok()) {
          return e;
        }
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
        std::vector<uint64_t> t(size_t(ctas) * cuda::kAttentionBlockStamps);
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(t.data(), timeline->get(), t.size() * 8, cudaMemcpyDeviceToHost));
        uint64_t t0 = ~uint64_t{0};
        for (int b = 0; b < ctas; ++b) t0 = std::min(t0, t[size_t(b) * cuda::kAttentionBlockStamps]);
        std::vector<std::pair<double, double>> out(cuda::kAttentionBlockStamps, {-1.0, -1.0});
        for (int which = 0; which < cuda::kAttentionBlockStamps; ++which) {
          if (which == cuda::kAttentionBlockSmSlot) continue;
          std::vector<double> v;
          for (int b = 0; b < ctas; ++b) {
            const uint64_t x0 = t[size_t(b) * cuda::kAttentionBlockStamps + which];
            if (x0 != 0) v.push_back((double(x0) - double(t0)) / 1e3);
          }
          if (v.empty()) continue;
          std::sort(v.begin(), v.end());
          out[which] = {v[v.size() / 2], v.back()};
        }
        if (tiles != nullptr) {
          auto at = [&](int b, int w, int i, int e) {
            return t[size_t(b) * cuda::kAttentionBlockStamps + cuda::kAttentionBlockCtaStamps +
                     (w * cuda::kAttentionBlockStampedTiles + i) * cuda::kAttentionBlockTileEvents + e];
          };
          auto cell = [](std::vector<double> v) {
            if (v.empty()) return std::string("-");
            std::sort(v.begin(), v.end());
            return absl::StrFormat("%.2f (%.2f)", v[v.size() / 2], v[v.size() * 9 / 10]);
          };
          absl::StrAppend(tiles, "| key tile of a warp | issue begun | issued | landed | computed | block-table load "
                                 "(issued − begun) | in flight (landed − issued) | compute (computed − landed) | "
                                 "compute, SM cycles |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
          constexpr int kTimes = 4;  // the tile's events that are times; the fifth counts cycles
          static_assert(cuda::kAttentionBlockTileEvents == kTimes + 1);
          for (int i = 0; i < cuda::kAttentionBlockStampedTiles; ++i) {
            std::vector<double> ev[kTimes], gap[3], cycles;
            for (int b = 0; b < ctas; ++b) {
              for (int w = 0; w < cuda::kAttentionBlockStampedWarps; ++w) {
                if (at(b, w, i, 3) != 0) cycles.push_back(double(at(b, w, i, kTimes)));
                bool all = true;
                for (int e = 0; e < kTimes; ++e) {
                  if (at(b, w, i, e) == 0) {
                    all = false;
                    continue;
                  }
                  ev[e].push_back((double(at(b, w, i, e)) - double(t0)) / 1e3);
                }
                if (!all) continue;
                for (int e = 0; e < 3; ++e) gap[e].push_back((double(at(b, w, i, e + 1)) - double(at(b, w, i, e))) / 1e3);
              }
            }
            absl::StrAppend(tiles, "| ", i, " | ", cell(ev[0]), " | ", cell(ev[1]), " | ", cell(ev[2]), " | ",
                            cell(ev[3]), " | ", cell(gap[0]), " | ", cell(gap[1]), " | ", cell(gap[2]), " | ",
                            cell(cycles), " |\n");
          }
          // o waits for its group's last CTA: the four whose keys were computed last, the warp that
          // held each (the writer of the new position is warp (pos / 16) % 8) and its tiles.
          const int per_group = ctas / kvh;
          auto us = [&](uint64_t x) {
            return x == 0 ? std::string("-") : absl::StrFormat("%.2f", (double(x) - double(t0)) / 1e3);
          };
          auto cta = [&](int b, int which) { return t[size_t(b) * cuda::kAttentionBlockStamps + which]; };
          std::vector<int> late;
          for (int b = 0; b < ctas; ++b) {
            if (cta(b, 8) != 0) late.push_back(b);
          }
          std::sort(late.begin(), late.end(), [&](int a, int b) { return cta(a, 8) > cta(b, 8); });
          absl::StrAppend(tiles, "\nits slowest CTAs (every warp's keys computed, latest first; µs as above)\n\n"
                                 "| CTA (group.index) | SM | keys computed | warp last done | its tiles landed | its tiles "
                                 "computed | the CTA's median warp done |\n|---|---:|---:|---:|---|---|---:|\n");
          for (size_t j = 0; j < std::min<size_t>(4, late.size()); ++j) {
            const int b = late[j];
            std::vector<uint64_t> done(cuda::kAttentionBlockStampedWarps, 0);  // a warp's last tile computed
            for (int w = 0; w < cuda::kAttentionBlockStampedWarps; ++w) {
              for (int i = 0; i < cuda::kAttentionBlockStampedTiles; ++i) done[w] = std::max(done[w], at(b, w, i, 3));
            }
            const int slow = static_cast<int>(std::max_element(done.begin(), done.end()) - done.begin());
            std::sort(done.begin(), done.end());
            std::string landed, computed;
            for (int i = 0; i < cuda::kAttentionBlockStampedTiles; ++i) {
              absl::StrAppend(&landed, i ? " / " : "", us(at(b, slow, i, 2)));
              absl::StrAppend(&computed, i ? " / " : "", us(at(b, slow, i, 3)));
            }
            absl::StrAppend(tiles, "| ", b / per_group, ".", b % per_group, " | ",
                            int64_t(cta(b, cuda::kAttentionBlockSmSlot)) - 1, " | ", us(cta(b, 8)), " | ", slow, " | ",
                            landed, " | ", computed, " | ", us(done[done.size() / 2]), " |\n");
          }
        }
        return out;
      };
      (*gemm)->set_tuning(true);
      if (absl::Status e = unfused(); !e.ok()) return e;
      (*gemm)->set_tuning(false);
      absl::StatusOr<double> qkv_alone = TimeGraph(s, reps, qkv_gemm);
      if (!qkv_alone.ok()) return qkv_alone.status();
      absl::StatusOr<double> base = TimeGraph(s, reps, unfused);
      if (!base.ok()) return base.status();
      absl::StatusOr<double> fused = TimeGraph(s, reps, [&] { return cuda::AttentionBlock(args(nullptr), s); });
      if (!fused.ok()) return fused.status();
      absl::StatusOr<double> after_qkv = TimeGraph(s, reps, [&]() -> absl::Status {
        if (absl::Status e = qkv_gemm(); !e.ok()) return e;
        return cuda::AttentionBlock(args(nullptr, {}, true), s);
      });
      if (!after_qkv.ok()) return after_qkv.status();
      const Knobs waits{.o_waits = !Knobs{}.o_waits};
      absl::StatusOr<double> after_qkv_waits = TimeGraph(s, reps, [&]() -> absl::Status {
        if (absl::Status e = qkv_gemm(); !e.ok()) return e;
        return cuda::AttentionBlock(args(nullptr, waits, true), s);
      });
      if (!after_qkv_waits.ok()) return after_qkv_waits.status();
      const double bytes = (double(qkvw) * h + double(h) * qd) * 2 + in->kv_bytes;
      std::printf("| %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", rows, context, *qkv_alone, *base, *fused,
                  *after_qkv, *after_qkv_waits, bytes / kCopyBandwidth * 1e6);
      // One launch's timeline of each form (after q/k/v: the launch alone, its partials left by the runs above).
      static const char* kNames[] = {"start", "q/k/v slice counted", "attention starts", "attention ends",
                                     "o starts", "o products done (before the adds into x)", "end",
                                     "RoPE done (q in shared memory)", "every warp's keys computed",
                                     "heads merged and written (before the count)", "SM + 1 (not a time)"};
      static_assert(std::size(kNames) == cuda::kAttentionBlockCtaStamps);
      for (const auto& [given, k] : {std::pair<bool, Knobs>{false, {}}, {true, {}}, {true, waits}}) {
        std::string tiles;
        absl::StatusOr<std::vector<std::pair<double, double>>> t = stamps(k, given, &tiles);
        if (!t.ok()) return t.status();
        std::string table = absl::StrCat("\ntimeline", given ? " (q/k/v given" : "",
                                         given && k.o_waits ? ", o waits for the keys" : "", given ? ")" : "", ", ",
                                         rows, " rows, ", context,
                                         " tokens (µs after the first CTA's start)\n\n",
                                         "| stamp | median | max |\n|---|---:|---:|\n");
        for (int k : {0, 1, 2, 7, 8, 9, 3, 4, 5, 6}) {
          if ((*t)[k].first < 0) continue;
          absl::StrAppend(&table, "| ", kNames[k], " | ", absl::StrFormat("%.2f", (*t)[k].first), " | ",
                          absl::StrFormat("%.2f", (*t)[k].second), " |\n");
        }
        absl::StrAppend(&table, "\nits key tiles (µs after the first CTA's start; median (p90) over CTAs and warps)\n\n",
                        tiles);
        timelines.push_back(table);
      }
      if (!variants) continue;
      // What holds the q/k/v phase: in-flight W (ring stages), the key copies beside it, TMA box
      // count. Given q/k/v (timed with cuBLASLt's q/k/v before it, its stamps alone): how much of
      // W_o to stream during the attention, how many key tiles to copy before the RoPE, and how
      // many to keep in flight (more key stages take the ring stages a shallower W_o ring frees).
      std::vector<std::pair<bool, Knobs>> list;  // (given, knobs)
      for (bool given : {false, true}) {
        for (int stages : {2, 3, 4, 5, 6}) {
          for (int early : {0, 1, 2}) {
            // Stages past 4 are q/k/v's, in the key buffers: none given, or with early key tiles.
            const int most = cuda::AttentionBlockMaxRingStages(hd, early);
            if (stages > (given ? std::min(4, most) : most)) continue;
            for (bool wide : {false, true}) {
              if (!(wide && given)) list.push_back({given, Knobs{.stages = stages, .early = early, .wide = wide}});
            }
            if (!given || stages > 4) continue;
            for (int keys = 2; keys <= cuda::AttentionBlockMaxKeyStages(hd, stages); ++keys) {
              if (keys > 2) list.push_back({given, Knobs{.stages = stages, .early = early, .keys = keys}});
              list.push_back({given, Knobs{.stages = stages, .early = early, .keys = keys, .late = !Knobs{}.late}});
            }
          }
        }
        list.push_back({given, Knobs{.vector = !Knobs{}.vector}});  // o's adds the other way
        if (!given) continue;
        for (int stages : {2, 3, 4}) list.push_back({given, Knobs{.stages = stages, .o_waits = !Knobs{}.o_waits}});
      }
      for (const auto& [given, k] : list) {
        absl::StatusOr<double> us = TimeGraph(s, reps, [&]() -> absl::Status {
          if (given) {
            if (absl::Status e = qkv_gemm(); !e.ok()) return e;
          }
          return cuda::AttentionBlock(args(nullptr, k, given), s);
        });
        if (!us.ok()) return us.status();
        absl::StatusOr<std::vector<std::pair<double, double>>> v = stamps(k, given);
        if (!v.ok()) return v.status();
        absl::StrAppend(&sweep, absl::StrFormat("| %d | %d | %s | %d | %d | %s | %s | %d | %s | %s | %.1f | %.2f | %.2f | "
                                                "%.2f | %.2f | %.2f | %.2f | %.2f |\n",
                                                rows, context, given ? "given" : "block", k.stages, k.early,
                                                k.wide ? "yes" : "no", k.vector ? "yes" : "no", k.keys,
                                                given && k.late ? "yes" : "no", given && k.o_waits ? "yes" : "no", *us,
                                                (*v)[1].first, (*v)[1].second, (*v)[8].first, (*v)[8].second,
                                                (*v)[3].first, (*v)[5].first, (*v)[6].first));
      }
    }
  }
  for (const std::string& table : timelines) std::printf("%s", table.c_str());
  if (variants) std::printf("%s", sweep.c_str());
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
  bool l2_hot = false;
  app.add_flag("--l2-hot", l2_hot, "projections and attention read one weight / KV copy, so it stays in L2 where it fits (50 MB)");
  bool mlp_branches = false;
  app.add_flag("--mlp-branches", mlp_branches, "only: the MLP block on one stream, as two halves on graph branches, and (2-16 rows) as one StreamFfn launch");
  bool qkv_branches = false;
  app.add_flag("--qkv-branches", qkv_branches, "only: q/k/v as one cuBLASLt launch against two column parts on graph branches");
  bool gemv_splits = false;
  app.add_flag("--gemv-splits", gemv_splits, "only: the batch-1 Gemv of each projection at every k split");
  bool ksplit = false, stream_gemm = false, lm_head = false;
  int vocab = 128256;
  app.add_flag("--lm-head", lm_head, "only: the LM head at 1-16 rows, cuBLASLt against StreamGemm");
  app.add_option("--vocab", vocab, "the LM head's rows (--lm-head)");
  app.add_flag("--stream-gemm", stream_gemm, "only: StreamGemm's k-chunk partials against cuBLASLt's RunSplitK, 2-16 rows");
  std::string rings_kb = "0";
  app.add_option("--stream-gemm-rings", rings_kb, "--stream-gemm: ring sizes in KB, 0 the whole shared memory")
      ->capture_default_str();
  app.add_flag("--ksplit", ksplit, "only: each projection as a strided-batched GEMM over k chunks into fp32 partials");
  bool ceilings = false;
  app.add_flag("--ceilings", ceilings,
               "only: this GPU's copy bandwidth and a pure DRAM read of each decode op's bytes");
  bool ring_probe = false;
  app.add_flag("--ring-probe", ring_probe, "only: what StreamFfn's TMA ring streams an SM bare, then with each of its pieces added");
  bool overlap = false;
  app.add_flag("--overlap", overlap,
               "only: the batch-16 attention beside a DRAM read of o's bytes and beside cuBLASLt's o");
  bool attention_block = false, attention_block_variants = false;
  app.add_flag("--attention-block", attention_block,
               "only: q/k/v + attention + o as the engine runs them at 2-16 rows against AttentionBlock, and its timeline");
  app.add_flag("--attention-block-variants", attention_block_variants,
               "--attention-block: also every ring depth × early key tiles × W box shape (× key stages given q/k/v), "
               "with each one's phases");
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
  if (mlp_branches) {
    absl::Status st = BenchMlpBranches(m, Ints(rows), reps);
    if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return st.ok() ? 0 : 1;
  }
  if (qkv_branches) {
    absl::Status st = BenchQkvBranches(m, Ints(rows), reps);
    if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return st.ok() ? 0 : 1;
  }
  if (gemv_splits) {
    absl::Status st = BenchGemvSplits(m, reps, stream->get());
    if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return st.ok() ? 0 : 1;
  }
  if (lm_head) {
    absl::Status st = BenchLmHead(m, vocab, Ints(rows), reps, stream->get());
    if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return st.ok() ? 0 : 1;
  }
  if (stream_gemm) {
    absl::Status st = BenchStreamGemm(m, Ints(rows), Ints(rings_kb), reps, stream->get());
    if (st.ok()) st = BenchStreamGemmChain(m, 16, reps, stream->get());
    if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return st.ok() ? 0 : 1;
  }
  if (ceilings) {
    absl::Status st = BenchCeilings(m, vocab, reps, stream->get());
    if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return st.ok() ? 0 : 1;
  }
  if (ring_probe) {
    absl::Status st = BenchRingProbe(m, reps, stream->get());
    if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return st.ok() ? 0 : 1;
  }
  if (overlap) {
    absl::Status st = BenchOverlap(m, *dtype, reps, stream->get());
    if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return st.ok() ? 0 : 1;
  }
  if (attention_block) {
    absl::Status st = BenchAttentionBlock(m, *dtype, Ints(rows), Ints(contexts), reps, attention_block_variants,
                                          stream->get());
    if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return st.ok() ? 0 : 1;
  }
  if (ksplit) {
    absl::Status st = BenchBatchedSplitK(m, Ints(rows), reps, stream->get());
    if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return st.ok() ? 0 : 1;
  }
  absl::Status st = gemm_search ? SearchGemm(m, Ints(rows), reps, stream->get())
                                : BenchProjections(m, Ints(rows), reps, l2_hot, stream->get());
  if (gemm_search) {
    if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return st.ok() ? 0 : 1;
  }
  if (st.ok()) st = BenchAttention(m, *dtype, Ints(rows), Ints(contexts), reps, l2_hot, stream->get());
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
