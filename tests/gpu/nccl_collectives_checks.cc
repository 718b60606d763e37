// Every collective of a group on awkward sizes against host-computed results (float through the
// Communicator interface, bf16 and f64 through the typed entry points on a stream of the test's
// own, host-memory pointers as the trainer passes them), and point-to-point rings with two tags in
// order.
#include "tests/gpu/nccl_harness.h"

namespace leantron::trainer::nccl_test {

// Every collective of one group.
void CheckCollectives(const std::string& name, Communicator* comm, const std::vector<int>& members,
                      int world_rank, cudaStream_t user, Checker& c) {
  NcclCommunicator* nc = AsNccl(comm);
  c.Expect(nc != nullptr, name + ": not an NcclCommunicator");
  if (nc == nullptr) return;
  const int size = comm->size(), me = comm->rank();
  c.Expect(size == static_cast<int>(members.size()), name + ": size");
  c.Expect(me >= 0 && me < size && members[me] == world_rank, name + ": rank");
  c.Expect(nc->members() == members, name + ": members");
  c.Expect((nc->comm() == nullptr) == (size == 1),
           name + ": comm() for size " + std::to_string(size));
  if (size != static_cast<int>(members.size()) || me < 0 || me >= size) return;

  for (size_t n : {size_t{1}, size_t{7}, size_t{4097}, size_t{(1u << 20) + 3}}) {
    const std::string tag = name + " n=" + std::to_string(n);
    std::vector<float> sum(n, 0.0f), max(n, -1e30f);
    for (int m : members) {
      for (size_t i = 0; i < n; ++i) {
        sum[i] += Value(m, i);
        max[i] = std::max(max[i], Value(m, i));
      }
    }
    DeviceBuffer<float> d(Fill(world_rank, n, Value));
    comm->AllReduceSum(d.get(), n);
    c.Equal(d.Download(n), sum, tag + " AllReduceSum");
    d.Upload(Fill(world_rank, n, Value));
    comm->AllReduceMax(d.get(), n);
    c.Equal(d.Download(n), max, tag + " AllReduceMax");
  }

  // Host memory, as the trainer passes flags and loss sums.
  {
    std::vector<float> flags = {static_cast<float>(world_rank), -static_cast<float>(world_rank)};
    comm->AllReduceMax(flags.data(), flags.size());
    const int hi = *std::max_element(members.begin(), members.end());
    const int lo = *std::min_element(members.begin(), members.end());
    c.Equal(flags, {static_cast<float>(hi), -static_cast<float>(lo)}, name + " host AllReduceMax");
    std::vector<double> sums = {world_rank + 0.5, 2.0 * world_rank, 1.0};
    comm->AllReduceSumDouble(sums.data(), sums.size());
    std::vector<double> want = {0, 0, static_cast<double>(size)};
    for (int m : members) {
      want[0] += m + 0.5;
      want[1] += 2.0 * m;
    }
    c.Equal(sums, want, name + " host AllReduceSumDouble");
    std::vector<float> hsum = Fill(world_rank, 5, Value);
    comm->AllReduceSum(hsum.data(), hsum.size());
    std::vector<float> hwant(5, 0.0f);
    for (int m : members)
      for (size_t i = 0; i < 5; ++i) hwant[i] += Value(m, i);
    c.Equal(hsum, hwant, name + " host AllReduceSum");
  }

  // AllGather: out of place, in == out, NCCL's in-place layout, host memory.
  {
    const size_t n = 1001;
    std::vector<float> want(size * n);
    for (int j = 0; j < size; ++j)
      for (size_t i = 0; i < n; ++i) want[j * n + i] = Value(members[j], i);
    const std::vector<float> mine = Fill(world_rank, n, Value);
    DeviceBuffer<float> in(mine), out(size * n);
    comm->AllGather(in.get(), out.get(), n);
    c.Equal(out.Download(size * n), want, name + " AllGather");
    std::vector<float> start(size * n, -99.0f);
    std::copy(mine.begin(), mine.end(), start.begin());
    out.Upload(start);
    comm->AllGather(out.get(), out.get(), n);
    c.Equal(out.Download(size * n), want, name + " AllGather in == out");
    std::fill(start.begin(), start.end(), -99.0f);
    std::copy(mine.begin(), mine.end(), start.begin() + me * n);
    out.Upload(start);
    comm->AllGather(out.get() + me * n, out.get(), n);
    c.Equal(out.Download(size * n), want, name + " AllGather in place");
    std::vector<float> host_out(size * n, -99.0f);
    comm->AllGather(mine.data(), host_out.data(), n);
    c.Equal(host_out, want, name + " host AllGather");
  }

  // ReduceScatter: out of place, out == in, NCCL's in-place layout.
  {
    const size_t n = 999;
    std::vector<float> want(n, 0.0f);
    for (int m : members)
      for (size_t i = 0; i < n; ++i) want[i] += Value(m, me * n + i);
    const std::vector<float> all = Fill(world_rank, size * n, Value);
    DeviceBuffer<float> in(all), out(n);
    comm->ReduceScatter(in.get(), out.get(), n);
    c.Equal(out.Download(n), want, name + " ReduceScatter");
    comm->ReduceScatter(in.get(), in.get(), n);
    c.Equal(in.Download(n), want, name + " ReduceScatter out == in");
    in.Upload(all);
    comm->ReduceScatter(in.get(), in.get() + me * n, n);
    std::vector<float> got = in.Download(size * n);
    c.Equal(std::vector<float>(got.begin() + me * n, got.begin() + (me + 1) * n), want,
            name + " ReduceScatter in place");
  }

  // AllToAll (context parallelism's head split): block p of every rank's input lands in block
  // `rank` of rank p's output; device and host memory.
  {
    const size_t n = 1001;
    std::vector<float> want(size * n);
    for (int p = 0; p < size; ++p)
      for (size_t i = 0; i < n; ++i) want[p * n + i] = Value(members[p], me * n + i);
    const std::vector<float> all = Fill(world_rank, size * n, Value);
    DeviceBuffer<float> in(all), out(size * n);
    comm->AllToAll(in.get(), out.get(), n);
    c.Equal(out.Download(size * n), want, name + " AllToAll");
    std::vector<float> host_out(size * n);
    comm->AllToAll(all.data(), host_out.data(), n);
    c.Equal(host_out, want, name + " host AllToAll");
  }

  // Broadcast from the last and the first rank.
  for (int root : {size - 1, 0}) {
    const size_t n = 3001;
    DeviceBuffer<float> d(Fill(world_rank, n, Value));
    comm->Broadcast(d.get(), n, root);
    c.Equal(d.Download(n), Fill(members[root], n, Value),
            name + " Broadcast root " + std::to_string(root));
  }

  // Typed entry points on the test's own stream: bf16 and f64.
  {
    const size_t n = 5003;
    std::vector<float> want(n, 0.0f), want_max(n, -1e30f);
    for (int m : members) {
      for (size_t i = 0; i < n; ++i) {
        want[i] += SmallValue(m, i);
        want_max[i] = std::max(want_max[i], SmallValue(m, i));
      }
    }
    const std::vector<uint16_t> mine = ToBf16(Fill(world_rank, n, SmallValue));
    DeviceBuffer<uint16_t> d(mine);
    nc->AllReduce(d.get(), n, CommType::kBF16, user);
    c.Equal(FromBf16(d.Download(n, user)), want, name + " bf16 AllReduce");
    d.Upload(mine, user);
    nc->AllReduce(d.get(), n, CommType::kBF16, user, ReduceOp::kMax);
    c.Equal(FromBf16(d.Download(n, user)), want_max, name + " bf16 AllReduce max");

    const size_t g = 777;
    std::vector<float> gathered(size * g);
    for (int j = 0; j < size; ++j)
      for (size_t i = 0; i < g; ++i) gathered[j * g + i] = SmallValue(members[j], i);
    DeviceBuffer<uint16_t> gin(ToBf16(Fill(world_rank, g, SmallValue))), gout(size * g);
    nc->AllGather(gin.get(), gout.get(), g, CommType::kBF16, user);
    c.Equal(FromBf16(gout.Download(size * g, user)), gathered, name + " bf16 AllGather");

    const size_t r = 333;
    std::vector<float> scattered(r, 0.0f);
    for (int m : members)
      for (size_t i = 0; i < r; ++i) scattered[i] += SmallValue(m, me * r + i);
    DeviceBuffer<uint16_t> rin(ToBf16(Fill(world_rank, size * r, SmallValue))), rout(r);
    nc->ReduceScatter(rin.get(), rout.get(), r, CommType::kBF16, user);
    c.Equal(FromBf16(rout.Download(r, user)), scattered, name + " bf16 ReduceScatter");

    const size_t f = 17;
    std::vector<double> dv(f), dwant(f, 0.0);
    for (size_t i = 0; i < f; ++i) dv[i] = world_rank * 0.25 + static_cast<double>(i);
    for (int m : members)
      for (size_t i = 0; i < f; ++i) dwant[i] += m * 0.25 + static_cast<double>(i);
    DeviceBuffer<double> dd(dv);
    nc->AllReduce(dd.get(), f, CommType::kF64, user);
    c.Equal(dd.Download(f, user), dwant, name + " f64 AllReduce");
  }
  comm->Barrier();
}

// A ring: every rank sends three messages (tags 0, 1, 0) and a host-memory one (tag 1) to the
// next rank before receiving the previous rank's in the same order. The send buffer is rewritten
// right after each SendAsync: the receiver must still see what was sent.
void CheckRing(const std::string& name, Communicator* comm, int world_rank, cudaStream_t user,
               Checker& c) {
  NcclCommunicator* nc = AsNccl(comm);
  const int size = comm->size(), me = comm->rank();
  const int next = (me + 1) % size, prev = (me + size - 1) % size;
  const int from = nc->members()[prev];
  const size_t sizes[3] = {(1u << 20) + 5, 17, 4099};  // 4 MiB: beyond NCCL's staging buffers
  const uint32_t tags[3] = {0, 1, 0};
  DeviceBuffer<float> send(sizes[0]);
  for (int k = 0; k < 3; ++k) {
    std::vector<float> msg(sizes[k]);
    for (size_t i = 0; i < sizes[k]; ++i) msg[i] = Message(world_rank, k, i);
    send.Upload(msg);
    comm->SendAsync(send.get(), sizes[k], next, tags[k]);
    LT_CUDA_CHECK(cudaMemsetAsync(send.get(), 0, sizes[0] * sizeof(float), MainStream()));
  }
  std::vector<float> host_msg(5);
  for (size_t i = 0; i < host_msg.size(); ++i) host_msg[i] = Message(world_rank, 3, i);
  comm->SendAsync(host_msg.data(), host_msg.size(), next, 1);
  std::fill(host_msg.begin(), host_msg.end(), -1.0f);

  for (int k = 0; k < 3; ++k) {
    DeviceBuffer<float> recv(sizes[k]);
    comm->Recv(recv.get(), sizes[k], prev, tags[k]);
    std::vector<float> want(sizes[k]);
    for (size_t i = 0; i < sizes[k]; ++i) want[i] = Message(from, k, i);
    c.Equal(recv.Download(sizes[k]), want, name + " ring message " + std::to_string(k));
  }
  std::vector<float> host_recv(5, -7.0f), host_want(5);
  comm->Recv(host_recv.data(), host_recv.size(), prev, 1);
  for (size_t i = 0; i < host_want.size(); ++i) host_want[i] = Message(from, 3, i);
  c.Equal(host_recv, host_want, name + " ring host message");
  comm->WaitSends();

  // Typed: bf16 on the test's stream.
  const size_t n = 1234;
  std::vector<float> mine(n), want(n);
  for (size_t i = 0; i < n; ++i) {
    mine[i] = SmallValue(world_rank, i);
    want[i] = SmallValue(from, i);
  }
  DeviceBuffer<uint16_t> out(ToBf16(mine)), in(n);
  nc->Send(out.get(), n, CommType::kBF16, next, user);
  nc->RecvRaw(in.get(), n, CommType::kBF16, prev, user);
  nc->WaitSends(user);
  c.Equal(FromBf16(in.Download(n, user)), want, name + " ring bf16");
}

}  // namespace leantron::trainer::nccl_test
