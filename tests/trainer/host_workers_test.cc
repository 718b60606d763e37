// HostWorkers: every index of every loop runs exactly once, whatever the piece size and however
// many loops follow each other; with one thread the caller runs them all.
#include "trainer/core/host_workers.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace leantron::trainer {
namespace {

TEST(HostWorkersTest, EveryIndexOnceAcrossManyLoops) {
  HostWorkers workers(4);
  EXPECT_EQ(workers.threads(), 4);
  for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{65537}}) {
    for (size_t grain : {size_t{1}, size_t{3}, size_t{64}, size_t{100000}}) {
      std::vector<std::atomic<int>> hits(n);
      for (int loop = 0; loop < 5; ++loop) {
        workers.ParallelFor(n, grain, [&](size_t b, size_t e) {
          ASSERT_LE(e - b, grain);
          for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
      }
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 5) << n << " " << grain << " " << i;
    }
  }
}

TEST(HostWorkersTest, OneThreadIsTheCaller) {
  HostWorkers alone(1);
  EXPECT_EQ(alone.threads(), 1);
  size_t sum = 0;
  std::thread::id ran;
  alone.ParallelFor(100, 7, [&](size_t b, size_t e) {
    ran = std::this_thread::get_id();
    for (size_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum, 4950u);
  EXPECT_EQ(ran, std::this_thread::get_id());
}

}  // namespace
}  // namespace leantron::trainer
