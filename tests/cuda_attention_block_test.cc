// The decode attention block (AttentionBlock: the attention and o in one launch, after the q/k/v
// projection) against its parts: PagedAttention with new_kv and RoPE, and o on the CPU. A CudaKvTest
// case (the fixture and its instances: cuda_test_util.h, cuda_attention_test.cc). Without a CUDA
// device, or on a shape the block does not take, the test skips.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/cuda_test_util.h"
#include "tests/gpu_test_util.h"
#include "worker/backends/cuda/kernels/attention.h"
#include "worker/backends/cuda/kernels/attention_block.h"
#include "worker/backends/cuda/kernels/partials.h"

namespace tailserve {
namespace {

using namespace testing;

// The projection `q` ([rows, width]) as `count` arrays `q.size()` floats apart that sum to it, as
// a split-K GEMM leaves them (one: q itself): random shares, the last array the remainder.
std::vector<float> SplitIntoPartials(const std::vector<float>& q, int count, std::mt19937& rng) {
  std::vector<float> parts(q.size() * count);
  std::uniform_real_distribution<float> share(-0.5f, 1.5f);
  for (size_t i = 0; i < q.size(); ++i) {
    float rest = q[i];
    for (int c = 0; c + 1 < count; ++c) {
      const float part = q[i] * share(rng) / float(count - 1);
      parts[c * q.size() + i] = part, rest -= part;
    }
    parts[(count - 1) * q.size() + i] = rest;
  }
  return parts;
}

// The attention block in one launch against its parts: q/k/v given as 1, 2 and 4 split-K partials
// (cuBLASLt's RunSplitK leaves 2, StreamGemm 4) of a CPU projection, PagedAttention with new_kv and
// RoPE over the same partials' sum, and o on the CPU added into x. At 5 and 16 rows (lengths across
// block boundaries), every launch on one workspace (each sees the counters the one before left).
TEST_P(CudaKvTest, AttentionBlockMatchesItsParts) {
  REQUIRE_GPU();
  const KvCase kc = GetParam();
  // hidden 1792 = 7 · 256: an odd count of o's 16-column W tiles a CTA (7 at 16 CTAs a group).
  const int kv_heads = 2, heads = kc.group * kv_heads, hd = kc.head_dim, hidden = 1792;
  const int width = (heads + 2 * kv_heads) * hd, qd = heads * hd;
  {
    const KvGeometry g{16, kv_heads, hd, 13, kc.dtype};
    if (absl::Status takes = cuda::AttentionBlockTakes(5, hidden, heads, g, 0); !takes.ok()) {
      GTEST_SKIP() << takes.message();
    }
  }
  const unsigned seed = 577 + kc.head_dim + kc.group;
  std::mt19937 rng(seed);
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(500000.0f, 2.0f * i / hd);
  auto wqkv = Random(size_t(width) * hidden, rng, 1.0f / std::sqrt(float(hidden)));
  auto wo = Random(size_t(hidden) * qd, rng, 1.0f / std::sqrt(float(qd)));
  const auto bias = Random(size_t(width), rng, 0.5f);
  RoundToHalf(wqkv);  // the projection from fp16 inputs, as the GEMM before the block computes it
  const auto wo_h = RoundToHalf(wo);
  Dev<__half> dwo(wo_h);
  Dev<float> dbias(bias), dinv(inv);
  Dev<unsigned long long> clamps(1);
  CUDA_OK(cudaMemset(clamps.p, 0, 8));
  Dev<char> workspace(cuda::kAttentionBlockWorkspaceBytes);
  CUDA_OK(cudaMemset(workspace.p, 0, workspace.n));
  for (int seqs : {5, 16}) {
    // Row 1's 650 tokens: six rounds of the 8 warps' 16-key tiles. Row 2's new key (position 379)
    // falls in warp 7's third tile. Row 4's (position 512, the benchmarks' case) opens warp 0's
    // fifth tile, one more than any other warp's; row 5's 545 (35 tiles) give warps 0-2 a fifth;
    // row 0's is its only key.
    std::vector<int> lens(seqs);
    for (int i = 0; i < seqs; ++i) {
      lens[i] = i == 1   ? 650
                : i == 2 ? 380
                : i == 4 ? 513
                : i == 5 ? 545
                         : 1 + (i * 37 + (i == 3 ? 100 : 0)) % 200;
    }
    PagedFixture f(seqs, 650, kv_heads, hd, kc.dtype);
    std::vector<int32_t> row_seq, row_pos;
    for (int sq = 0; sq < seqs; ++sq) {
      for (int p = 0; p + 1 < lens[sq]; ++p) row_seq.push_back(sq), row_pos.push_back(p);
    }
    Dev<int32_t> dtable(f.table);
    if (!row_seq.empty()) CacheRows(f, dtable.p, Random(row_seq.size() * width, rng, 2.0f), row_seq, row_pos, heads, inv, clamps.p);
    std::vector<int32_t> last_seq(seqs), last_pos(seqs), slots(seqs);
    for (int sq = 0; sq < seqs; ++sq) {
      last_seq[sq] = sq, last_pos[sq] = lens[sq] - 1;
      slots[sq] = f.table[size_t(sq) * f.g.max_blocks_per_seq + last_pos[sq] / 16] * 16 + last_pos[sq] % 16;
    }
    Dev<int32_t> dseq(last_seq), dpos(last_pos);
    const RowMeta meta{dseq.p, dpos.p, dtable.p};
    auto xn = Random(size_t(seqs) * hidden, rng);
    RoundToHalf(xn);
    const auto x0 = Random(size_t(seqs) * hidden, rng);
    auto slot_values = [&]() { return SlotValues(f, slots); };
    // The parts.
    const std::vector<float> q = XWt(xn, wqkv.data(), seqs, hidden, width, hidden);
    const int64_t stride = int64_t(q.size());
    Dev<float> dq(q);
    cuda::AttentionShape shape{.rows = seqs, .heads = heads, .q_stride = width, .scale = 1.0f / std::sqrt(float(hd)),
                               .new_kv = true, .warps = 8, .rope = {.inv_freq = dinv.p, .bias = dbias.p}};
    Dev<float> attn_ws(cuda::AttentionWorkspaceFloats(shape, hd));
    Dev<__half> want_attn(size_t(seqs) * qd);
    PoisonSlots(f, slots);
    ASSERT_TRUE(cuda::PagedAttention(dq.p, shape, meta, f.g, f.view(), attn_ws.p, want_attn.p, nullptr, clamps.p).ok());
    const auto want_kv = slot_values();
    const auto want_a = ToFloats(want_attn.Get());
    auto want_x = XWt(want_a, wo.data(), seqs, qd, hidden, qd);
    for (size_t i = 0; i < want_x.size(); ++i) want_x[i] += x0[i];
    // The block as the engine runs it after cuBLASLt's q/k/v (2 partials, twice), then after
    // StreamGemm's (4), then with the projection whole (1).
    Dev<float> one(SplitIntoPartials(q, 1, rng)), two(SplitIntoPartials(q, 2, rng)), four(SplitIntoPartials(q, 4, rng));
    const Dev<float>* by_count[] = {nullptr, &one, &two, nullptr, &four};
    for (int count : {2, 2, 4, 1}) {
      const cuda::Partials parts{by_count[count]->p, count, stride};
      Dev<float> dx(x0);
      Dev<__half> got_attn(size_t(seqs) * qd);
      PoisonSlots(f, slots);
      const absl::Status ran = cuda::AttentionBlock(
          {.rows = seqs, .hidden = hidden, .heads = heads, .bias = dbias.p, .w_o = dwo.p, .inv_freq = dinv.p,
           .scale = 1.0f / std::sqrt(float(hd)), .meta = meta, .geometry = f.g, .layer = f.view(), .qkv_parts = parts,
           .attn = got_attn.p, .x = dx.p, .clamps = clamps.p, .workspace = workspace.p},
          nullptr);
      ASSERT_TRUE(ran.ok()) << ran;
      CUDA_OK(cudaDeviceSynchronize());
      const std::string what = std::string(KvDtypeName(kc.dtype)) + " hd " + std::to_string(hd) + " group " +
                               std::to_string(kc.group) + " rows " + std::to_string(seqs) + " partials " +
                               std::to_string(count) + " seed " + std::to_string(seed);
      // q/k/v sum in another order than the CPU's, so a K or V byte can round the other way.
      EXPECT_LE(RelL2(ToFloats(got_attn.Get()), want_a), 5e-3) << what;
      EXPECT_LE(RelL2(slot_values(), want_kv), 1e-2) << what;
      EXPECT_LE(RelL2(dx.Get(), want_x), 5e-3) << what;
    }
    EXPECT_EQ(std::vector<char>(workspace.Get()), std::vector<char>(workspace.n, 0)) << "counters left zeroed";
    // No partials (none given, or a count of 0), too many, or partials closer than a whole
    // [rows, width]: refused before anything launches.
    for (const cuda::Partials& bad : {cuda::Partials{}, cuda::Partials{two.p, 0, stride},
                                      cuda::Partials{nullptr, 2, stride},
                                      cuda::Partials{two.p, cuda::kMaxPartials + 1, stride},
                                      cuda::Partials{two.p, 2, stride - 1}}) {
      Dev<float> dx(x0);
      Dev<__half> got_attn(size_t(seqs) * qd);
      const absl::Status refused =
          cuda::AttentionBlock({.rows = seqs, .hidden = hidden, .heads = heads, .bias = dbias.p, .w_o = dwo.p,
                                .inv_freq = dinv.p, .scale = 1.0f, .meta = meta, .geometry = f.g, .layer = f.view(),
                                .qkv_parts = bad, .attn = got_attn.p, .x = dx.p, .clamps = clamps.p,
                                .workspace = workspace.p},
                               nullptr);
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument)
          << refused << " (partials " << bad.count << ", stride " << bad.stride << ")";
      EXPECT_EQ(dx.Get(), x0) << "nothing launched";
    }
  }
  EXPECT_EQ(clamps.Get()[0], 0u);
  // More rows than a group has CTAs, or an fp16 cache: not taken.
  const KvGeometry g{16, kv_heads, hd, 13, kc.dtype};
  EXPECT_EQ(cuda::AttentionBlockTakes(17, hidden, heads, g, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::AttentionBlockTakes(4, hidden, heads, {16, kv_heads, hd, 13, KvDtype::kFp16}, 0).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tailserve
