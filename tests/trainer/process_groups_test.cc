// The process grid against Megatron-Core's rank order tp-cp-ep-dp-pp written out by hand, and the
// groups GroupsOf lists: each group's members share every coordinate but the ones it spans, are in
// group-rank order, and the groups of one kind partition the world.
#include "trainer/dist/process_groups.h"

#include <algorithm>
#include <map>
#include <set>

#include "gtest/gtest.h"

namespace leantron::trainer {
namespace {

TEST(ProcessGroupsTest, RankOrderIsTpCpEpDpPp) {
  const ParallelSizes s{.tp = 2, .cp = 3, .ep = 1, .dp = 2, .pp = 2};
  ASSERT_EQ(s.world(), 24);
  int rank = 0;
  for (int p = 0; p < s.pp; ++p)
    for (int d = 0; d < s.dp; ++d)
      for (int c = 0; c < s.cp; ++c)
        for (int t = 0; t < s.tp; ++t, ++rank) {
          const RankCoords got = CoordsOf(rank, s);
          EXPECT_EQ(got.tp, t);
          EXPECT_EQ(got.cp, c);
          EXPECT_EQ(got.ep, 0);
          EXPECT_EQ(got.dp, d);
          EXPECT_EQ(got.pp, p);
          EXPECT_EQ(WorldRankOf(got, s), rank);
        }
}

TEST(ProcessGroupsTest, GroupsSpanTheirDimensionsAndPartitionTheWorld) {
  const ParallelSizes s{.tp = 2, .cp = 2, .ep = 1, .dp = 3, .pp = 2};
  // Which coordinates each group may vary.
  const std::map<std::string, std::set<std::string>> spans = {{"world", {"tp", "cp", "dp", "pp"}},
                                                              {"tp", {"tp"}},
                                                              {"cp", {"cp"}},
                                                              {"dp", {"dp"}},
                                                              {"pp", {"pp"}},
                                                              {"mp", {"tp", "pp"}},
                                                              {"dpcp", {"dp", "cp"}},
                                                              {"emb", {"pp"}}};
  std::map<std::string, std::map<std::string, std::vector<int>>> by_kind;  // kind -> key -> members
  for (int r = 0; r < s.world(); ++r) {
    const RankCoords me = CoordsOf(r, s);
    for (const GroupSpec& g : GroupsOf(me, s)) {
      const std::string kind = g.key.substr(0, g.key.find('-'));
      ASSERT_TRUE(spans.count(kind)) << g.key;
      ASSERT_NE(std::find(g.members.begin(), g.members.end(), r), g.members.end()) << g.key;
      for (int m : g.members) {
        const RankCoords o = CoordsOf(m, s);
        const std::set<std::string>& v = spans.at(kind);
        if (!v.count("tp")) {
          EXPECT_EQ(o.tp, me.tp) << g.key;
        }
        if (!v.count("cp")) {
          EXPECT_EQ(o.cp, me.cp) << g.key;
        }
        if (!v.count("dp")) {
          EXPECT_EQ(o.dp, me.dp) << g.key;
        }
        if (!v.count("pp")) {
          EXPECT_EQ(o.pp, me.pp) << g.key;
        }
      }
      auto [it, fresh] = by_kind[kind].emplace(g.key, g.members);
      if (!fresh) {
        EXPECT_EQ(it->second, g.members) << "members of " << g.key << " differ by rank";
      }
    }
    // Every group (dp×cp since CP > 1) but the tied embedding's, which only the first and last
    // stage join.
    EXPECT_EQ(GroupsOf(me, s).size(), me.pp == 0 || me.pp == s.pp - 1 ? 8u : 7u);
  }
  const std::map<std::string, size_t> sizes = {{"world", 24}, {"tp", 2}, {"cp", 2},  {"dp", 3},
                                               {"pp", 2},     {"mp", 4}, {"emb", 2}, {"dpcp", 6}};
  for (const auto& [kind, groups] : by_kind) {
    std::multiset<int> covered;
    for (const auto& [key, members] : groups) {
      EXPECT_EQ(members.size(), sizes.at(kind)) << key;
      covered.insert(members.begin(), members.end());
      // Group-rank order follows the spanned coordinate(s) upwards.
      EXPECT_TRUE(std::is_sorted(members.begin(), members.end())) << key;
    }
    EXPECT_EQ(covered.size(), static_cast<size_t>(s.world())) << kind;
    EXPECT_EQ(std::set<int>(covered.begin(), covered.end()).size(), covered.size()) << kind;
  }
}

TEST(ProcessGroupsTest, DataParallelWithContextParallelIsMegatronsGroup) {
  // Megatron's data-parallel group with context parallel: same tp and pp, rank = cp + CP·dp.
  const ParallelSizes s{.tp = 2, .cp = 2, .ep = 1, .dp = 2, .pp = 2};
  const RankCoords me = CoordsOf(WorldRankOf({.tp = 1, .cp = 1, .dp = 0, .pp = 1}, s), s);
  for (const GroupSpec& g : GroupsOf(me, s)) {
    if (g.slot != &ProcessGroups::dp_cp) continue;
    std::vector<int> want;
    for (int d = 0; d < 2; ++d)
      for (int c = 0; c < 2; ++c)
        want.push_back(WorldRankOf({.tp = 1, .cp = c, .dp = d, .pp = 1}, s));
    EXPECT_EQ(g.members, want);
    return;
  }
  ADD_FAILURE() << "no dp_cp group";
}

TEST(ProcessGroupsTest, NoDataContextGroupWithoutContextParallelism) {
  const ParallelSizes s{.tp = 2, .cp = 1, .ep = 1, .dp = 2, .pp = 1};
  for (const GroupSpec& g : GroupsOf({}, s)) EXPECT_NE(g.slot, &ProcessGroups::dp_cp) << g.key;
  ProcessGroups one = SingleProcessGroups();
  EXPECT_EQ(&one.data_parallel_with_cp(), one.dp.get());
}

}  // namespace
}  // namespace leantron::trainer
