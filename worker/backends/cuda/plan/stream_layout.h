#pragma once
// How StreamGemm and StreamFfn (kernels/stream_gemm.h) cut their work: the k a ring stage
// covers, StreamFfn's feature groups (down's k chunks) and the order its items are taken in.
// Plain C++: the plan and the kernel launchers share it, and the order's safety is tested on the
// CPU.
#include <vector>

namespace tailserve::cuda {

inline constexpr int kStreamGemmMaxRows = 16;
inline constexpr int kStreamFfnMaxChunks = 16;
inline constexpr int kStreamTileK = 64;  // k a TMA box: one 128-byte swizzle row of fp16

// The k one stage of StreamGemm's `variant` covers (64 · its k boxes: variant 4 four boxes, 1 and
// 3 two, others one): StreamGemm takes k in multiples of this times the chunks.
constexpr int StreamGemmKStep(int variant) {
  return kStreamTileK * (variant == 4 ? 4 : (variant == 1 || variant == 3) ? 2 : 1);
}

// StreamFfn's feature groups (down's k chunks): ffn / chunks features each, or with the last
// `last_count` chunks of `last` features each, the others sharing the rest equally; empty where
// that does not split into multiples of a k box.
std::vector<int> StreamFfnGroupFeatures(int ffn, int chunks, int last, int last_count);

// Whether ffn splits into `chunks` down chunks that way (StreamFfnGroupFeatures not empty).
bool StreamFfnSplits(int ffn, int chunks, int last_chunk = 0, int last_chunks = 1);

// The order StreamFfn takes its items in, as segments of one kind and feature group. Every down
// segment must come after its group's gate/up segment (a down item waits for that group), or the
// grid would wait forever.
struct StreamFfnSegment {
  bool down = false;
  int group = 0;
};
std::vector<StreamFfnSegment> StreamFfnOrder(int chunks, int lag);

// StreamFfn's items in the order its grid takes them, true for a down item: what the kernel
// bench's timeline records are. Empty where ffn does not split (StreamFfnSplits).
std::vector<bool> StreamFfnItemIsDown(int hidden, int ffn, int chunks, int lag, int last_chunk = 0,
                                     int last_chunks = 1);

}  // namespace tailserve::cuda
