// CreateNcclProcessGroups: the device, the rendezvous, and every group of process_groups.h as an
// NcclCommunicator, with the pipeline neighbours' point-to-point channels connected up front.
#include <algorithm>
#include <set>

#include "trainer/dist/nccl_runtime.h"
#include "trainer/dist/rendezvous_signals.h"

namespace leantron::trainer {

using namespace nccl_detail;

absl::StatusOr<ProcessGroups> CreateNcclProcessGroups(const LaunchInfo& launch,
                                                      const ParallelSizes& sizes,
                                                      const DistOptions& options) {
  if (launch.world_size != sizes.world()) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", launch.world_size, " is not TP ",
                                                   sizes.tp, " x CP ", sizes.cp, " x PP ", sizes.pp,
                                                   " x DP ", sizes.dp));
  }
  if (launch.rank < 0 || launch.rank >= launch.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", launch.rank, " is outside world size ", launch.world_size));
  }
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", launch.rank, ": no CUDA device (",
                     e == cudaSuccess ? "none found" : cudaGetErrorString(e), ")"));
  }
  const int device = launch.local_rank % count;
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", launch.rank, ": cudaSetDevice(",
                                                      device, "): ", cudaGetErrorString(e)));
  }
  int stream_device = device;
  if (cudaStreamGetDevice(cuda::MainStream(), &stream_device) == cudaSuccess &&
      stream_device != device) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", launch.rank, ": the CUDA main stream belongs to device ",
                     stream_device, ", not this rank's device ", device,
                     " (call CreateNcclProcessGroups before any other CUDA work)"));
  }
  auto runtime = std::make_shared<NcclRuntime>(launch, device, options);

  ProcessGroups g;
  g.sizes = sizes;
  g.world_rank = launch.rank;
  g.coords = CoordsOf(launch.rank, sizes);
  // The same groups, in the same order, as the Gloo backend.
  struct Group {
    GroupSpec spec;
    int rank = -1;
    ncclComm_t comm = nullptr;
  };
  std::vector<Group> groups;
  for (GroupSpec& spec : GroupsOf(g.coords, sizes)) groups.push_back({std::move(spec)});
  for (Group& grp : groups) {
    const std::vector<int>& m = grp.spec.members;
    grp.rank = static_cast<int>(std::find(m.begin(), m.end(), launch.rank) - m.begin());
  }
  // Point-to-point channels made now: both directions between ring neighbours of the pipeline
  // group and of the context-parallel group (ring attention), edge by edge in group order (the
  // same order on every rank of the group).
  struct Channel {
    std::string group;  // the ring's group key
    int from, to;       // world ranks
  };
  std::vector<Channel> channel_pairs;
  for (auto slot : {&ProcessGroups::pp, &ProcessGroups::cp}) {
    const GroupSpec& ring = std::find_if(groups.begin(), groups.end(), [&](const Group& grp) {
                              return grp.spec.slot == slot;
                            })->spec;
    const int n = static_cast<int>(ring.members.size());
    std::set<std::pair<int, int>> seen;
    for (int e = 0; n > 1 && e < n; ++e) {
      const int a = ring.members[e], b = ring.members[(e + 1) % n];
      if (!seen.insert({std::min(a, b), std::max(a, b)}).second) continue;
      if (a != launch.rank && b != launch.rank) continue;
      channel_pairs.push_back({ring.key, std::min(a, b), std::max(a, b)});
      channel_pairs.push_back({ring.key, std::max(a, b), std::min(a, b)});
    }
  }

  if (sizes.world() > 1) {
    if (absl::Status s = runtime->Rendezvous(); !s.ok()) return s;
    // Ids first (this rank creates those of the groups it is the lowest rank of, and of its
    // outgoing channels), so no rank waits for an id while holding one back.
    for (const Group& grp : groups) {
      const std::vector<int>& m = grp.spec.members;
      if (m.size() > 1 && *std::min_element(m.begin(), m.end()) == launch.rank) {
        if (absl::Status s = runtime->PublishId(grp.spec.key); !s.ok()) return s;
      }
    }
    for (const Channel& c : channel_pairs) {
      if (c.from != launch.rank) continue;
      if (absl::Status s = runtime->PublishId(ChannelKey(c.group, c.from, c.to)); !s.ok()) return s;
    }
    std::vector<std::pair<ncclComm_t, std::string>> comms;
    for (Group& grp : groups) {
      if (grp.spec.members.size() == 1) continue;
      absl::StatusOr<ncclComm_t> comm =
          runtime->CreateComm(grp.spec.key, static_cast<int>(grp.spec.members.size()), grp.rank);
      if (!comm.ok()) return comm.status();
      grp.comm = *comm;
      comms.push_back({grp.comm, grp.spec.key});
    }
    std::vector<NcclChannel*> channels;
    for (const Channel& c : channel_pairs) {
      absl::StatusOr<NcclChannel*> ch = runtime->CreateChannel(c.group, c.from, c.to);
      if (!ch.ok()) return ch.status();
      channels.push_back(*ch);
    }
    runtime->WarmUp(comms, channels);
  }
  for (Group& grp : groups) {
    g.*grp.spec.slot = std::make_unique<NcclCommunicator>(runtime, grp.spec.key, grp.spec.members,
                                                          grp.rank, grp.comm);
  }
  runtime->SetInitialized();
  EndRendezvousPhase();
  return g;
}

}  // namespace leantron::trainer
