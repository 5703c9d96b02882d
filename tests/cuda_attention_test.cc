// The attention family against the CPU (the CudaKvTest cases, instantiated here for every KV
// format, head_dim and group; the attention block's test is in cuda_attention_block_test.cc): RoPE
// and the cache write, paged attention as decode rows and prefill runs, decode writing the new K/V
// itself (with RoPE and the projection's partials), a long context, and the clamp of non-finite
// K/V. Without a CUDA device every test skips.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/cuda_test_util.h"
#include "tests/gpu_test_util.h"
#include "worker/backends/cuda/kernels/attention.h"
#include "worker/backends/cuda/kernels/partials.h"
#include "worker/backends/cuda/kernels/rope_kv.h"

namespace tailserve {
namespace {

using namespace testing;

// Writes every position of 3 sequences (lengths across block boundaries) through RopeWriteKv, then
// checks q in place, the cache read back, and attention for every row against the CPU, both as
// decode rows and as prefill runs (tiles of 16 / group rows, two of them straddling sequences).
TEST_P(CudaKvTest, RopeCacheWriteAndAttentionMatchCpu) {
  REQUIRE_GPU();
  const KvCase kc = GetParam();
  const unsigned seed = 99 + kc.head_dim;
  std::mt19937 rng(seed);
  const int kv_heads = 2, heads = kc.group * kv_heads, hd = kc.head_dim;
  const std::vector<int> lens = {1, 17, 40};
  PagedFixture f(int(lens.size()), 48, kv_heads, hd, kc.dtype);
  std::vector<int32_t> row_seq, row_pos;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int p = 0; p < lens[s]; ++p) row_seq.push_back(int32_t(s)), row_pos.push_back(p);
  }
  const int rows = int(row_seq.size()), width = (heads + 2 * kv_heads) * hd;
  const auto qkv = Random(size_t(rows) * width, rng, 2.0f), bias = Random(width, rng, 0.5f);
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / hd);
  Dev<float> dqkv(qkv), dbias(bias), dinv(inv);
  Dev<int32_t> dseq(row_seq), dpos(row_pos), dtable(f.table);
  Dev<unsigned long long> clamps(1);
  CUDA_OK(cudaMemset(clamps.p, 0, 8));
  const RowMeta meta{dseq.p, dpos.p, dtable.p};
  ASSERT_TRUE(cuda::RopeWriteKv(dqkv.p, {}, dbias.p, rows, heads, meta, f.g, f.view(), dinv.p, clamps.p, nullptr).ok());
  const auto got_qkv = dqkv.Get();

  // CPU: bias, rotation; keys and values as the cache should hold them.
  std::vector<float> ref = qkv;
  for (int r = 0; r < rows; ++r) {
    float* x = ref.data() + size_t(r) * width;
    for (int i = 0; i < width; ++i) x[i] += bias[i];
    for (int h = 0; h < heads + kv_heads; ++h) CpuRope(x + h * hd, hd, row_pos[r], inv);
  }
  std::vector<float> q_got, q_want;
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < heads * hd; ++i) q_got.push_back(got_qkv[size_t(r) * width + i]), q_want.push_back(ref[size_t(r) * width + i]);
  }
  EXPECT_LE(RelL2(q_got, q_want), 1e-5) << "seed " << seed;
  // Every row's cached K and V heads read back from a cache, in row, then KV-head order.
  Dev<float> head(hd);
  auto read_back = [&](PagedFixture& cache, std::vector<float>* k, std::vector<float>* v) {
    for (int r = 0; r < rows; ++r) {
      const int block = cache.table[size_t(row_seq[r]) * cache.g.max_blocks_per_seq + row_pos[r] / 16];
      for (int kh = 0; kh < kv_heads; ++kh) {
        for (int value = 0; value < 2; ++value) {
          ASSERT_TRUE(
              cuda::ReadKvForTest(cache.g, cache.view(), value, block, row_pos[r] % 16, kh, head.p, nullptr).ok());
          const auto h = head.Get();
          (value ? v : k)->insert((value ? v : k)->end(), h.begin(), h.end());
        }
      }
    }
  };
  std::vector<float> k_got, k_want, v_got, v_want;
  ASSERT_NO_FATAL_FAILURE(read_back(f, &k_got, &v_got));
  for (int r = 0; r < rows; ++r) {
    for (int kh = 0; kh < kv_heads; ++kh) {
      for (int value = 0; value < 2; ++value) {
        const float* want = ref.data() + size_t(r) * width + (heads + value * kv_heads + kh) * hd;
        (value ? v_want : k_want).insert((value ? v_want : k_want).end(), want, want + hd);
      }
    }
  }
  EXPECT_LE(RelL2(k_got, k_want), kc.tol) << KvDtypeName(kc.dtype) << " seed " << seed;
  EXPECT_LE(RelL2(v_got, v_want), kc.tol) << KvDtypeName(kc.dtype) << " seed " << seed;
  EXPECT_EQ(clamps.Get()[0], 0u);

  // The same q/k/v as a split-K projection's two partials, which RoPE sums (q to its own buffer),
  // into a second cache (same block table): the same q and K/V to rounding.
  {
    PagedFixture f2(int(lens.size()), 48, kv_heads, hd, kc.dtype);
    const int64_t stride = int64_t(rows) * width + 4;
    const auto p0 = Random(size_t(rows) * width, rng, 1.0f);
    std::vector<float> parts(size_t(2 * stride), std::nanf(""));
    for (size_t i = 0; i < p0.size(); ++i) parts[i] = p0[i], parts[size_t(stride) + i] = qkv[i] - p0[i];
    Dev<float> dparts(parts), dq(std::vector<float>(size_t(rows) * width, std::nanf("")));
    ASSERT_TRUE(cuda::RopeWriteKv(dq.p, {dparts.p, 2, stride}, dbias.p, rows, heads, meta, f2.g, f2.view(), dinv.p,
                                  clamps.p, nullptr)
                    .ok());
    const auto q2 = dq.Get();
    std::vector<float> q2_got, k2_got, v2_got;
    for (int r = 0; r < rows; ++r) {
      q2_got.insert(q2_got.end(), q2.begin() + size_t(r) * width, q2.begin() + size_t(r) * width + heads * hd);
    }
    ASSERT_NO_FATAL_FAILURE(read_back(f2, &k2_got, &v2_got));
    EXPECT_LE(RelL2(q2_got, q_want), 1e-5) << "partials, seed " << seed;
    EXPECT_LE(RelL2(k2_got, k_want), kc.tol) << "partials, " << KvDtypeName(kc.dtype) << " seed " << seed;
    EXPECT_LE(RelL2(v2_got, v_want), kc.tol) << "partials, " << KvDtypeName(kc.dtype) << " seed " << seed;
    EXPECT_EQ(clamps.Get()[0], 0u);
  }

  // Attention of every row over the cache as stored (quantisation is not counted against the
  // kernel), as decode rows and as prefill runs.
  for (int window : {0, 7}) {
    std::vector<float> want(size_t(rows) * heads * hd);
    for (int r = 0; r < rows; ++r) {
      const int lo = window ? std::max(0, row_pos[r] - window + 1) : 0;
      for (int h = 0; h < heads; ++h) {
        const int kh = h / (heads / kv_heads);
        const float* q = got_qkv.data() + size_t(r) * width + h * hd;
        std::vector<double> s;
        for (int p = lo; p <= row_pos[r]; ++p) {
          const int rr = r - (row_pos[r] - p);  // rows of a sequence are consecutive by position
          const float* kk = k_got.data() + (size_t(rr) * kv_heads + kh) * hd;
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += double(q[d]) * kk[d];
          s.push_back(dot / std::sqrt(double(hd)));
        }
        const double m = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - m));
        for (int d = 0; d < hd; ++d) {
          double a = 0;
          for (size_t j = 0; j < s.size(); ++j) {
            const int rr = r - (row_pos[r] - (lo + int(j)));
            a += s[j] / z * v_got[(size_t(rr) * kv_heads + kh) * hd + d];
          }
          want[(size_t(r) * heads + h) * hd + d] = float(a);
        }
      }
    }
    // Splits merge with the combine kernel, or (decode, tensor cores, 2-16 splits) in a cluster;
    // decode on the tensor cores also in CTAs of 8 and 16 warps.
    for (int splits : {1, 3, 11, 16, 32}) {
      for (int mode = 0; mode < 3; ++mode) {  // decode, decode merged in a cluster, prefill runs
        const bool runs = mode == 2, cluster = mode == 1;
        if (cluster && (!cuda::AttentionTakesNewKv(f.g) || splits == 1 || splits > cuda::kMaxClusterSplits)) continue;
        for (int warps : {4, 8, 16}) {
          if (warps != 4 && (runs || !cuda::AttentionTakesNewKv(f.g))) continue;
          cuda::AttentionShape shape{.rows = rows, .heads = heads, .q_stride = width, .sliding_window = window,
                                     .splits = splits, .scale = 1.0f / std::sqrt(float(hd)), .runs = runs,
                                     .cluster_merge = cluster, .warps = warps};
          Dev<float> ws(cuda::AttentionWorkspaceFloats(shape, hd));
          Dev<__half> out(size_t(rows) * heads * hd);
          ASSERT_TRUE(cuda::PagedAttention(dqkv.p, shape, meta, f.g, f.view(), ws.p, out.p, nullptr).ok());
          EXPECT_LE(RelL2(ToFloats(out.Get()), want), 4e-3) << "splits " << splits << " window " << window << " runs "
                                                            << runs << " cluster " << cluster << " warps " << warps
                                                            << " seed " << seed;
        }
      }
    }
    for (int warps : {2, 12, 32}) {  // refused: not a kernel instance
      const cuda::AttentionShape odd{.rows = rows, .heads = heads, .q_stride = width, .warps = warps};
      EXPECT_EQ(cuda::PagedAttention(dqkv.p, odd, meta, f.g, f.view(), nullptr, nullptr, nullptr).code(),
                absl::StatusCode::kInvalidArgument) << "warps " << warps;
    }
    if (cuda::AttentionTakesNewKv(f.g)) {  // 8 and 16 warps decode only
      const cuda::AttentionShape wide_prefill{.rows = rows, .heads = heads, .q_stride = width, .runs = true, .warps = 16};
      EXPECT_EQ(cuda::PagedAttention(dqkv.p, wide_prefill, meta, f.g, f.view(), nullptr, nullptr, nullptr).code(),
                absl::StatusCode::kInvalidArgument);
    }
    cuda::AttentionShape prefill_in_cluster{.rows = rows, .heads = heads, .q_stride = width, .splits = 3,
                                            .runs = true, .cluster_merge = true};
    EXPECT_EQ(cuda::PagedAttention(dqkv.p, prefill_in_cluster, meta, f.g, f.view(), nullptr, nullptr, nullptr).code(),
              absl::StatusCode::kInvalidArgument);
    prefill_in_cluster.rows = 0;  // refused even with nothing to do
    EXPECT_EQ(cuda::PagedAttention(dqkv.p, prefill_in_cluster, meta, f.g, f.view(), nullptr, nullptr, nullptr).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaKvTest,
                         ::testing::Values(KvCase{64, KvDtype::kFp16, 1e-3}, KvCase{128, KvDtype::kFp16, 1e-3},
                                           KvCase{32, KvDtype::kFp8E4M3, 4e-2},
                                           KvCase{64, KvDtype::kFp8E4M3, 4e-2}, KvCase{128, KvDtype::kFp8E4M3, 4e-2},
                                           KvCase{128, KvDtype::kFp8E5M2, 8e-2},
                                           KvCase{128, KvDtype::kFp8E4M3, 4e-2, 4}, KvCase{64, KvDtype::kFp8E4M3, 4e-2, 8},
                                           KvCase{32, KvDtype::kFp8E5M2, 8e-2, 1}),
                         [](const auto& info) {
                           return std::string(KvDtypeName(info.param.dtype)) + "_hd" + std::to_string(info.param.head_dim) +
                                  "_g" + std::to_string(info.param.group);
                         });

// Decode with new_kv (the batch-1 path): the rows' own K/V arrive rotated in the q rows while the
// cache holds poison (NaN bytes and scales) at their slots. The attention must equal attention over
// the cache RopeWriteKv wrote, and leave the cache holding what RopeWriteKv would have.
TEST_P(CudaKvTest, DecodeWithNewKvMatchesCachedAttention) {
  REQUIRE_GPU();
  const KvCase kc = GetParam();
  const int kv_heads = 2, heads = kc.group * kv_heads, hd = kc.head_dim;
  // 200: the writing warp's first tile loads before the wait and its stash lands in a later group.
  const std::vector<int> lens = {1, 17, 40, 200};
  PagedFixture f(int(lens.size()), 200, kv_heads, hd, kc.dtype);
  if (!cuda::AttentionTakesNewKv(f.g)) GTEST_SKIP() << "new_kv runs on the tensor-core (FP8) kernel only";
  const unsigned seed = 199 + kc.head_dim;
  std::mt19937 rng(seed);
  std::vector<int32_t> row_seq, row_pos;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int p = 0; p < lens[s]; ++p) row_seq.push_back(int32_t(s)), row_pos.push_back(p);
  }
  const int rows = int(row_seq.size()), width = (heads + 2 * kv_heads) * hd, seqs = int(lens.size());
  const auto qkv = Random(size_t(rows) * width, rng, 2.0f);
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / hd);
  Dev<int32_t> dtable(f.table);
  Dev<unsigned long long> clamps(1);
  CUDA_OK(cudaMemset(clamps.p, 0, 8));
  const auto rotated = CacheRows(f, dtable.p, qkv, row_seq, row_pos, heads, inv, clamps.p);
  // Each sequence's last position as a decode row: q as RopeWriteKv left it, k and v as cached.
  std::vector<float> last(size_t(seqs) * width);
  std::vector<int32_t> last_seq(seqs), last_pos(seqs), slots(seqs);
  Dev<float> head(hd);
  for (int s = 0, r = -1; s < seqs; ++s) {
    r += lens[s];
    last_seq[s] = s, last_pos[s] = lens[s] - 1;
    std::copy_n(rotated.data() + size_t(r) * width, heads * hd, last.data() + size_t(s) * width);
    const int block = f.table[size_t(s) * f.g.max_blocks_per_seq + last_pos[s] / 16];
    slots[s] = block * 16 + last_pos[s] % 16;
    for (int kh = 0; kh < kv_heads; ++kh) {
      for (int value = 0; value < 2; ++value) {
        ASSERT_TRUE(cuda::ReadKvForTest(f.g, f.view(), value, block, last_pos[s] % 16, kh, head.p, nullptr).ok());
        const auto h = head.Get();
        std::copy(h.begin(), h.end(), last.data() + size_t(s) * width + (heads + value * kv_heads + kh) * hd);
      }
    }
  }
  Dev<float> dlast(last);
  Dev<int32_t> dlast_seq(last_seq), dlast_pos(last_pos);
  const RowMeta meta{dlast_seq.p, dlast_pos.p, dtable.p};
  // Each new_kv run merges as its reference does: 3, 11 and 16 splits in a cluster, 32 with the
  // combine kernel.
  // 16 and 8 warps a CTA: one split (the engine's batch 16 and 32) and 3 in a cluster.
  struct Run {
    int splits, window, warps = 4;
  };
  for (auto [splits, window, warps] : {Run{1, 0}, Run{3, 0}, Run{16, 0}, Run{32, 0}, Run{1, 37}, Run{3, 37}, Run{11, 37},
                                       Run{1, 0, 16}, Run{1, 37, 8}, Run{3, 0, 16}, Run{2, 37, 8}}) {
    cuda::AttentionShape shape{.rows = seqs, .heads = heads, .q_stride = width, .sliding_window = window,
                               .splits = splits, .scale = 1.0f / std::sqrt(float(hd)),
                               .cluster_merge = splits > 1 && splits <= cuda::kMaxClusterSplits, .warps = warps};
    Dev<float> ws(cuda::AttentionWorkspaceFloats(shape, hd));
    Dev<__half> cached(size_t(seqs) * heads * hd), fresh(cached.n);
    ASSERT_TRUE(cuda::PagedAttention(dlast.p, shape, meta, f.g, f.view(), ws.p, cached.p, nullptr).ok());
    PoisonSlots(f, slots);
    shape.new_kv = true;
    ASSERT_TRUE(cuda::PagedAttention(dlast.p, shape, meta, f.g, f.view(), ws.p, fresh.p, nullptr, clamps.p).ok());
    const std::string what = std::string(KvDtypeName(kc.dtype)) + " splits " + std::to_string(splits) + " window " +
                             std::to_string(window) + " warps " + std::to_string(warps) + " seed " + std::to_string(seed);
    EXPECT_LE(RelL2(ToFloats(fresh.Get()), ToFloats(cached.Get())), 1e-3) << what;
    for (int s = 0; s < seqs; ++s) {
      for (int kh = 0; kh < kv_heads; ++kh) {
        for (int value = 0; value < 2; ++value) {
          const int block = slots[s] / 16;
          ASSERT_TRUE(cuda::ReadKvForTest(f.g, f.view(), value, block, slots[s] % 16, kh, head.p, nullptr).ok());
          const float* want = last.data() + size_t(s) * width + (heads + value * kv_heads + kh) * hd;
          EXPECT_LE(RelL2(head.Get(), std::vector<float>(want, want + hd)), 1e-6) << what << " seq " << s;
        }
      }
    }
  }
  EXPECT_EQ(clamps.Get()[0], 0u);
}

// Decode above batch 1 (shape.rope): each sequence's new position arrives as the q/k/v projection,
// unrotated and split into two partials plus a bias (or whole, without partials), while the cache
// holds poison at its slots. The attention must equal RopeWriteKv followed by the attention over
// the cache, and leave in the cache what RopeWriteKv writes.
TEST_P(CudaKvTest, DecodeWithRopeMatchesRopeWriteKv) {
  REQUIRE_GPU();
  const KvCase kc = GetParam();
  const int kv_heads = 2, heads = kc.group * kv_heads, hd = kc.head_dim;
  const std::vector<int> lens = {1, 17, 40, 200};
  PagedFixture f(int(lens.size()), 200, kv_heads, hd, kc.dtype);
  if (!cuda::AttentionTakesNewKv(f.g)) GTEST_SKIP() << "RoPE in the attention runs on the tensor-core (FP8) kernel only";
  const unsigned seed = 263 + kc.head_dim;
  std::mt19937 rng(seed);
  const int width = (heads + 2 * kv_heads) * hd, seqs = int(lens.size());
  // The cache: every position but each sequence's last.
  std::vector<int32_t> row_seq, row_pos;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int p = 0; p + 1 < lens[s]; ++p) row_seq.push_back(int32_t(s)), row_pos.push_back(p);
  }
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(500000.0f, 2.0f * i / hd);
  Dev<int32_t> dtable(f.table);
  Dev<unsigned long long> clamps(1);
  CUDA_OK(cudaMemset(clamps.p, 0, 8));
  CacheRows(f, dtable.p, Random(row_seq.size() * width, rng, 2.0f), row_seq, row_pos, heads, inv, clamps.p);
  // The last positions: the projection, its two partials, the bias.
  const auto whole = Random(size_t(seqs) * width, rng, 2.0f), bias = Random(size_t(width), rng, 0.5f);
  auto parts = Random(size_t(2) * seqs * width, rng, 2.0f);
  for (size_t i = 0; i < whole.size(); ++i) parts[whole.size() + i] = whole[i] - parts[i];
  std::vector<int32_t> last_seq(seqs), last_pos(seqs), slots(seqs);
  for (int s = 0; s < seqs; ++s) {
    last_seq[s] = s, last_pos[s] = lens[s] - 1;
    slots[s] = f.table[size_t(s) * f.g.max_blocks_per_seq + last_pos[s] / 16] * 16 + last_pos[s] % 16;
  }
  Dev<float> dparts(parts), dbias(bias), dinv(inv);
  Dev<int32_t> dlast_seq(last_seq), dlast_pos(last_pos);
  const RowMeta meta{dlast_seq.p, dlast_pos.p, dtable.p};
  auto slot_values = [&]() { return SlotValues(f, slots); };  // the last positions' cached K and V
  struct Run {
    int splits, window, warps, partials;
  };
  for (auto [splits, window, warps, partials] : {Run{1, 0, 4, 2}, Run{1, 0, 16, 2}, Run{1, 37, 8, 2}, Run{3, 0, 4, 2},
                                                 Run{32, 0, 4, 2}, Run{1, 0, 16, 0}, Run{2, 37, 8, 0}}) {
    // The projection as the kernels read it: the partials, or the whole in q's place.
    const cuda::Partials in = partials ? cuda::Partials{dparts.p, 2, int64_t(seqs) * width} : cuda::Partials{};
    Dev<float> dq(whole);
    cuda::AttentionShape shape{.rows = seqs, .heads = heads, .q_stride = width, .sliding_window = window,
                               .splits = splits, .scale = 1.0f / std::sqrt(float(hd)),
                               .cluster_merge = splits > 1 && splits <= cuda::kMaxClusterSplits, .warps = warps};
    Dev<float> ws(cuda::AttentionWorkspaceFloats(shape, hd));
    Dev<__half> want(size_t(seqs) * heads * hd), got(want.n);
    PoisonSlots(f, slots);
    ASSERT_TRUE(cuda::RopeWriteKv(dq.p, in, dbias.p, seqs, heads, meta, f.g, f.view(), dinv.p, clamps.p, nullptr).ok());
    ASSERT_TRUE(cuda::PagedAttention(dq.p, shape, meta, f.g, f.view(), ws.p, want.p, nullptr).ok());
    const auto want_kv = slot_values();
    PoisonSlots(f, slots);
    dq.Put(whole);
    shape.new_kv = true, shape.rope = {.inv_freq = dinv.p, .parts = in, .bias = dbias.p};
    ASSERT_TRUE(cuda::PagedAttention(dq.p, shape, meta, f.g, f.view(), ws.p, got.p, nullptr, clamps.p).ok());
    const std::string what = std::string(KvDtypeName(kc.dtype)) + " splits " + std::to_string(splits) + " window " +
                             std::to_string(window) + " warps " + std::to_string(warps) + " partials " +
                             std::to_string(partials) + " seed " + std::to_string(seed);
    EXPECT_LE(RelL2(ToFloats(got.Get()), ToFloats(want.Get())), 1e-3) << what;
    // The same fp32 sums and angles, so the same bytes up to a contraction's rounding.
    EXPECT_LE(RelL2(slot_values(), want_kv), 1e-3) << what;
  }
  EXPECT_EQ(clamps.Get()[0], 0u);
  // RoPE in the attention needs new_kv.
  cuda::AttentionShape bad{.rows = seqs, .heads = heads, .q_stride = width, .scale = 1.0f,
                           .rope = {.inv_freq = dinv.p}};
  Dev<__half> out(size_t(seqs) * heads * hd);
  EXPECT_EQ(cuda::PagedAttention(dparts.p, bad, meta, f.g, f.view(), nullptr, out.p, nullptr, clamps.p).code(),
            absl::StatusCode::kInvalidArgument);
}

// What f's cache holds for positions [0, len) of sequence row 0: [len][kv_heads][head_dim] floats
// (fp16, or E4M3 times its scale), K or V.
std::vector<float> CachedRows(PagedFixture& f, bool value, int len) {
  const std::vector<char> bytes = (value ? f.v : f.k).Get();
  const std::vector<float> scales = (value ? f.vs : f.ks).Get();
  const int kvh = f.g.kv_heads, hd = f.g.head_dim;
  std::vector<float> out(size_t(len) * kvh * hd);
  for (int p = 0; p < len; ++p) {
    const size_t slot = size_t(f.table[p / 16]) * 16 + p % 16;
    for (int kh = 0; kh < kvh; ++kh) {
      for (int d = 0; d < hd; ++d) {
        const size_t at = (slot * kvh + kh) * hd + d;
        float x;
        if (f.g.dtype == KvDtype::kFp16) {
          __half h;
          std::memcpy(&h, bytes.data() + 2 * at, 2);
          x = __half2float(h);
        } else {
          __nv_fp8_e4m3 e;
          e.__x = static_cast<__nv_fp8_storage_t>(bytes[at]);
          x = float(e) * scales[slot * kvh + kh];
        }
        out[(size_t(p) * kvh + kh) * hd + d] = x;
      }
    }
  }
  return out;
}

// One decode row over 8300 keys (519 scrambled blocks): on the tensor cores (E4M3) a single-split
// CTA streams 130 tiles a warp (33 in 16 warps), and the CUDA-core kernel (fp16) as many passes;
// 3 and 8 splits merge. Then the row at position 299 (300 keys) the same ways.
// The other attention tests stay under 48 keys.
TEST(CudaKernelTest, DecodeAttentionOverALongContext) {
  REQUIRE_GPU();
  const unsigned seed = 4242;
  const int kv_heads = 2, heads = 8, hd = 64, len = 8300, width = (heads + 2 * kv_heads) * hd;
  for (KvDtype dtype : {KvDtype::kFp16, KvDtype::kFp8E4M3}) {
    std::mt19937 rng(seed);
    PagedFixture f(1, len, kv_heads, hd, dtype);
    std::vector<int32_t> row_seq(len, 0), row_pos(len);
    for (int p = 0; p < len; ++p) row_pos[p] = p;
    const auto qkv = Random(size_t(len) * width, rng, 1.0f);
    const std::vector<float> inv(hd / 2, 0.0f);  // angle 0: q and the cached k as qkv holds them
    Dev<int32_t> dtable(f.table);
    Dev<unsigned long long> clamps(1);
    CUDA_OK(cudaMemset(clamps.p, 0, 8));
    Dev<float> dqkv(CacheRows(f, dtable.p, qkv, row_seq, row_pos, heads, inv, clamps.p));
    const auto keys = CachedRows(f, false, len), values = CachedRows(f, true, len);
    // The last position, and position 299 (300 keys): 8 splits of 64 keys there give the fifth 44
    // keys (one of its four warps has no tile) and the last three none.
    for (int n : {len, 300}) {
      const float* q = qkv.data() + size_t(n - 1) * width;
      std::vector<float> want(size_t(heads) * hd);
      for (int h = 0; h < heads; ++h) {
        const int kh = h / (heads / kv_heads);
        std::vector<double> s(n);
        for (int p = 0; p < n; ++p) {
          const float* k = keys.data() + (size_t(p) * kv_heads + kh) * hd;
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += double(q[h * hd + d]) * k[d];
          s[p] = dot / std::sqrt(double(hd));
        }
        const double m = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - m));
        for (int d = 0; d < hd; ++d) {
          double a = 0;
          for (int p = 0; p < n; ++p) a += s[p] / z * values[(size_t(p) * kv_heads + kh) * hd + d];
          want[size_t(h) * hd + d] = float(a);
        }
      }
      Dev<int32_t> last_seq(std::vector<int32_t>{0}), last_pos(std::vector<int32_t>{n - 1});
      for (auto [splits, warps] : {std::pair{1, 4}, {3, 4}, {8, 4}, {1, 16}}) {
        if (warps != 4 && !cuda::AttentionTakesNewKv(f.g)) continue;
        const cuda::AttentionShape shape{.rows = 1, .heads = heads, .q_stride = width, .splits = splits,
                                         .scale = 1.0f / std::sqrt(float(hd)), .warps = warps};
        Dev<float> ws(cuda::AttentionWorkspaceFloats(shape, hd));
        Dev<__half> out(size_t(heads) * hd);
        ASSERT_TRUE(cuda::PagedAttention(dqkv.p + size_t(n - 1) * width, shape, {last_seq.p, last_pos.p, dtable.p},
                                         f.g, f.view(), ws.p, out.p, nullptr)
                        .ok());
        EXPECT_LE(RelL2(ToFloats(out.Get()), want), 4e-3)
            << KvDtypeName(dtype) << " keys " << n << " splits " << splits << " warps " << warps << " seed " << seed;
      }
    }
  }
}

TEST(CudaKernelTest, KvWriteClampsNonFiniteValuesAndCountsThem) {
  REQUIRE_GPU();
  for (KvDtype dtype : {KvDtype::kFp8E4M3, KvDtype::kFp16}) {
    PagedFixture f(1, 16, 1, 64, dtype);
    const int width = 3 * 64;
    std::vector<float> qkv(width, 1.0f);
    qkv[64 + 3] = INFINITY;   // a key element
    qkv[128 + 5] = NAN;       // a value element
    qkv[128 + 6] = 1e6f;      // beyond fp16's range (fine for scaled fp8)
    std::vector<float> inv(32, 0.0f);
    Dev<float> dqkv(qkv), dinv(inv);
    Dev<int32_t> dseq(std::vector<int32_t>{0}), dpos(std::vector<int32_t>{0}), dtable(f.table);
    Dev<unsigned long long> clamps(1);
    CUDA_OK(cudaMemset(clamps.p, 0, 8));
    ASSERT_TRUE(cuda::RopeWriteKv(dqkv.p, {}, nullptr, 1, 1, {dseq.p, dpos.p, dtable.p}, f.g, f.view(), dinv.p, clamps.p,
                                  nullptr).ok());
    Dev<float> head(64);
    for (int value = 0; value < 2; ++value) {
      ASSERT_TRUE(cuda::ReadKvForTest(f.g, f.view(), value, f.table[0], 0, 0, head.p, nullptr).ok());
      for (float x : head.Get()) EXPECT_TRUE(std::isfinite(x)) << KvDtypeName(dtype);
    }
    // The key's inf also makes its rotation partner NaN (inf · sin 0): two key clamps, one for
    // the NaN value, and for fp16 one more for 1e6 (FP8 scales it into range).
    EXPECT_EQ(clamps.Get()[0], dtype == KvDtype::kFp16 ? 4u : 3u) << KvDtypeName(dtype);
  }
}

}  // namespace
}  // namespace tailserve
