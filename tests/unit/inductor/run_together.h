// Runs body(0) ... body(n - 1) on n threads that start together (each waits until all have
// started), and returns when all have ended. For the tests that make threads race on purpose.
#pragma once

#include <atomic>
#include <thread>
#include <vector>

namespace kiln::test {

template <typename Body>
void run_together(int n, Body body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t)
    threads.emplace_back([&, t] {
      ++ready;
      while (ready.load() < n) std::this_thread::yield();
      body(t);
    });
  for (auto& th : threads) th.join();
}

}  // namespace kiln::test
