#pragma once
// Where each head sits in a row of the fused q/k/v projection. The row holds `groups` groups of
// consecutive KV heads, each group [its query heads | its k heads | its v heads]. One group is the
// plain layout (all q heads, then all k, then all v); two let each half of the KV heads be one
// contiguous slice of W_qkv's rows, so the engine can run the attention block's halves as two
// GEMMs on two graph branches.
#ifdef __CUDACC__
#define TAILSERVE_HD __host__ __device__
#else
#define TAILSERVE_HD
#endif

namespace tailserve::cuda {

struct QkvLayout {
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int groups = 1;  // divides kv_heads

  TAILSERVE_HD int width() const { return (heads + 2 * kv_heads) * head_dim; }
  TAILSERVE_HD int group_width() const { return width() / groups; }
  // Offsets (floats from the row's start) of query head `head` and of KV head `kv`'s k and v.
  TAILSERVE_HD int Q(int head) const {
    const int per = heads / groups, grp = head / per;
    return grp * group_width() + (head - grp * per) * head_dim;
  }
  TAILSERVE_HD int K(int kv) const {
    const int per = kv_heads / groups, grp = kv / per;
    return grp * group_width() + (heads / groups + kv - grp * per) * head_dim;
  }
  TAILSERVE_HD int V(int kv) const { return K(kv) + kv_heads / groups * head_dim; }
};

// The KV heads [begin, begin + count) a launch serves (with their query heads); count 0: all.
struct KvHeadRange {
  int begin = 0;
  int count = 0;
};

}  // namespace tailserve::cuda

#undef TAILSERVE_HD
