#include "worker/backends/cuda/decode_graphs.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/copy.h"

namespace tailserve::cuda {

absl::Status DecodeGraphs::CaptureAll(int in_situ_candidates, const void* first_layer, int64_t layer_stride,
                                      int layers) {
  const int max_bucket = plans_.empty() ? 0 : plans_.rbegin()->first;
  // Eager runs first, outside any capture: cuBLASLt's algorithm for every bucket's shapes is
  // timed (gemm.h) and modules load. The trash row's KV slots absorb what they write; the clamp
  // count they may raise (tuning repeats residual adds) is reset.
  gemm_.set_tuning(true);
  side_gemm_.set_tuning(true);
  if (layer_stride > 0) {
    for (GemmRunner* g : {&gemm_, &side_gemm_}) g->set_tuning_layers(first_layer, layer_stride, layers);
  }
  for (const auto& [bucket, plan] : plans_) {
    if (bucket == 1 && max_bucket > 1) continue;  // no cuBLASLt shapes to time
    TAILSERVE_RETURN_IF_ERROR(forward_.Run(plan, bucket));
  }
  gemm_.set_tuning(false);
  side_gemm_.set_tuning(false);
  if (in_situ_candidates > 1) {
    for (const auto& [bucket, plan] : plans_) {
      if (bucket == 1 && max_bucket > 1) continue;
      TAILSERVE_RETURN_IF_ERROR(TuneInSitu(bucket, in_situ_candidates));
    }
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(b_.clamps, 0, sizeof(unsigned long long)));
  for (const auto& [bucket, plan] : plans_) {
    TAILSERVE_ASSIGN_OR_RETURN(graphs_[bucket], Capture(plan, nullptr));
  }
  return absl::OkStatus();
}

cudaGraphExec_t DecodeGraphs::Find(int bucket) const {
  auto it = graphs_.find(bucket);
  return it == graphs_.end() ? nullptr : it->second.get();
}

absl::StatusOr<float> DecodeGraphs::TimeStepGraph(int bucket, int replays) {
  TAILSERVE_ASSIGN_OR_RETURN(CudaGraphExec graph, Capture(plans_.at(bucket), nullptr));
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent start, MakeEvent());
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent stop, MakeEvent());
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph.get(), stream_));  // upload and warm-up
  std::vector<float> ms(replays);
  for (float& t : ms) {
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), stream_));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph.get(), stream_));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), stream_));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop.get()));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t, start.get(), stop.get()));
  }
  std::nth_element(ms.begin(), ms.begin() + replays / 2, ms.end());
  return ms[replays / 2];
}

absl::Status DecodeGraphs::TuneInSitu(int bucket, int candidates) {
  // Coordinate descent, one shape at a time over its candidates with the others fixed. Few
  // candidates: each costs a capture and a few replays (8B, 6 candidates: +8 to +15 s of load).
  // Measured on the H200 (8B, 512 tokens, two rounds against the picks timed alone): batch 16
  // 4.659 / 4.659 → 4.604 / 4.615 ms, batch 64 5.366 / 5.378 → 5.349 / 5.371. The FFN halves are
  // where it moves: a gate/up timed alone may fill every SM, so the other half waits for its CTAs
  // to leave. Trying each candidate in both halves at once did not help.
  constexpr int kReplays = 5;
  for (GemmRunner* g : {&gemm_, &side_gemm_}) {
    for (GemmRunner::Plan* shape : g->PlannedShapes(bucket)) {
      TAILSERVE_ASSIGN_OR_RETURN(const int n, g->PrepareCandidates(shape, candidates));
      // Candidate 0 is the shape's current algorithm: the step as it stands.
      int best = 0;
      TAILSERVE_ASSIGN_OR_RETURN(float best_ms, TimeStepGraph(bucket, kReplays));
      for (int i = 1; i < n; ++i) {
        TAILSERVE_RETURN_IF_ERROR(g->UseCandidate(shape, i));
        absl::StatusOr<float> ms = TimeStepGraph(bucket, kReplays);
        if (!ms.ok()) {  // a candidate that cannot run inside a graph: skip it
          (void)cudaGetLastError();
          continue;
        }
        if (*ms < best_ms) best = i, best_ms = *ms;
      }
      TAILSERVE_RETURN_IF_ERROR(g->UseCandidate(shape, best));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CudaGraphExec> DecodeGraphs::Capture(const StepPlan& plan, OpProfile* profile) {
  cudaGraph_t graph;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  // The step's inputs and outputs travel inside the graph through the host mirrors' mapped
  // addresses: a kernel copies the inputs in, the sampler writes the sampled ids there directly,
  // a side branch copies the clamp count. No copies for the host to enqueue around each replay
  // (the block table's changed rows still go before it), and no copy-engine nodes in the graph
  // (~10 us each).
  absl::Status st = CopyBytes(b_.mapped_inputs, b_.inputs, b_.inputs_bytes, stream_);
  if (profile && st.ok()) {
    // External records become graph nodes whose timestamps can be read after the replay.
    const cudaError_t e = cudaEventRecordWithFlags(profile->events[0].get(), stream_, cudaEventRecordExternal);
    if (e != cudaSuccess) st = absl::InternalError(absl::StrCat("cudaEventRecordWithFlags: ", cudaGetErrorString(e)));
    profile->names.push_back("start");
  }
  if (st.ok()) st = forward_.Run(plan, plan.rows, &b_.graph_io, profile);
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);  // always, so the stream leaves capture mode
  CudaGraph owned(end == cudaSuccess ? graph : nullptr);
  TAILSERVE_RETURN_IF_ERROR(st);
  TAILSERVE_CUDA_RETURN_IF_ERROR(end);
  cudaGraphExec_t exec;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
  return CudaGraphExec(exec);
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> DecodeGraphs::Profile(const StepPlan& plan, size_t events) {
  OpProfile profile;
  for (size_t i = 0; i < events; ++i) {
    TAILSERVE_ASSIGN_OR_RETURN(CudaEvent e, MakeEvent());
    profile.events.push_back(std::move(e));
  }
  TAILSERVE_ASSIGN_OR_RETURN(CudaGraphExec graph, Capture(plan, &profile));
  for (int rep = 0; rep < 2; ++rep)
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph.get(), stream_));  // the second is timed
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 1; i < profile.names.size(); ++i) {
    float ms = 0;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, profile.events[i - 1].get(), profile.events[i].get()));
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == profile.names[i]; });
    if (it == out.end()) {
      out.emplace_back(profile.names[i], ms);
    } else {
      it->second += ms;
    }
  }
  return out;
}

absl::StatusOr<double> DecodeGraphs::ReplayMilliseconds(int bucket, int reps, bool from_idle) {
  cudaGraphExec_t graph = Find(bucket);
  if (graph == nullptr || reps < 1) return absl::InvalidArgumentError("ReplayMilliseconds: no graph for these rows");
  if (from_idle) {
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph, stream_));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
    return ms[reps / 2];
  }
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent start, MakeEvent());
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent stop, MakeEvent());
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), stream_));
  for (int i = 0; i < reps; ++i) TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph, stream_));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), stream_));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop.get()));
  float ms = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return static_cast<double>(ms) / reps;
}

}  // namespace tailserve::cuda
