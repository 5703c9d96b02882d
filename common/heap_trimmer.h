#pragma once
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace tailserve {

// Returns the heap's free memory to the OS every `period` (malloc_trim): glibc keeps what a burst
// freed (10,000 idle connections, a slow client's queue) in its arenas, so RSS stayed at the
// burst's peak after it ended.
class HeapTrimmer {
 public:
  explicit HeapTrimmer(std::chrono::milliseconds period = std::chrono::seconds(10));
  ~HeapTrimmer();
  HeapTrimmer(const HeapTrimmer&) = delete;
  HeapTrimmer& operator=(const HeapTrimmer&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tailserve
