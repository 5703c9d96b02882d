#pragma once
// One forward of the model over the token rows whose inputs are in the workspaces: kernel launches
// only, in the order the step's plan (plan/decode_plan.h) says. Eager (prefill chunks, tuning) or
// inside a graph capture (decode buckets); it never allocates or synchronises.
#include <vector>

#include "absl/status/status.h"
#include "common/model/model_config.h"
#include "worker/backends/cuda/cuda_resources.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/plan/decode_plan.h"
#include "worker/backends/cuda/weights.h"
#include "worker/backends/cuda/workspaces.h"

namespace tailserve::cuda {

// The decode step's streams and the events that fork and join its branches: the FFN halves' second
// half, and the clamp count's copy beside the LM head.
struct StepStreams {
  CudaStream main, side;
  CudaEvent fork, join, ffn_fork, ffn_join;
  static absl::StatusOr<StepStreams> Create();
};

// ProfileDecode's capture: an event recorded after every op, named after it.
struct OpProfile {
  std::vector<CudaEvent> events;
  std::vector<const char*> names;
};

class ForwardPass {
 public:
  ForwardPass(const ModelConfig& config, const KvGeometry& kv, const ModelWeights& weights, const KvPool& pool,
              Workspaces& buffers, StepStreams& streams, GemmRunner& gemm, GemmRunner& side_gemm)
      : c_(config), kv_(kv), w_(weights), pool_(pool), b_(buffers), streams_(streams), gemm_(gemm),
        side_gemm_(side_gemm) {}

  // The layers over plan.rows rows; with `logit_rows` > 0 also the final norm and the LM head of
  // that many rows (logit_src), sampled when the plan decodes. `io`: a decode graph's mapped
  // outputs (the sampled ids and clamp count go there); `profile`: an event after every op.
  absl::Status Run(const StepPlan& plan, int logit_rows, const GraphIo* io = nullptr, OpProfile* profile = nullptr);

 private:
  const ModelConfig& c_;
  const KvGeometry& kv_;
  const ModelWeights& w_;
  const KvPool& pool_;
  Workspaces& b_;
  StepStreams& streams_;
  GemmRunner& gemm_;
  GemmRunner& side_gemm_;
};

}  // namespace tailserve::cuda
