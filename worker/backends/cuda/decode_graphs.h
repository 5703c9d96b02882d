#pragma once
// The decode step as one CUDA graph per batch bucket: at load, every cuBLASLt shape of every
// bucket is timed (GemmRunner's tuning, then its best candidates inside the captured step), then
// each bucket's forward is captured once. Also what the benchmarks time and profile a step with.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backends/cuda/forward.h"

namespace tailserve::cuda {

class DecodeGraphs {
 public:
  // `plans`: the decode plan of each bucket (also the buckets captured).
  DecodeGraphs(ForwardPass& forward, Workspaces& buffers, cudaStream_t stream, GemmRunner& gemm,
               GemmRunner& side_gemm, const std::map<int, StepPlan>& plans)
      : forward_(forward), b_(buffers), stream_(stream), gemm_(gemm), side_gemm_(side_gemm), plans_(plans) {}

  // Tunes and captures every bucket. The step inputs must be on the device (padded rows: token 0
  // at position 0 of the trash row). `layer_stride`: ModelWeights::LayerStrideBytes.
  absl::Status CaptureAll(int in_situ_candidates, const void* first_layer, int64_t layer_stride, int layers);

  // The bucket's graph, or null (graphs off, or rows past the largest bucket).
  cudaGraphExec_t Find(int bucket) const;

  // The decode forward of `plan.rows` rows, captured with an event after every op and replayed:
  // milliseconds per op kind, summed over layers, in the order first seen.
  absl::StatusOr<std::vector<std::pair<std::string, double>>> Profile(const StepPlan& plan, size_t events);
  // Milliseconds of device time per replay of the bucket's graph, `reps` back to back; with
  // `from_idle`, the median host time from each launch to its synchronize (the GPU idle before).
  absl::StatusOr<double> ReplayMilliseconds(int bucket, int reps, bool from_idle);

 private:
  // Times each cuBLASLt shape of the bucket's step with its other candidates, in the replayed
  // graph itself, and keeps the fastest (gemm.h says why).
  absl::Status TuneInSitu(int bucket, int candidates);
  // Median ms of `replays` replays of a freshly captured graph of the bucket.
  absl::StatusOr<float> TimeStepGraph(int bucket, int replays);
  absl::StatusOr<CudaGraphExec> Capture(const StepPlan& plan, OpProfile* profile);

  ForwardPass& forward_;
  Workspaces& b_;
  cudaStream_t stream_;
  GemmRunner& gemm_;
  GemmRunner& side_gemm_;
  const std::map<int, StepPlan>& plans_;
  std::map<int, CudaGraphExec> graphs_;
};

}  // namespace tailserve::cuda
