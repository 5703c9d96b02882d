#include "bench/kernels/common.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/plan/decode_plan.h"

namespace tailserve::bench {

absl::StatusOr<DeviceMemory> Filled(size_t bytes, int byte) {
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory m, DeviceAlloc(bytes));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(m.get(), byte, bytes));
  return m;
}

absl::StatusOr<int> SmCount() {
  int sms = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return sms;
}

absl::StatusOr<RotatingCopies> RotatingCopies::Make(size_t bytes, int count, int fill) {
  RotatingCopies r;
  r.stride_ = (bytes + 255) / 256 * 256, r.count_ = count;
  TAILSERVE_ASSIGN_OR_RETURN(r.memory_, Filled(r.stride_ * size_t(count), fill));
  return r;
}

absl::StatusOr<RotatingCopies> WeightCopies(size_t w_bytes, bool l2_hot) {
  return RotatingCopies::Make(w_bytes, RotatingCopies::PastL2(w_bytes, l2_hot));
}

absl::StatusOr<double> TimeGraph(cudaStream_t s, int reps, const std::function<absl::Status()>& launch,
                                 unsigned long long instantiate_flags) {
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  absl::Status st;
  for (int i = 0; i < reps && st.ok(); ++i) st = launch();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);  // ends the capture even after an error
  CudaGraph owned(graph);
  TAILSERVE_RETURN_IF_ERROR(st);
  TAILSERVE_CUDA_RETURN_IF_ERROR(ended);
  cudaGraphExec_t exec = nullptr;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, instantiate_flags));
  CudaGraphExec owned_exec(exec);
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent start, MakeEvent());
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent stop, MakeEvent());
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop.get()));
  float ms = 0.0f;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return 1e3 * ms / reps;
}

std::vector<Projection> Projections(const Shape& m) {
  const int qd = m.heads * m.head_dim, kvd = m.kv_heads * m.head_dim;
  return {{"qkv", qd + 2 * kvd, m.hidden, true, false, false},
          {"o", m.hidden, qd, false, true, false},
          {"gate_up", 2 * m.ffn, m.hidden, true, false, true},
          {"down", m.hidden, m.ffn, false, true, false}};
}

std::pair<int, int> MaxKN(const std::vector<Projection>& projections) {
  int max_k = 0, max_n = 0;
  for (const Projection& p : projections) max_k = std::max(max_k, p.k), max_n = std::max(max_n, p.n);
  return {max_k, max_n};
}

absl::Status RunLikeEngine(cuda::GemmRunner& gemm, const Projection& p, int rows, const __half* x, const __half* w,
                           float* y, bool whole) {
  return whole ? gemm.Run(x, rows, p.k, w, p.n, 0.0f, y)
               : gemm.RunSplitK(x, rows, p.k, w, p.n, cuda::kDecodeKSplits, y, int64_t(p.n) * rows).status();
}

absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> LayerTunedRunner(cudaStream_t s, void* work, size_t work_bytes,
                                                                   const RotatingCopies& w, const Projection& p,
                                                                   int rows, const __half* x, float* y, bool whole) {
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cuda::GemmRunner> gemm, cuda::GemmRunner::Create(s, work, work_bytes));
  gemm->set_tuning_layers(w.first(), int64_t(w.stride()), w.count());
  gemm->set_tuning(true);
  const absl::Status st = RunLikeEngine(*gemm, p, rows, x, static_cast<const __half*>(w.first()), y, whole);
  gemm->set_tuning(false);
  TAILSERVE_RETURN_IF_ERROR(st);
  return gemm;
}

absl::StatusOr<double> TunedGemmRunnerUs(cuda::GemmRunner& gemm, const Projection& p, int rows, const __half* x,
                                         const std::function<const __half*()>& weights, float* y, int reps,
                                         cudaStream_t s) {
  const float beta = p.residual ? 1.0f : 0.0f;
  gemm.set_tuning(true);
  TAILSERVE_RETURN_IF_ERROR(gemm.Run(x, rows, p.k, weights(), p.n, beta, y));
  gemm.set_tuning(false);
  return TimeGraph(s, reps, [&] { return gemm.Run(x, rows, p.k, weights(), p.n, beta, y); });
}

absl::StatusOr<AttentionInputs> MakeAttentionInputs(const Shape& m, KvDtype dtype, int rows, int context,
                                                    bool l2_hot) {
  const int block = 16, hd = m.head_dim, kvh = m.kv_heads;
  const int per_seq = (context + block) / block, blocks = rows * per_seq + 1;
  const size_t entries = size_t(blocks) * block * kvh;
  const double elem = KvElementBytes(dtype), scale = dtype == KvDtype::kFp16 ? 0 : 4;
  const int copies = RotatingCopies::PastL2(entries * (hd * size_t(elem) + 4) * 2, l2_hot);
  TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies k, RotatingCopies::Make(entries * hd * size_t(elem), copies, 0x38));
  TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies v, RotatingCopies::Make(entries * hd * size_t(elem), copies, 0x38));
  TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies ks, RotatingCopies::Make(entries * 4, copies));
  TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies vs, RotatingCopies::Make(entries * 4, copies));
  const int q_stride = (m.heads + 2 * kvh) * hd;
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory q, Filled(size_t(rows) * q_stride * 4, 0x3c));
  // Sequence r's blocks follow one another from block 1 on; every row at position `context`.
  std::vector<int32_t> table(size_t(rows) * per_seq), seq(rows), pos(rows, context);
  for (size_t i = 0; i < table.size(); ++i) table[i] = 1 + int32_t(i);
  for (int r = 0; r < rows; ++r) seq[r] = r;
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory dtable, DeviceAlloc(table.size() * 4));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory dseq, DeviceAlloc(rows * 4));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory dpos, DeviceAlloc(rows * 4));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory out, DeviceAlloc(size_t(rows) * m.heads * hd * 2));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dtable.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dseq.get(), seq.data(), rows * 4, cudaMemcpyHostToDevice));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dpos.get(), pos.data(), rows * 4, cudaMemcpyHostToDevice));
  AttentionInputs in{std::move(k),    std::move(v),    std::move(ks),    std::move(vs),
                     std::move(q),    std::move(dtable), std::move(dseq), std::move(dpos),
                     std::move(out),  KvGeometry{block, kvh, hd, per_seq, dtype}, RowMeta{}};
  in.meta = RowMeta{static_cast<const int32_t*>(in.seq.get()), static_cast<const int32_t*>(in.pos.get()),
                    static_cast<const int32_t*>(in.table.get())};
  in.q_stride = q_stride;
  in.kv_bytes = double(rows) * (context + 1) * kvh * (hd * elem + scale) * 2;
  return in;
}

}  // namespace tailserve::bench
