#include "worker/backends/cuda/plan/stream_layout.h"

#include <algorithm>
#include <cstdint>

namespace tailserve::cuda {

std::vector<int> StreamFfnGroupFeatures(int ffn, int chunks, int last, int last_count) {
  if (last == 0) last_count = 0;
  if (chunks < 1 || ffn <= 0 || last < 0 || (last > 0 && last_count < 1) || last_count >= chunks ||
      int64_t{last} * last_count >= ffn) {
    return {};
  }
  const int rest = ffn - last * last_count, equal = chunks - last_count;
  if (rest % (kStreamTileK * equal) != 0 || last % kStreamTileK != 0) return {};
  std::vector<int> features(equal, rest / equal);
  features.insert(features.end(), last_count, last);
  return features;
}

bool StreamFfnSplits(int ffn, int chunks, int last_chunk, int last_chunks) {
  return !StreamFfnGroupFeatures(ffn, chunks, last_chunk, last_chunks).empty();
}

std::vector<StreamFfnSegment> StreamFfnOrder(int chunks, int lag) {
  // Gate/up groups 0 .. lag - 1, then each further group followed by the down chunk `lag` groups
  // back, then the rest of the down chunks.
  std::vector<StreamFfnSegment> order;
  for (int g = 0; g < chunks; ++g) {
    order.push_back({false, g});
    if (g >= lag) order.push_back({true, g - lag});
  }
  for (int g = std::max(0, chunks - lag); g < chunks; ++g) order.push_back({true, g});
  return order;
}

std::vector<bool> StreamFfnItemIsDown(int hidden, int ffn, int chunks, int lag, int last_chunk, int last_chunks) {
  const std::vector<int> features = StreamFfnGroupFeatures(ffn, chunks, last_chunk, last_chunks);
  std::vector<bool> down;
  if (features.empty()) return down;
  for (const StreamFfnSegment& segment : StreamFfnOrder(chunks, lag)) {
    down.insert(down.end(), segment.down ? (hidden + 63) / 64 : features[segment.group] / 32, segment.down);
  }
  return down;
}

}  // namespace tailserve::cuda
