// The inductor's scratch plan (scratch_plan.h) on its own, without LibTorch: slots alive at the same
// time never share a byte, every place is aligned, the arena is no larger than one place per slot
// and no smaller than the most bytes alive at once, and a step touching a buffer with no name
// turns planning off. Whole groups run with their scratch poisoned after each last use are the
// InductorParity.*PoisonedScratch tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "scratch_plan.h"

using kiln::inductor::plan_scratch;
using kiln::inductor::ScratchPlan;

namespace {

constexpr size_t kFirst = 5;  // buffers 0..4: inputs and outputs

int64_t rounded(int64_t bytes, int64_t align, int64_t slack) {
  return (std::max<int64_t>(bytes, 1) + slack + align - 1) / align * align;
}

// Each slot's first and last step, -1 when no step touches it.
void lifetimes(size_t n, const std::vector<std::set<int>>& touches, std::vector<int>* first, std::vector<int>* last) {
  first->assign(n, -1);
  last->assign(n, -1);
  for (size_t t = 0; t < touches.size(); ++t)
    for (int b : touches[t]) {
      if (b < static_cast<int>(kFirst) || b >= static_cast<int>(kFirst + n)) continue;
      const size_t s = static_cast<size_t>(b) - kFirst;
      if ((*first)[s] < 0) (*first)[s] = static_cast<int>(t);
      (*last)[s] = static_cast<int>(t);
    }
}

void expect_sound(const std::vector<int64_t>& bytes, const std::vector<std::set<int>>& touches, const ScratchPlan& p,
                  int64_t align, int64_t slack) {
  const size_t n = bytes.size();
  std::vector<int> first, last;
  lifetimes(n, touches, &first, &last);
  ASSERT_TRUE(p.planned);
  ASSERT_EQ(p.offset.size(), n);
  int64_t sum = 0;
  for (size_t s = 0; s < n; ++s) {
    EXPECT_EQ(p.offset[s] % align, 0) << "slot " << s;
    sum += rounded(bytes[s], align, slack);
    if (first[s] >= 0) {
      EXPECT_LE(p.offset[s] + rounded(bytes[s], align, slack), p.bytes) << "slot " << s;
    }
  }
  EXPECT_EQ(p.unplanned, sum);
  EXPECT_LE(p.bytes, sum);
  for (size_t a = 0; a < n; ++a)
    for (size_t b = a + 1; b < n; ++b) {
      if (first[a] < 0 || first[b] < 0 || last[a] < first[b] || last[b] < first[a]) continue;
      const bool apart = p.offset[a] + rounded(bytes[a], align, slack) <= p.offset[b] ||
                         p.offset[b] + rounded(bytes[b], align, slack) <= p.offset[a];
      EXPECT_TRUE(apart) << "slots " << a << " (steps " << first[a] << ".." << last[a] << ") and " << b << " (steps "
                         << first[b] << ".." << last[b] << ") are alive together and share bytes";
    }
  // No smaller than what is alive at once at any step.
  for (size_t t = 0; t < touches.size(); ++t) {
    int64_t alive = 0;
    for (size_t s = 0; s < n; ++s)
      if (first[s] >= 0 && first[s] <= static_cast<int>(t) && static_cast<int>(t) <= last[s])
        alive += rounded(bytes[s], align, slack);
    EXPECT_GE(p.bytes, alive) << "step " << t;
  }
  // Each slot that lives is poisoned after its last step, once.
  std::vector<int> poisoned(n, 0);
  for (size_t t = 0; t < p.last_use.size(); ++t)
    for (int s : p.last_use[t]) {
      EXPECT_EQ(last[static_cast<size_t>(s)], static_cast<int>(t)) << "slot " << s;
      ++poisoned[static_cast<size_t>(s)];
    }
  for (size_t s = 0; s < n; ++s) EXPECT_EQ(poisoned[s], first[s] >= 0 ? 1 : 0) << "slot " << s;
}

TEST(ScratchPlan, AChainOfValuesNeedsTwoPlacesNotOnePerValue) {
  // Step t reads slot t - 1 and writes slot t: at most two alive at once.
  const std::vector<int64_t> bytes(10, 4000);
  std::vector<std::set<int>> touches;
  for (int t = 0; t < 10; ++t) {
    std::set<int> s{static_cast<int>(kFirst) + t};
    if (t > 0) s.insert(static_cast<int>(kFirst) + t - 1);
    s.insert(0);  // an input, never scratch
    touches.push_back(s);
  }
  const ScratchPlan p = plan_scratch(bytes, kFirst, touches, 64, 64);
  expect_sound(bytes, touches, p, 64, 64);
  EXPECT_EQ(p.bytes, 2 * rounded(4000, 64, 64));
  EXPECT_EQ(p.unplanned, 10 * rounded(4000, 64, 64));
}

TEST(ScratchPlan, ASlotAliveAcrossTheGroupKeepsItsBytesFromEveryOther) {
  // Slot 0 is written first and read last; slots 1..4 live one step each in between.
  const std::vector<int64_t> bytes{1 << 20, 1000, 1000, 1000, 1000};
  std::vector<std::set<int>> touches{{5}, {6}, {7}, {8}, {9}, {5, 3}};
  const ScratchPlan p = plan_scratch(bytes, kFirst, touches, 256, 0);
  expect_sound(bytes, touches, p, 256, 0);
  EXPECT_EQ(p.bytes, rounded(1 << 20, 256, 0) + rounded(1000, 256, 0));
}

TEST(ScratchPlan, RandomLifetimesNeverShareBytesWhileAlive) {
  std::mt19937 rng(20261207);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = 1 + rng() % 40, steps = 1 + rng() % 30;
    std::vector<int64_t> bytes(n);
    for (auto& b : bytes) b = static_cast<int64_t>(rng() % 3 == 0 ? rng() % 100 : rng() % 200000);
    std::vector<std::set<int>> touches(steps);
    for (auto& t : touches) {
      const size_t k = rng() % 5;
      for (size_t i = 0; i < k; ++i) t.insert(static_cast<int>(rng() % (kFirst + n + 2)));  // some past the slots
    }
    const int64_t align = trial % 2 ? 64 : 256, slack = trial % 2 ? 64 : 0;
    const ScratchPlan p = plan_scratch(bytes, kFirst, touches, align, slack);
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_sound(bytes, touches, p, align, slack);
    if (HasFailure()) return;
  }
}

TEST(ScratchPlan, ABufferWithNoNameGivesEverySlotItsOwnBytes) {
  const std::vector<int64_t> bytes{100, 200, 300};
  const std::vector<std::set<int>> touches{{5}, {6, -1}, {7}};
  const ScratchPlan p = plan_scratch(bytes, kFirst, touches, 64, 0);
  EXPECT_FALSE(p.planned);
  EXPECT_EQ(p.bytes, p.unplanned);
  EXPECT_EQ(p.offset, (std::vector<int64_t>{0, 128, 384}));
  for (const auto& l : p.last_use) EXPECT_TRUE(l.empty()) << "nothing is poisoned without a plan";
}

TEST(ScratchPlan, NoSlotsNoArena) {
  const ScratchPlan p = plan_scratch({}, kFirst, {{0, 1}, {2}}, 64, 64);
  EXPECT_EQ(p.bytes, 0);
  EXPECT_TRUE(p.offset.empty());
}

}  // namespace
