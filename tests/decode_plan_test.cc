// The CUDA backend's decode plan (plan/decode_plan.h): which path each batch bucket takes, checked
// without a GPU on the shapes the benchmarks run (Llama-3.1-8B, Llama-3.2-1B) and the edges.
#include "worker/backends/cuda/plan/decode_plan.h"

#include <gtest/gtest.h>

namespace tailserve {
namespace {

using cuda::DecodeTuning;
using cuda::DeviceLimits;
using cuda::PlanModel;
using cuda::PlanStep;
using cuda::StepPlan;

const PlanModel k8B{.hidden = 4096, .ffn = 14336, .heads = 32, .kv_heads = 8, .head_dim = 128};
const PlanModel k1B{.hidden = 2048, .ffn = 8192, .heads = 32, .kv_heads = 8, .head_dim = 64};
// An H100 or H200: 132 SMs, 4 of the 8B's tensor-core attention CTAs an SM; AttentionBlock up to 16 rows.
const DeviceLimits kHopper{.sm_count = 132, .attention_wave = 528, .attention_block_max_rows = 16};
constexpr int kMaxBucket = 128;

StepPlan Decode(int rows, const PlanModel& m = k8B, const DecodeTuning& t = {}) {
  return PlanStep(rows, /*decode=*/true, m, kHopper, t, kMaxBucket);
}

TEST(DecodePlanTest, BatchOneRunsTheFusedGemvsWithClusterMergedSplits) {
  const StepPlan p = Decode(1);
  EXPECT_TRUE(p.fused_gemv);
  EXPECT_TRUE(p.new_kv);
  EXPECT_FALSE(p.split_k);
  EXPECT_FALSE(p.attention_block);
  EXPECT_EQ(p.stream_qkv_chunks, 0);
  EXPECT_EQ(p.stream_ffn_chunks, 0);
  EXPECT_FALSE(p.ffn_halves);
  // The cost model's pick at one row: 16 splits on the 8B, 11 on the 1B, merged in a cluster.
  EXPECT_EQ(p.attention_splits, 16);
  EXPECT_TRUE(p.cluster_merge);
  EXPECT_EQ(Decode(1, k1B).attention_splits, 11);
  EXPECT_TRUE(p.overlap_previous);
}

TEST(DecodePlanTest, SixteenRowsOfThe8BStreamTheirProjections) {
  const StepPlan p = Decode(16);
  EXPECT_FALSE(p.fused_gemv);
  EXPECT_TRUE(p.split_k);
  EXPECT_TRUE(p.new_kv);
  EXPECT_TRUE(p.attention_block);
  EXPECT_EQ(p.stream_qkv_chunks, 4);
  EXPECT_EQ(p.stream_qkv_variant, 4);  // 4 k boxes a stage: 4096 = 4 chunks · 4 · 256
  EXPECT_EQ(p.stream_ffn_chunks, 4);
  EXPECT_EQ(p.stream_ffn_last_chunk, 2560);  // 14336 = 6656 + 3 · 2560
  EXPECT_FALSE(p.ffn_halves);
  EXPECT_TRUE(p.norm_triggers_qkv_early());
  EXPECT_TRUE(p.norm_triggers_ffn_early());
  EXPECT_EQ(p.Describe(k8B),
            "decode 16 rows: embed | each layer: rmsnorm (early trigger) > stream_gemm q/k/v (4 k chunks, variant 4) "
            "> attention_block (attention + o, writes new K/V) > rmsnorm (early trigger) > stream_ffn (4 down "
            "chunks, the last 3 of 2560 features) | rmsnorm > cublaslt lm_head > sample; programmatic launches");
  EXPECT_EQ(Decode(1).Describe(k8B),
            "decode 1 row: embed | each layer: gemv q/k/v (+norm, rope) > paged_attention (16 splits, 4 warps, "
            "cluster merge, writes new K/V) > gemv o > gemv gate/up (+norm, swiglu) > gemv down | gemv lm_head "
            "(+norm) > sample; programmatic launches");
}

TEST(DecodePlanTest, EachBucketOfThe8BTakesItsRange) {
  struct Want {
    int rows;
    bool stream, block, halves;
  };
  for (const Want& w : {Want{2, false, false, true}, Want{3, true, false, false}, Want{4, true, true, false},
                        Want{8, true, true, false}, Want{16, true, true, false}, Want{32, false, false, true},
                        Want{64, false, false, true}, Want{128, false, false, true}}) {
    const StepPlan p = Decode(w.rows);
    EXPECT_TRUE(p.split_k) << w.rows;
    EXPECT_EQ(p.stream_ffn_chunks > 0, w.stream) << w.rows;
    EXPECT_EQ(p.stream_qkv_chunks > 0, w.stream) << w.rows;
    EXPECT_EQ(p.attention_block, w.block) << w.rows;
    EXPECT_EQ(p.ffn_halves, w.halves) << w.rows;
    EXPECT_FALSE(p.cluster_merge && p.attention_warps != 4) << w.rows;
  }
}

TEST(DecodePlanTest, TheSmaller1BFfnRunsOnOneStreamAboveSixteenRows) {
  const StepPlan p16 = Decode(16, k1B);
  EXPECT_EQ(p16.stream_ffn_chunks, 4);
  EXPECT_EQ(p16.stream_ffn_last_chunk, 1280);  // 8192 · 5 / 28 rounded down to 256
  const StepPlan p64 = Decode(64, k1B);
  EXPECT_FALSE(p64.ffn_halves);  // 100 MB of FFN weights, under the 200 MB floor
  DecodeTuning always{.ffn_halves_min_bytes = 0};
  EXPECT_TRUE(Decode(64, k1B, always).ffn_halves);
}

TEST(DecodePlanTest, TuningTurnsTheStreamedAndBlockPathsOff) {
  const StepPlan p = Decode(16, k8B, {.stream_qkv_chunks = 0, .stream_ffn_chunks = 0, .attention_block = false});
  EXPECT_EQ(p.stream_qkv_chunks, 0);
  EXPECT_EQ(p.stream_ffn_chunks, 0);
  EXPECT_FALSE(p.attention_block);
  EXPECT_TRUE(p.ffn_halves);
  EXPECT_FALSE(p.norm_triggers_qkv_early());
  // 2 chunks where 4 were asked for but the hidden size does not split that way.
  const PlanModel odd{.hidden = 384, .ffn = 1024, .heads = 6, .kv_heads = 2, .head_dim = 64};
  const StepPlan q = Decode(8, odd);
  EXPECT_EQ(q.stream_qkv_chunks, 2);
  EXPECT_EQ(q.stream_qkv_variant, 0);  // one k box a stage: 384 = 2 chunks · 3 · 64
  EXPECT_EQ(q.stream_ffn_chunks, 4);
  EXPECT_EQ(q.stream_ffn_last_chunk, 0);  // 1024 · 5 / 28 rounds down to 0: equal chunks
}

TEST(DecodePlanTest, MoeAndFp16CachesKeepTheirOwnPaths) {
  PlanModel moe = k8B;
  moe.experts = 8;
  const StepPlan m1 = Decode(1, moe);
  EXPECT_FALSE(m1.fused_gemv);  // the batch-1 Gemvs are dense only
  EXPECT_TRUE(m1.split_k);
  const StepPlan m16 = Decode(16, moe);
  EXPECT_EQ(m16.stream_ffn_chunks, 0);
  EXPECT_FALSE(m16.ffn_halves);
  EXPECT_NE(m16.Describe(moe).find("moe (router, then each of 8 experts"), std::string::npos) << m16.Describe(moe);
  PlanModel fp16 = k8B;
  fp16.kv_dtype = KvDtype::kFp16;
  const StepPlan f = Decode(16, fp16);
  EXPECT_FALSE(f.new_kv);
  EXPECT_FALSE(f.attention_block);
  EXPECT_NE(f.Describe(fp16).find("rope_kv_write"), std::string::npos);
}

TEST(DecodePlanTest, PrefillAndProfilingTakeThePlainPath) {
  const StepPlan pre = PlanStep(512, /*decode=*/false, k8B, kHopper, {}, kMaxBucket);
  EXPECT_FALSE(pre.split_k);
  EXPECT_FALSE(pre.new_kv);
  EXPECT_FALSE(pre.attention_block);
  EXPECT_FALSE(pre.ffn_halves);
  EXPECT_EQ(pre.stream_ffn_chunks, 0);
  EXPECT_EQ(pre.attention_warps, 4);
  EXPECT_NE(pre.Describe(k8B).find("prefill 512 rows"), std::string::npos);
  const StepPlan prof = PlanStep(64, /*decode=*/true, k8B, kHopper, {}, kMaxBucket, /*profiling=*/true);
  EXPECT_FALSE(prof.overlap_previous);
  EXPECT_FALSE(prof.ffn_halves);  // one stream: an event after every op
  // Past the largest bucket (an eager decode of more rows) there are no split-K workspaces.
  EXPECT_FALSE(PlanStep(256, true, k8B, kHopper, {}, kMaxBucket).split_k);
}

TEST(DecodePlanTest, AttentionSplitsFillOneWaveAndNoMore) {
  // 64 rows of the 8B: 512 CTAs with one split already more than a wave; the combine is not worth it.
  EXPECT_EQ(cuda::AttentionSplitsFor(64, k8B, kHopper, 32), 1);
  // A cap of 1 is obeyed.
  EXPECT_EQ(cuda::AttentionSplitsFor(1, k8B, kHopper, 1), 1);
  // 16 rows of the 8B: 4 splits, run as the warps of one CTA instead of a combine.
  const StepPlan p = Decode(16);
  EXPECT_EQ(p.attention_splits * p.attention_warps, 16);
  EXPECT_EQ(cuda::AttentionRowTiles(33, 32, 8, /*runs=*/true, /*tensor_cores=*/true), 9);  // 4 rows a tile
  EXPECT_EQ(cuda::AttentionRowTiles(33, 32, 8, /*runs=*/false, /*tensor_cores=*/true), 33);
}

TEST(DecodePlanTest, TuningOutOfRangeIsRefusedNamingTheField) {
  EXPECT_TRUE(cuda::ValidateDecodeTuning({}).ok());
  struct Bad {
    DecodeTuning tuning;
    const char* field;
  };
  for (const Bad& bad : {Bad{{.attention_splits = 0}, "attention_splits"},
                         Bad{{.ffn_halves_min_bytes = -1}, "ffn_halves_min_bytes"},
                         Bad{{.stream_min_rows = 1}, "stream_min_rows"},
                         Bad{{.stream_qkv_chunks = -1}, "stream_qkv_chunks"},
                         Bad{{.stream_ffn_chunks = -1}, "stream_ffn_chunks"},
                         Bad{{.attention_block_min_rows = 0}, "attention_block_min_rows"},
                         Bad{{.in_situ_candidates = 0}, "in_situ_candidates"}}) {
    const absl::Status s = cuda::ValidateDecodeTuning(bad.tuning);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.field;
    EXPECT_NE(s.message().find(bad.field), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace tailserve
