#pragma once
// Where each session's last request went, for session affinity (router.session_affinity): at most
// `capacity` sessions, the least recently dispatched forgotten first. Owned by the core thread.
#include <list>
#include <optional>
#include <string>
#include <unordered_map>

namespace tailserve {

class SessionMap {
 public:
  explicit SessionMap(size_t capacity) : capacity_(capacity) {}

  std::optional<size_t> Worker(const std::string& session) const {
    auto it = at_.find(session);
    if (it == at_.end()) return std::nullopt;
    return it->second.worker;
  }
  void Record(const std::string& session, size_t worker) {
    auto it = at_.find(session);
    if (it != at_.end()) {
      lru_.splice(lru_.end(), lru_, it->second.pos);
      it->second.worker = worker;
      return;
    }
    if (capacity_ == 0) return;
    if (at_.size() >= capacity_) {
      at_.erase(lru_.front());
      lru_.pop_front();
    }
    lru_.push_back(session);
    at_.emplace(session, Entry{worker, std::prev(lru_.end())});
  }
  size_t size() const { return at_.size(); }

 private:
  struct Entry {
    size_t worker;
    std::list<std::string>::iterator pos;
  };
  size_t capacity_;
  std::list<std::string> lru_;  // least recently dispatched at the front
  std::unordered_map<std::string, Entry> at_;
};

}  // namespace tailserve
