#include "common/command_queue.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace tailserve {
namespace {

TEST(CommandQueueTest, AfterCloseCommandsRunOnThePostingThreadInOrder) {
  CommandQueue q;
  std::vector<int> ran;
  q.Post([&] { ran.push_back(1); });
  q.Post([&] { ran.push_back(2); });
  EXPECT_EQ(q.TryTakeAll().size(), 2u);  // taken, not run: the owner runs them
  q.Post([&] { ran.push_back(3); });
  q.Close();  // the owner is gone: what is queued runs now
  EXPECT_EQ(ran, (std::vector<int>{3}));
  const std::thread::id here = std::this_thread::get_id();
  std::thread::id ran_on;
  q.Post([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, here);
  // Posted from many threads after Close: each runs once, never two at a time.
  int n = 0;
  std::vector<std::thread> posters;
  for (int t = 0; t < 8; ++t) {
    posters.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) q.Post([&] { ++n; });
    });
  }
  for (auto& t : posters) t.join();
  EXPECT_EQ(n, 8000);
  EXPECT_TRUE(q.TryTakeAll().empty());
  // A command that posts (a fake worker answering a cancel at once does) runs the new one nested.
  bool inner = false;
  q.Post([&] { q.Post([&] { inner = true; }); });
  EXPECT_TRUE(inner);
}

}  // namespace
}  // namespace tailserve
