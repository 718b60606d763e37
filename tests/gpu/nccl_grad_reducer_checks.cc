// The data-parallel gradient reducer of the bf16 model (GradReducer) driven by model events
// between two ranks, bit for bit against sums made on the host.
#include "tests/gpu/nccl_harness.h"
#include "trainer/core/grad_buffers.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer::nccl_test {

// The data-parallel gradient reduction of the bf16 model (GradReducer) between two ranks: by copy
// engine and by NCCL, all-reduce and reduce-scatter (distributed optimizer), in fp32 and in bf16
// (--grad-reduce-in-bf16), each with the buckets started as planned from the step before (two
// steps) and held back until layer 0 is done, against sums made here: every element, or with
// reduce-scatter this rank's part of each bucket, bit for bit. The first bucket spans several
// copy-engine pieces.
void CheckGradReducer(const std::string& name, Communicator* comm, Checker& c) {
  NcclCommunicator* nc = AsNccl(comm);
  const int me = comm->rank();
  const size_t big = (size_t{32} << 20) + 12347, mid = 4099, small = 77777, n = big + mid + small;
  const std::vector<DpBucket> buckets = {
      {0, big, 1, 1}, {big, mid, 0, 0}, {big + mid, small, -1, -1}};
  auto value = [](int rank, size_t i) {
    return std::ldexp(static_cast<float>((i * 2654435761u + rank * 7919u) % 1000003u), -12) -
           100.0f;
  };
  auto bf = [](float x) { return ckpt::BFloat16ToFloat(ckpt::FloatToBFloat16(x)); };
  std::vector<float> mine(n), fp32_sum(n), bf16_sum(n);
  for (size_t i = 0; i < n; ++i) {
    mine[i] = value(me, i);
    const float theirs = value(1 - me, i);
    fp32_sum[i] = mine[i] + theirs;
    bf16_sum[i] = bf(bf(mine[i]) + bf(theirs));
  }
  DeviceBuffer<float> grad(n), data(n);
  DeviceBuffer<cuda::bf16> low(n);
  int checked = 0;
  for (bool copy_engine : {true, false}) {
    for (bool distributed : {false, true}) {
      for (bool in_bf16 : {false, true}) {
        for (bool held_back : {false, true}) {
          const std::string what = name + (copy_engine ? " copy engine" : " NCCL") +
                                   (distributed ? " reduce-scatter" : " all-reduce") +
                                   (in_bf16 ? " in bf16" : " in fp32") +
                                   (held_back ? " held back" : " planned");
          cuda::GradReducer::Options o;
          o.overlap_grad_reduce = true;
          o.distributed = distributed;
          o.reduce_in_bf16 = in_bf16;
          o.copy_engine = copy_engine;
          if (held_back) o.start_layer = 0;
          cuda::GradReducer r(nc, grad.get(), data.get(), low.get(), buckets, o);
          c.Expect(r.transport() == std::string(copy_engine ? "copy engine" : "NCCL"),
                   what + ": reduced by " + r.transport());
          for (int step = 0; step < (held_back ? 1 : 2); ++step) {
            grad.Upload(mine);
            // One micro-batch: its backward's layers, then the embeddings' bucket at its end. The
            // model announces each step first (that resets the count of its backwards).
            r.StepBegins();
            r.BackwardBegins();
            r.LayerBackwardDone(1);
            r.LayerBackwardDone(0);
            r.BackwardDone();
            LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
            double comm_ms = 0, exposed_ms = 0;
            r.LastStep(&comm_ms, &exposed_ms);  // plans the next step's start
            // Planned from timings: any layer of the two, or none (DpReduceStartLayer's own test
            // checks the rule); held back: the fixed layer.
            c.Expect(
                held_back ? r.start_layer() == 0 : r.start_layer() >= -1 && r.start_layer() <= 1,
                what + ": start layer " + std::to_string(r.start_layer()));
            const std::vector<float> got = grad.Download(n);
            const std::vector<float>& sum = in_bf16 ? bf16_sum : fp32_sum;
            std::vector<float> g, w;
            for (const DpBucket& b : buckets) {
              const auto [first, last] =
                  distributed ? b.Part(me, 2)
                              : std::pair<size_t, size_t>{b.offset, b.offset + b.numel};
              g.insert(g.end(), got.begin() + first, got.begin() + last);
              w.insert(w.end(), sum.begin() + first, sum.begin() + last);
            }
            c.Expect(g.size() > n / 3, what + " checks its part");
            c.Equal(g, w, what + " step " + std::to_string(step));
          }
          ++checked;
        }
      }
    }
  }
  std::printf("rank %d: GradReducer: %d configurations checked\n", comm->rank(), checked);
  std::fflush(stdout);
}

// Sharded gradients (GradBuffers, --data-parallel-sharding-strategy optim_grads) between two
// ranks, by copy engine and by NCCL, over two steps of two micro-batches: three layer buckets
// (one of two layers) taking turns in two slots, the backward adding into a slot only after the
// reducer has zeroed it (and waited for its last bucket), every micro-batch's layer buckets
// reduce-scattered into this rank's parts' sums, the embeddings' whole buffer reduced once at
// the end of the step; bit for bit against sums made here.
void CheckShardedGradReducer(const std::string& name, Communicator* comm, Checker& c) {
  NcclCommunicator* nc = AsNccl(comm);
  const int me = comm->rank();
  const size_t a = (size_t{16} << 20) + 4321, b = 70001, d = 999, e = 55555;
  const size_t n = a + b + d + e;
  const std::vector<DpBucket> buckets = {
      {0, a, 2, 3}, {a, b, 1, 1}, {a + b, d, 0, 0}, {a + b + d, e, -1, -1}};
  auto value = [](int rank, int micro, size_t i) {
    return std::ldexp(
               static_cast<float>((i * 2654435761u + rank * 7919u + micro * 104729u) % 1000003u),
               -12) -
           100.0f;
  };
  absl::StatusOr<std::unique_ptr<Ops>> ops = CreateOps("cuda");
  c.Expect(ops.ok(), "cuda ops");
  if (!ops.ok()) return;
  // The backward adds into what is there: read, add, write back, in stream order.
  auto add = [](float* at, const std::vector<float>& v) {
    std::vector<float> h(v.size());
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
    LT_CUDA_CHECK(cudaMemcpy(h.data(), at, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < h.size(); ++i) h[i] += v[i];
    LT_CUDA_CHECK(cudaMemcpy(at, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  };
  int checked = 0;
  for (bool copy_engine : {true, false}) {
    const std::string what = name + " sharded gradients" + (copy_engine ? " copy engine" : " NCCL");
    GradBuffers grads(ops->get(), n, {buckets}, me, 2);
    cuda::GradReducer::Options o;
    o.overlap_grad_reduce = true;
    o.distributed = true;
    o.copy_engine = copy_engine;
    o.num_micro_batches = 2;
    o.sharded_grads = &grads;
    cuda::GradReducer r(nc, nullptr, nullptr, nullptr, buckets, o);
    for (int step = 0; step < 2; ++step) {
      grads.Zero();  // the optimizer's ZeroGrad
      r.StepBegins();
      for (int m = 0; m < 2; ++m) {
        const int micro = 2 * step + m;
        r.BackwardBegins();
        for (int layer = 3; layer >= 0; --layer) {
          for (const DpBucket& bk : buckets) {
            if (bk.last_layer != layer) continue;  // written from its top layer on
            std::vector<float> v(bk.numel);
            for (size_t i = 0; i < bk.numel; ++i) v[i] = value(me, micro, bk.offset + i);
            add(grads.At(bk.offset), v);
          }
          r.LayerBackwardDone(layer);
        }
        std::vector<float> v(e);
        for (size_t i = 0; i < e; ++i) v[i] = value(me, micro, a + b + d + i);
        add(grads.At(a + b + d), v);
        r.BackwardDone();
      }
      LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
      for (const DpBucket& bk : buckets) {
        const auto [first, last] = bk.Part(me, 2);
        std::vector<float> got(last - first), want(last - first);
        LT_CUDA_CHECK(cudaMemcpy(got.data(), grads.Reduced(first), got.size() * sizeof(float),
                                 cudaMemcpyDeviceToHost));
        for (size_t i = first; i < last; ++i) {
          const int m0 = 2 * step, m1 = m0 + 1;
          if (bk.first_layer < 0) {  // summed over the micro-batches here, then over the ranks
            want[i - first] = (value(me, m0, i) + value(me, m1, i)) +
                              (value(1 - me, m0, i) + value(1 - me, m1, i));
          } else {
            want[i - first] = (0.0f + (value(me, m0, i) + value(1 - me, m0, i))) +
                              (value(me, m1, i) + value(1 - me, m1, i));
          }
        }
        c.Equal(got, want,
                what + " step " + std::to_string(step) + " bucket at " + std::to_string(bk.offset));
      }
    }
    ++checked;
  }
  std::printf("rank %d: sharded GradReducer: %d configurations checked\n", comm->rank(), checked);
  std::fflush(stdout);
}

}  // namespace leantron::trainer::nccl_test
