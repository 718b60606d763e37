// The copy-engine exchange between the ranks of a group (PeerExchange): a ring of rounds that
// reuse its two inbox slots, bursts of sends ahead of the receives, a receive that adds the block
// where it arrived.
#include "tests/gpu/nccl_harness.h"

namespace leantron::trainer::nccl_test {

// PeerExchange around the group's ring: `rounds` messages of awkward sizes up to the inbox's,
// sent in bursts of `burst` before they are received (the third send of a burst waits on the
// device for the next rank to free a slot, not on the host), each checked against the previous
// rank's; the last burst's blocks are received by adding them onto a buffer of ones.
void CheckPeerExchange(const std::string& name, Communicator* comm, int world_rank, Checker& c) {
  NcclCommunicator* nc = AsNccl(comm);
  const size_t max_floats = (size_t{1} << 20) + 3;
  std::unique_ptr<cuda::PeerExchange> x = cuda::PeerExchange::Create(nc, max_floats * 4);
  c.Expect(x != nullptr, name + " PeerExchange::Create (one host)");
  if (x == nullptr) return;
  const int size = comm->size(), me = comm->rank();
  const int from = nc->members()[(me + size - 1) % size];
  const size_t sizes[] = {max_floats, 1, 4099, 77777, max_floats - 1, 256};
  const int rounds = 6;
  for (int burst : {1, 3}) {
    for (int k0 = 0; k0 < rounds; k0 += burst) {
      const int k1 = std::min(rounds, k0 + burst);
      std::vector<std::unique_ptr<DeviceBuffer<float>>> out, in;
      for (int k = k0; k < k1; ++k) {
        std::vector<float> msg(sizes[k]);
        for (size_t i = 0; i < msg.size(); ++i) msg[i] = Message(world_rank, k + 10 * burst, i);
        out.push_back(std::make_unique<DeviceBuffer<float>>(msg));
        x->Send(out.back()->get(), sizes[k] * 4, MainStream());
      }
      const bool add = burst == 3 && k1 == rounds;
      for (int k = k0; k < k1; ++k) {
        in.push_back(std::make_unique<DeviceBuffer<float>>(
            std::vector<float>(sizes[k], add ? 1.0f : -1.0f)));
        float* dst = in.back()->get();
        if (add) {
          x->Receive(
              [&](const void* inbox) {
                cuda::AddInPlace(dst, static_cast<const float*>(inbox), sizes[k], MainStream());
              },
              MainStream());
        } else {
          x->Receive(dst, sizes[k] * 4, MainStream());
        }
      }
      x->WaitSent(MainStream());
      for (int k = k0; k < k1; ++k) {
        std::vector<float> want(sizes[k]);
        for (size_t i = 0; i < want.size(); ++i)
          want[i] = Message(from, k + 10 * burst, i) + (add ? 1.0f : 0.0f);
        c.Equal(in[k - k0]->Download(sizes[k]), want,
                name + " exchange burst " + std::to_string(burst) + " round " + std::to_string(k));
      }
    }
  }
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
}

}  // namespace leantron::trainer::nccl_test
