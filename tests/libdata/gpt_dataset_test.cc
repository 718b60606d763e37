#include "libdata/gpt_dataset.h"

#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dataset_test_util.h"
#include "gtest/gtest.h"
#include "libdata/indexed_dataset_builder.h"
#include "libdata/numpy_random.h"

namespace leantron::data {
namespace {

using testing::ScratchDir;

// Values printed by numpy 2.4 (RandomState is frozen: they never change).
TEST(NumpyRandomState, ShuffleMatchesNumpy) {
  std::vector<int64_t> a(10);
  std::iota(a.begin(), a.end(), 0);
  NumpyRandomState(1234).Shuffle(absl::MakeSpan(a));
  EXPECT_EQ(a, (std::vector<int64_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  std::vector<int32_t> b(1000);
  std::iota(b.begin(), b.end(), 0);
  NumpyRandomState(7).Shuffle(absl::MakeSpan(b));
  EXPECT_EQ(std::vector<int32_t>(b.begin(), b.begin() + 8),
            (std::vector<int32_t>{778, 334, 271, 802, 216, 408, 812, 94}));
  int64_t checksum = 0;
  for (int i = 0; i < 1000; ++i) checksum += int64_t{b[i]} * i;
  EXPECT_EQ(checksum, 246202311);
}

TEST(NumpyRandomState, WideIntervalsDrawSixtyFourBits) {
  // np.random.RandomState(42).randint(0, 2**33 + 6, size=5, dtype=np.int64)
  NumpyRandomState rng(42);
  const uint64_t max = (uint64_t{1} << 33) + 5;
  std::vector<uint64_t> got;
  for (int i = 0; i < 5; ++i) got.push_back(rng.RandomInterval(max));
  EXPECT_EQ(got,
            (std::vector<uint64_t>{787846414, 2563451924, 4537253172, 7395928407, 4298312065}));
  // np.random.RandomState(0).randint(0, 2**32, size=3, dtype=np.uint64): raw 32-bit words.
  NumpyRandomState raw(0);
  EXPECT_EQ(raw.NextUint32(), 2357136044u);
  EXPECT_EQ(raw.NextUint32(), 2546248239u);
  EXPECT_EQ(raw.NextUint32(), 3071714933u);
}

TEST(NormalizeWeights, UsesNumpysPairwiseSum) {
  // numpy.sum of these is exactly 16.404; a left-to-right sum gives 16.404000000000003.
  const std::vector<double> w = {0.208, 0.482, 0.421, 0.859, 0.171, 0.339, 0.271, 0.691,
                                 0.22,  0.812, 0.011, 0.561, 0.814, 0.745, 0.189, 0.006,
                                 0.772, 0.958, 0.702, 0.298, 0.768, 0.688, 0.387, 0.615,
                                 0.428, 0.584, 0.703, 0.112, 0.923, 0.989, 0.677};
  const std::vector<double> n = NormalizeWeights(w);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(n[i], w[i] / 16.404) << i;
}

TEST(Split, SpecExample) {
  auto split = ParseSplit("949,50,1");
  ASSERT_TRUE(split.ok());
  const auto m = SplitMatrix(*split);
  ASSERT_TRUE(m[0] && m[1] && m[2]);
  EXPECT_EQ(SplitRange(*m[0], 12345), std::make_pair(int64_t{0}, int64_t{11715}));
  EXPECT_EQ(SplitRange(*m[1], 12345), std::make_pair(int64_t{11715}, int64_t{12333}));
  EXPECT_EQ(SplitRange(*m[2], 12345), std::make_pair(int64_t{12333}, int64_t{12345}));
  auto two = ParseSplit("98,2");
  ASSERT_TRUE(two.ok());
  EXPECT_FALSE(SplitMatrix(*two)[2].has_value());
  EXPECT_FALSE(ParseSplit("0,0,0").ok());
  EXPECT_FALSE(ParseSplit("1,2,3,4").ok());
  // Python's round() is half-to-even: 0.5 * 5 = 2.5 -> 2.
  EXPECT_EQ(SplitRange({0.0, 0.5}, 5), std::make_pair(int64_t{0}, int64_t{2}));
}

TEST(RequestedSamples, MegatronFormulas) {
  const auto n = RequestedSamples(/*train_iters=*/1000, /*eval_interval=*/100, /*eval_iters=*/10,
                                  /*global_batch_size=*/8);
  EXPECT_EQ(n[0], 8000);
  EXPECT_EQ(n[1], 11 * 10 * 8);
  EXPECT_EQ(n[2], 80);
}

class GptDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = dir_ / "corpus";
    auto builder = IndexedDatasetBuilder::Create(prefix_, DType::kUInt16);
    ASSERT_TRUE(builder.ok());
    std::mt19937 gen(3);
    int32_t next = 0;
    for (int d = 0; d < 120; ++d) {
      std::vector<int32_t> tokens(gen() % 90);  // some documents are empty
      for (int32_t& t : tokens) t = next++ % 60000;
      ASSERT_TRUE((*builder)->AddItem(tokens).ok());
      ASSERT_TRUE((*builder)->EndDocument().ok());
    }
    ASSERT_TRUE((*builder)->Finalize().ok());
    auto ds = IndexedDataset::Open(prefix_);
    ASSERT_TRUE(ds.ok());
    dataset_ = std::make_shared<const IndexedDataset>(*std::move(ds));
  }

  ScratchDir dir_;
  std::string prefix_;
  std::shared_ptr<const IndexedDataset> dataset_;
};

// Sample j (before shuffling) is tokens [j*S, j*S + S + 1) of the documents concatenated in
// document_index order: the definition the sample index encodes.
TEST_F(GptDatasetTest, SamplesAreConsecutiveWindowsOfTheShuffledDocumentStream) {
  for (const int64_t num_samples : {10, 150, 700}) {  // one epoch, several, separate final epoch
    GptIndexParams p;
    p.begin = 0;
    p.end = 100;
    p.num_samples = num_samples;
    p.seq_length = 32;
    p.seed = 99;
    auto gpt = GptDataset::Build(dataset_, p, "");
    ASSERT_TRUE(gpt.ok()) << gpt.status();
    std::vector<int64_t> stream;
    for (const int32_t seq : (*gpt)->document_index()) {
      ASSERT_TRUE(dataset_->ReadTokens(seq, &stream).ok());
    }
    ASSERT_GE((*gpt)->size(), num_samples);
    std::vector<bool> seen(static_cast<size_t>((*gpt)->size()), false);
    for (int64_t i = 0; i < (*gpt)->size(); ++i) {
      const int64_t j = (*gpt)->shuffle_index()[static_cast<size_t>(i)];
      ASSERT_FALSE(seen[static_cast<size_t>(j)]);
      seen[static_cast<size_t>(j)] = true;
      std::vector<int64_t> text;
      ASSERT_TRUE((*gpt)->GetSample(i, &text).ok());
      const std::vector<int64_t> expected(stream.begin() + j * 32, stream.begin() + j * 32 + 33);
      ASSERT_EQ(text, expected) << "sample " << i << " num_samples " << num_samples;
    }
    if (num_samples == 700) {
      EXPECT_GT((*gpt)->num_epochs(), 1);
    }
  }
}

TEST_F(GptDatasetTest, IndexCacheIsWrittenKeyedAndMapped) {
  GptIndexParams p;
  p.begin = 0;
  p.end = 120;
  p.num_samples = 300;
  p.seq_length = 16;
  const std::string cache = dir_ / "cache";
  auto first = GptDataset::Build(dataset_, p, cache);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE((*first)->loaded_from_cache());
  ASSERT_FALSE((*first)->cache_path().empty());
  EXPECT_TRUE(std::filesystem::exists((*first)->cache_path()));
  auto second = GptDataset::Build(dataset_, p, cache);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE((*second)->loaded_from_cache());
  EXPECT_EQ((*second)->cache_path(), (*first)->cache_path());
  EXPECT_TRUE(std::equal((*first)->shuffle_index().begin(), (*first)->shuffle_index().end(),
                         (*second)->shuffle_index().begin(), (*second)->shuffle_index().end()));
  EXPECT_TRUE(std::equal((*first)->sample_index().begin(), (*first)->sample_index().end(),
                         (*second)->sample_index().begin(), (*second)->sample_index().end()));
  // Any parameter change is a different cache entry.
  p.seed = 5;
  auto other = GptDataset::Build(dataset_, p, cache);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE((*other)->loaded_from_cache());
  EXPECT_NE((*other)->cache_path(), (*first)->cache_path());
  // A damaged cache file is rebuilt, not trusted.
  const std::string path = (*first)->cache_path();
  first->reset();
  second->reset();
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 8);
  p.seed = 1234;
  auto rebuilt = GptDataset::Build(dataset_, p, cache);
  ASSERT_TRUE(rebuilt.ok());
  EXPECT_FALSE((*rebuilt)->loaded_from_cache());
  auto again = GptDataset::Build(dataset_, p, cache);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->loaded_from_cache());
}

TEST_F(GptDatasetTest, EmptyOrTinySplitsAreErrors) {
  GptIndexParams p;
  p.begin = 5;
  p.end = 5;
  p.seq_length = 8;
  EXPECT_FALSE(GptDataset::Build(dataset_, p, "").ok());
  p.end = 500;
  EXPECT_FALSE(GptDataset::Build(dataset_, p, "").ok());
}

TEST(BlendingIndices, FollowWeightsWithLowestIndexOnTies) {
  std::vector<int16_t> index;
  std::vector<int64_t> sample;
  BuildBlendingIndices({0.5, 0.25, 0.25}, 8, &index, &sample);
  EXPECT_EQ(index, (std::vector<int16_t>{0, 1, 2, 0, 0, 1, 2, 0}));
  EXPECT_EQ(sample, (std::vector<int64_t>{0, 0, 0, 1, 2, 1, 1, 3}));
}

TEST_F(GptDatasetTest, BlendOfOneDatasetBuildsItsSurplus) {
  GptDataConfig config;
  config.data_path = {"1.0", prefix_};
  config.split = "100,0,0";
  config.seq_length = 16;
  config.num_samples = {200, 0, 0};
  config.use_cache = false;
  auto splits = BuildGptDatasets(config);
  ASSERT_TRUE(splits.ok()) << splits.status();
  ASSERT_NE(splits->split[0], nullptr);
  EXPECT_EQ(splits->split[1], nullptr);
  EXPECT_EQ(splits->split[0]->size(), 200);
  const auto* blend = dynamic_cast<const BlendedGptDataset*>(splits->split[0].get());
  ASSERT_NE(blend, nullptr);
  EXPECT_EQ(blend->dataset(0).num_samples(), 201);  // ceil(200 * 1.005)
}

}  // namespace
}  // namespace leantron::data
