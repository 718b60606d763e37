// The parameter store on the cuda backend with its fp32 weights sharded (MasterWeights::kSharded,
// the bf16 model's distributed optimizer): the bf16 copy it writes on the host when weights are
// (re)written is bit for bit the GPU's conversion of the whole store's weights, the mirror holds
// the norms and embeddings, and the shard's norms and embeddings are stepped in the mirror.
// What crosses between ranks is tested on two GPUs (tests/gpu/test_multi_gpu.py).
#include <cstdint>
#include <vector>

#include "libckpt/layout.h"
#include "tests/gpu/gpu_test_util.h"
#include "trainer/core/params.h"
#include "trainer/cuda/kernels/kernels.h"

namespace leantron::trainer::cuda {
namespace {

using namespace testutil;

TEST_F(GpuTest, ShardedStoreWritesTheGpusBf16CopyAndMirror) {
  auto gpu = CreateOps("cuda");
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  Ops* ops = gpu->get();
  ckpt::ModelConfig config = ckpt::Gpt2StyleConfig(2, 16, 2, 37, 8);
  config.make_vocab_size_divisible_by = 8;
  auto layout = ckpt::ModelLayout::Create(config, {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  ParamStore whole(ops, *layout, 0, 0, false);
  ParamStore shard(ops, *layout, 0, 0, false, MasterWeights::kSharded);
  const size_t n = whole.size();
  // Two ranges that cut tensors (the embedding among them) in the middle.
  const std::vector<std::pair<size_t, size_t>> ranges = {{5, n / 3}, {n / 2 + 7, n - 3}};
  shard.SetShard(ranges);
  whole.Initialize(8, 0.02);
  shard.Initialize(8, 0.02);
  EXPECT_EQ(shard.data(), nullptr);

  bf16* converted = nullptr;
  ASSERT_EQ(cudaMalloc(&converted, n * sizeof(bf16)), cudaSuccess);
  ConvertFromFloat<bf16>(converted, whole.data(), n, MainStream());
  std::vector<uint16_t> want(n), got(n);
  ops->CopyToHost(want.data(), converted, n * sizeof(uint16_t));
  ops->CopyToHost(got.data(), shard.bf16_copy(), n * sizeof(uint16_t));
  cudaFree(converted);
  EXPECT_EQ(got, want);

  const std::vector<float> all = whole.HostData();
  auto down = [&](const float* p, size_t len) {
    std::vector<float> h(len);
    ops->CopyToHost(h.data(), p, len * sizeof(float));
    return h;
  };
  // Every run of the shard (cut at the mirrored tensors' edges) holds the weights.
  auto runs = [&](auto&& f) {
    for (const auto& [b, e] : ranges)
      for (size_t x = b; x < e; x = std::min(e, shard.MasterRunEnd(x))) {
        ASSERT_GT(shard.MasterRunEnd(x), x);
        f(x, std::min(e, shard.MasterRunEnd(x)));
      }
  };
  runs([&](size_t b, size_t e) {
    EXPECT_EQ(down(shard.Master(b), e - b), std::vector<float>(all.begin() + b, all.begin() + e));
  });
  size_t mirrored = 0, outside = 0;
  for (const ParamView& v : shard.views()) {
    if (v.mirror == ParamView::kNoMirror) continue;
    mirrored += v.numel;
    EXPECT_EQ(down(shard.Param(v.name), v.numel),
              std::vector<float>(all.begin() + v.offset, all.begin() + v.offset + v.numel))
        << v.name;
  }
  for (const auto& [b, e] : ranges)
    for (size_t i = b; i < e; ++i) outside += shard.MirrorAt(i) == nullptr;
  EXPECT_GT(outside, 0u);
  EXPECT_LT(outside, (n / 3 - 5) + (n - 3 - n / 2 - 7));  // the embedding is cut
  EXPECT_EQ(shard.backend_elements(), outside + mirrored);

  // A "step" of the shard: every weight it holds doubled in place on the device; the model's
  // fp32 reads (the mirror) see the norms and embeddings among them at once.
  runs([&](size_t b, size_t e) { ops->AddInPlace(shard.Master(b), shard.Master(b), e - b); });
  for (const ParamView& v : shard.views()) {
    if (v.mirror == ParamView::kNoMirror) continue;
    const std::vector<float> m = down(shard.Param(v.name), v.numel);
    for (size_t j = 0; j < v.numel; ++j) {
      const size_t i = v.offset + j;
      bool owned = false;
      for (const auto& [b, e] : ranges) owned = owned || (b <= i && i < e);
      ASSERT_EQ(m[j], owned ? 2 * all[i] : all[i]) << v.name << " " << j;
    }
  }
}

}  // namespace
}  // namespace leantron::trainer::cuda
