#pragma once
// What the kernel tests (tests/cuda_*_test.cc) share: device buffers, random fp16-rounded inputs,
// relative L2, split-K references, a small paged KV cache with its CPU-side readers, and the
// CudaKvTest fixture (its cases instantiated once, in cuda_attention_test.cc). Each test checks a
// kernel against a CPU computation on odd sizes; without a CUDA device every test skips
// (REQUIRE_GPU, gpu_test_util.h).
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/gpu_test_util.h"
#include "tests/kernel_cases/case_buffers.h"
#include "tests/kernel_cases/kernel_case.h"
#include "worker/backends/cuda/cuda_resources.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/kernels/kv_cache.h"
#include "worker/backends/cuda/kernels/rope_kv.h"

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// Named, not anonymous: CudaKvTest's TEST_Ps sit in two files and must see one fixture type.
namespace tailserve::testing {

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T)), cudaSuccess); }
  Dev(const std::vector<T>& host) : Dev(host.size()) { Put(host); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  void Put(const std::vector<T>& host) { EXPECT_EQ(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess); }
  std::vector<T> Get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// Check mode of a kernel case (tests/kernel_cases/kernel_case.h): every output within its tolerance.
inline void ExpectCaseMatches(const kernel_cases::CaseSpec& spec) {
  absl::StatusOr<std::vector<kernel_cases::Comparison>> result = kernel_cases::RunCheck(spec, nullptr);
  ASSERT_TRUE(result.ok()) << spec.name << ": " << result.status();
  for (const kernel_cases::Comparison& c : *result) {
    EXPECT_LE(c.error, c.tolerance) << spec.name << ": " << c.output;
  }
}

// Seeded inputs and fp16 rounding, as the kernel cases draw them.
using kernel_cases::Random;
using kernel_cases::RoundToHalf;

inline double RelL2(const std::vector<float>& a, const std::vector<float>& b) { return kernel_cases::RelativeL2(a, b); }

inline float F(__half v) { return __half2float(v); }

using kernel_cases::ToFloats;

// One k chunk's share of a split-K product, the reference for a partial: out[r, c] = Σ over
// i in [k0, k1) of a[r, i] · w[c, i] (a [rows, k], w [n, k]), and the same entries of a kernel's
// partial at `got` ([rows, n]), side by side for RelL2.
struct ChunkCheck {
  std::vector<float> want, mine;
};
inline ChunkCheck ChunkOfProduct(const std::vector<float>& a, const std::vector<__half>& w, int rows, int n, int k,
                                 int k0, int k1, const float* got) {
  ChunkCheck c{std::vector<float>(size_t(rows) * n), std::vector<float>(size_t(rows) * n)};
  for (int r = 0; r < rows; ++r) {
    for (int col = 0; col < n; ++col) {
      double d = 0;
      for (int i = k0; i < k1; ++i) d += double(a[size_t(r) * k + i]) * __half2float(w[size_t(col) * k + i]);
      c.want[size_t(r) * n + col] = float(d);
      c.mine[size_t(r) * n + col] = got[size_t(r) * n + col];
    }
  }
  return c;
}

// X·Wᵀ in double, rounded to float: x [rows, k], W's rows `ldw` elements apart from `w`.
inline std::vector<float> XWt(const std::vector<float>& x, const float* w, int rows, int k, int n, size_t ldw) {
  std::vector<float> out(size_t(rows) * n);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < n; ++c) {
      double d = 0;
      for (int i = 0; i < k; ++i) d += double(x[size_t(r) * k + i]) * w[c * ldw + i];
      out[size_t(r) * n + c] = float(d);
    }
  }
  return out;
}

// A GemmRunner on the default stream with a 32 MB cuBLASLt workspace of its own.
struct TestGemm {
  DeviceMemory workspace;
  std::unique_ptr<cuda::GemmRunner> runner;
};
inline absl::StatusOr<TestGemm> MakeTestGemm() {
  constexpr size_t kBytes = 32 << 20;
  absl::StatusOr<DeviceMemory> workspace = DeviceAlloc(kBytes);
  if (!workspace.ok()) return workspace.status();
  absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> runner = cuda::GemmRunner::Create(nullptr, workspace->get(), kBytes);
  if (!runner.ok()) return runner.status();
  return TestGemm{*std::move(workspace), *std::move(runner)};
}

// A small paged cache: `seqs` sequences with their own block-table rows, blocks handed out in a
// scrambled order so that pages are not contiguous.
struct PagedFixture {
  KvGeometry g;
  int blocks;
  std::vector<int32_t> table;
  Dev<char> k, v;
  Dev<float> ks, vs;
  PagedFixture(int seqs, int max_len, int kv_heads, int head_dim, KvDtype dtype)
      : g{16, kv_heads, head_dim, (max_len + 15) / 16, dtype},
        blocks(seqs * g.max_blocks_per_seq + 1),
        k(size_t(blocks) * 16 * kv_heads * head_dim * KvElementBytes(dtype)),
        v(k.n),
        ks(size_t(blocks) * 16 * kv_heads),
        vs(ks.n) {
    table.resize(size_t(seqs) * g.max_blocks_per_seq);
    for (size_t i = 0; i < table.size(); ++i) table[i] = 1 + int32_t((i * 7919) % table.size());
  }
  KvLayerView view() { return {k.p, v.p, ks.p, vs.p}; }
};

// Rotate-half RoPE of one head on the CPU.
inline void CpuRope(float* x, int hd, int pos, const std::vector<float>& inv) {
  for (int i = 0; i < hd / 2; ++i) {
    const float angle = float(pos) * inv[i];
    const float c = std::cos(angle), s = std::sin(angle), a = x[i], b = x[i + hd / 2];
    x[i] = a * c - b * s;
    x[i + hd / 2] = b * c + a * s;
  }
}

// Writes every row (sequence row_seq[r], position row_pos[r]) of qkv into f's cache through
// RopeWriteKv (no bias); returns qkv with its q heads rotated, as attention reads them.
inline std::vector<float> CacheRows(PagedFixture& f, const int32_t* dtable, const std::vector<float>& qkv,
                                    const std::vector<int32_t>& row_seq, const std::vector<int32_t>& row_pos, int heads,
                                    const std::vector<float>& inv, unsigned long long* clamps) {
  Dev<float> dqkv(qkv), dinv(inv);
  Dev<int32_t> dseq(row_seq), dpos(row_pos);
  EXPECT_TRUE(cuda::RopeWriteKv(dqkv.p, {}, nullptr, int(row_seq.size()), heads, {dseq.p, dpos.p, dtable}, f.g, f.view(),
                                dinv.p, clamps, nullptr)
                  .ok());
  return dqkv.Get();
}

// Poisons the FP8 cache at `slots` (every KV head): NaN bytes in both FP8 formats, NaN scales. A
// kernel that reads a poisoned slot instead of writing it first leaves NaN in its output.
inline void PoisonSlots(PagedFixture& f, const std::vector<int32_t>& slots) {
  const int kvh = f.g.kv_heads, hd = f.g.head_dim;
  for (int32_t slot : slots) {
    CUDA_OK(cudaMemset(f.k.p + size_t(slot) * kvh * hd, 0x7f, size_t(kvh) * hd));
    CUDA_OK(cudaMemset(f.v.p + size_t(slot) * kvh * hd, 0x7f, size_t(kvh) * hd));
    CUDA_OK(cudaMemset(f.ks.p + size_t(slot) * kvh, 0xff, size_t(kvh) * 4));
    CUDA_OK(cudaMemset(f.vs.p + size_t(slot) * kvh, 0xff, size_t(kvh) * 4));
  }
}

// What f's cache holds at `slots`, as floats: [slot][kv head][K, V][head_dim].
inline std::vector<float> SlotValues(PagedFixture& f, const std::vector<int32_t>& slots) {
  std::vector<float> out;
  Dev<float> head(f.g.head_dim);
  for (int32_t slot : slots) {
    for (int kh = 0; kh < f.g.kv_heads; ++kh) {
      for (int value = 0; value < 2; ++value) {
        EXPECT_TRUE(cuda::ReadKvForTest(f.g, f.view(), value, slot / 16, slot % 16, kh, head.p, nullptr).ok());
        const auto h = head.Get();
        out.insert(out.end(), h.begin(), h.end());
      }
    }
  }
  return out;
}

struct KvCase {
  int head_dim;
  KvDtype dtype;
  double tol;
  int group = 3;  // query heads per KV head: the tiled prefill kernel puts 16 / group tokens in a CTA
};

inline void PrintTo(const KvCase& c, std::ostream* os) {
  *os << KvDtypeName(c.dtype) << " head_dim " << c.head_dim << " group " << c.group;
}

// The attention family's fixture: RoPE and the cache write, the attention, the attention block.
class CudaKvTest : public ::testing::TestWithParam<KvCase> {};

}  // namespace tailserve::testing
