#include "worker/kv/kv_event_log.h"

#include <random>

namespace tailserve {

KvEventLog::KvEventLog(uint64_t salt, int block_size, size_t capacity)
    : salt_(salt), block_size_(block_size), epoch_(std::random_device{}() * 0x9E3779B97F4A7C15ull | 1), capacity_(capacity) {}

void KvEventLog::Stored(uint64_t hash) {
  std::lock_guard lock(mu_);
  cached_.insert(hash);
  events_.emplace_back(hash, true);
  ++next_;
  if (events_.size() > capacity_) events_.pop_front();
}

void KvEventLog::Removed(uint64_t hash) {
  std::lock_guard lock(mu_);
  cached_.erase(hash);
  events_.emplace_back(hash, false);
  ++next_;
  if (events_.size() > capacity_) events_.pop_front();
}

size_t KvEventLog::cached() const {
  std::lock_guard lock(mu_);
  return cached_.size();
}

KvEventLog::Changes KvEventLog::Since(uint64_t cursor, size_t max_changes) const {
  std::lock_guard lock(mu_);
  Changes out;
  out.next = next_;
  const uint64_t oldest = next_ - events_.size();
  if (cursor != 0 && cursor >= oldest && cursor <= next_ && next_ - cursor <= max_changes) {
    // Each hash's last event in the window decides, so the two lists apply in either order.
    std::unordered_map<uint64_t, bool> last;
    for (size_t i = static_cast<size_t>(cursor - oldest); i < events_.size(); ++i) last[events_[i].first] = events_[i].second;
    for (const auto& [hash, stored] : last) (stored ? out.stored : out.removed).push_back(hash);
    return out;
  }
  out.snapshot = true;
  out.stored.assign(cached_.begin(), cached_.end());
  return out;
}

}  // namespace tailserve
