#include "common/heap_trimmer.h"

#include <malloc.h>

namespace tailserve {

HeapTrimmer::HeapTrimmer(std::chrono::milliseconds period) {
  thread_ = std::thread([this, period] {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, period, [this] { return stop_; })) malloc_trim(0);
  });
}

HeapTrimmer::~HeapTrimmer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace tailserve
