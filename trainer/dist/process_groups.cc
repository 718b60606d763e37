#include "trainer/dist/process_groups.h"

#include "absl/strings/str_cat.h"

namespace leantron::trainer {

RankCoords CoordsOf(int world_rank, const ParallelSizes& s) {
  RankCoords c;
  int r = world_rank;
  c.tp = r % s.tp;
  r /= s.tp;
  c.cp = r % s.cp;
  r /= s.cp;
  c.ep = r % s.ep;
  r /= s.ep;
  c.dp = r % s.dp;
  c.pp = r / s.dp;
  return c;
}

int WorldRankOf(const RankCoords& c, const ParallelSizes& s) {
  return c.tp + s.tp * (c.cp + s.cp * (c.ep + s.ep * (c.dp + s.dp * c.pp)));
}

std::vector<GroupSpec> GroupsOf(const RankCoords& c, const ParallelSizes& s) {
  // Members varying one coordinate (or two, outer first), the others as at `c`.
  auto along = [&](int RankCoords::*coord, int n) {
    std::vector<int> m;
    for (int i = 0; i < n; ++i) {
      RankCoords o = c;
      o.*coord = i;
      m.push_back(WorldRankOf(o, s));
    }
    return m;
  };
  std::vector<GroupSpec> g;
  std::vector<int> world;
  for (int r = 0; r < s.world(); ++r) world.push_back(r);
  g.push_back({"world", world, &ProcessGroups::world});
  g.push_back({absl::StrCat("tp-", c.cp, "-", c.ep, "-", c.dp, "-", c.pp),
               along(&RankCoords::tp, s.tp), &ProcessGroups::tp});
  g.push_back({absl::StrCat("cp-", c.tp, "-", c.ep, "-", c.dp, "-", c.pp),
               along(&RankCoords::cp, s.cp), &ProcessGroups::cp});
  g.push_back({absl::StrCat("dp-", c.tp, "-", c.cp, "-", c.ep, "-", c.pp),
               along(&RankCoords::dp, s.dp), &ProcessGroups::dp});
  const std::vector<int> pp = along(&RankCoords::pp, s.pp);
  g.push_back({absl::StrCat("pp-", c.tp, "-", c.cp, "-", c.ep, "-", c.dp), pp, &ProcessGroups::pp});
  std::vector<int> model;
  for (int p = 0; p < s.pp; ++p) {
    for (int t = 0; t < s.tp; ++t) {
      RankCoords o = c;
      o.pp = p;
      o.tp = t;
      model.push_back(WorldRankOf(o, s));
    }
  }
  g.push_back({absl::StrCat("mp-", c.cp, "-", c.ep, "-", c.dp), model, &ProcessGroups::model});
  if (s.cp > 1) {
    std::vector<int> dp_cp;
    for (int d = 0; d < s.dp; ++d) {
      for (int k = 0; k < s.cp; ++k) {
        RankCoords o = c;
        o.dp = d;
        o.cp = k;
        dp_cp.push_back(WorldRankOf(o, s));
      }
    }
    g.push_back({absl::StrCat("dpcp-", c.tp, "-", c.ep, "-", c.pp), dp_cp, &ProcessGroups::dp_cp});
  }
  if (s.pp > 1 && (c.pp == 0 || c.pp == s.pp - 1)) {
    g.push_back({absl::StrCat("emb-", c.tp, "-", c.cp, "-", c.ep, "-", c.dp),
                 {pp.front(), pp.back()},
                 &ProcessGroups::embedding});
  }
  return g;
}

ProcessGroups SingleProcessGroups() {
  ProcessGroups g;
  for (const GroupSpec& spec : GroupsOf({}, {})) g.*spec.slot = MakeSelfCommunicator();
  return g;
}

}  // namespace leantron::trainer
