// StreamFfn's item order and feature groups (plan/stream_layout.h): plain C++, checked without a GPU.
#include "worker/backends/cuda/plan/stream_layout.h"

#include <gtest/gtest.h>

namespace tailserve {
namespace {

// StreamFfn's item order holds each group's gate/up and down segment once, and a
// down segment after its own gate/up segment (else the grid waits forever) and `lag` groups
// behind it where the order allows, so down's items rarely wait.
TEST(StreamLayoutTest, EveryDownComesAfterItsGateUp) {
  for (int chunks = 1; chunks <= cuda::kStreamFfnMaxChunks; ++chunks) {
    for (int lag = 1; lag <= chunks + 1; ++lag) {
      const std::vector<cuda::StreamFfnSegment> order = cuda::StreamFfnOrder(chunks, lag);
      ASSERT_EQ(order.size(), size_t(2 * chunks)) << chunks << " chunks, lag " << lag;
      std::vector<int> gate_up_at(chunks, -1), down_at(chunks, -1);
      for (int i = 0; i < int(order.size()); ++i) {
        ASSERT_GE(order[i].group, 0);
        ASSERT_LT(order[i].group, chunks);
        int& at = order[i].down ? down_at[order[i].group] : gate_up_at[order[i].group];
        EXPECT_EQ(at, -1) << chunks << " chunks, lag " << lag << ": group " << order[i].group << " twice";
        at = i;
      }
      for (int g = 0; g < chunks; ++g) {
        EXPECT_GT(down_at[g], gate_up_at[g]) << chunks << " chunks, lag " << lag << ", group " << g;
        if (g + lag < chunks) {
          EXPECT_GT(down_at[g], gate_up_at[g + lag]) << chunks << " chunks, lag " << lag << ", group " << g;
          EXPECT_LT(down_at[g], gate_up_at[g + lag] + 2) << chunks << " chunks, lag " << lag << ", group " << g;
        }
      }
    }
  }
}

// the item kinds the kernel bench's timeline reads, segment by segment of the order
// (hidden 128: 2 down tiles a group; ffn 512 in 4 groups of 128 features: 4 gate/up tiles a group).
TEST(StreamLayoutTest, ItemKindsFollowTheOrder) {
  const bool G = false, D = true;
  const std::vector<bool> want = {G, G, G, G, G, G, G, G, G, G, G, G, D, D,  // GU0 GU1 GU2 D0
                                  G, G, G, G, D, D, D, D, D, D};             // GU3 D1 D2 D3
  EXPECT_EQ(cuda::StreamFfnItemIsDown(128, 512, 4, 2), want);
}

// A last chunk of 64 features (ffn 448: three of 128, then 64): its gate/up group has 2 tiles; a
// last chunk that is no multiple of 64, or leaves the rest unequal, splits nothing.
TEST(StreamLayoutTest, ALastChunkOfItsOwnSize) {
  const bool G = false, D = true;
  const std::vector<bool> want = {G, G, G, G, G, G, G, G, G, G, G, G, D, D,  // GU0 GU1 GU2 D0
                                  G, G, D, D, D, D, D, D};                   // GU3 D1 D2 D3
  EXPECT_EQ(cuda::StreamFfnItemIsDown(128, 448, 4, 2, 64), want);
  EXPECT_TRUE(cuda::StreamFfnItemIsDown(128, 448, 4, 2, 32).empty());
  EXPECT_TRUE(cuda::StreamFfnItemIsDown(128, 512, 4, 2, 64).empty());
  EXPECT_TRUE(cuda::StreamFfnItemIsDown(128, 512, 1, 2, 64).empty());
  EXPECT_TRUE(cuda::StreamFfnSplits(14336, 4, 2048));  // the 8B: 3 · 4096 + 2048
  EXPECT_TRUE(cuda::StreamFfnSplits(14336, 4));
  EXPECT_FALSE(cuda::StreamFfnSplits(688, 1));  // llama-gqa's ffn: no multiple of 64
}

// The last two chunks of 64 features (ffn 512: two of 192, then 64 and 64); as many last chunks as
// chunks, or none of a size, split nothing.
TEST(StreamLayoutTest, LastChunksOfTheirOwnSize) {
  const bool G = false, D = true;
  const std::vector<bool> want = {G, G, G, G, G, G, G, G, G, G, G, G, G, G, D, D,  // GU0 GU1 GU2 D0
                                  G, G, D, D, D, D, D, D};                         // GU3 D1 D2 D3
  EXPECT_EQ(cuda::StreamFfnItemIsDown(128, 512, 4, 2, 64, 2), want);
  EXPECT_TRUE(cuda::StreamFfnItemIsDown(128, 512, 4, 2, 64, 4).empty());
  EXPECT_TRUE(cuda::StreamFfnItemIsDown(128, 512, 4, 2, 64, 0).empty());
  EXPECT_TRUE(cuda::StreamFfnItemIsDown(128, 512, 4, 2, 256, 2).empty());  // nothing left for the rest
  EXPECT_TRUE(cuda::StreamFfnSplits(14336, 4, 2048, 2));  // the 8B: 2 · 5120 + 2 · 2048
  EXPECT_TRUE(cuda::StreamFfnSplits(14336, 4, 2560, 3));  // 6656 + 3 · 2560
  EXPECT_FALSE(cuda::StreamFfnSplits(14336, 4, 2000, 2));  // no multiple of 64
}

TEST(StreamLayoutTest, KStepOfEachVariant) {
  EXPECT_EQ(cuda::StreamGemmKStep(0), 64);
  EXPECT_EQ(cuda::StreamGemmKStep(1), 128);
  EXPECT_EQ(cuda::StreamGemmKStep(2), 64);
  EXPECT_EQ(cuda::StreamGemmKStep(3), 128);
  EXPECT_EQ(cuda::StreamGemmKStep(4), 256);
}

}  // namespace
}  // namespace tailserve
