// Checkpoint directory: save, verified load, resharding through chains of layouts with optimizer
// state, loading into any rank, and crash safety (the writer killed at every step of a save).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>

#include "gtest/gtest.h"
#include "libckpt/checkpoint_reader.h"
#include "libckpt/checkpoint_writer.h"
#include "libckpt/reshard.h"
#include "libckpt/safetensors_writer.h"
#include "libckpt/strings.h"

namespace leantron::ckpt {
namespace {

namespace fs = std::filesystem;

// Value of full-tensor element `index` of parameter `name` for `kind`: a hash, so any misplaced
// row or column shows. Padded vocabulary rows are zero, as a reshard would produce.
// The model weights are the fp32 main weights rounded to bf16, as in a bf16 run: a verified load
// refuses a pair that differs by more, and a swap of the two still shows.
float Value(const std::string& name, TensorKind kind, int64_t index) {
  if (kind == TensorKind::kParam) {
    return BFloat16ToFloat(FloatToBFloat16(Value(name, TensorKind::kMainParam, index)));
  }
  uint64_t h =
      std::hash<std::string>{}(name) ^ (static_cast<uint64_t>(kind) * 0x9e3779b97f4a7c15ull);
  h ^= static_cast<uint64_t>(index) * 0xbf58476d1ce4e5b9ull;
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  return static_cast<float>(h % 2000003) / 1000.0f - 1000.0f;
}

class SyntheticSource : public FullTensorSource {
 public:
  explicit SyntheticSource(int64_t vocab) : vocab_(vocab) {}
  absl::Status ReadFull(const ParamSpec& target, TensorKind kind, Tensor* out) override {
    const std::string& name = target.tied_to.empty() ? target.name : target.tied_to;
    out->Reset(DType::kF32, target.shape);
    auto* values = reinterpret_cast<float*>(out->data.data());
    const int64_t n = NumElements(target.shape);
    const bool vocab = target.split == TpSplit::kVocabRows;
    const int64_t row = target.shape.size() == 2 ? target.shape[1] : 1;
    for (int64_t i = 0; i < n; ++i) {
      values[i] = vocab && i / row >= vocab_ ? 0.0f : Value(name, kind, i);
    }
    return absl::OkStatus();
  }
  bool has_optimizer() const override { return true; }

 private:
  int64_t vocab_;
};

// Expected shard element, written from the split rules directly (not via ModelLayout).
float ExpectedShardValue(const ParamSpec& spec, TensorKind kind, int tp, int tp_rank, int64_t vocab,
                         int64_t local_index) {
  const std::string& name = spec.tied_to.empty() ? spec.name : spec.tied_to;
  const int64_t cols = spec.shape.size() == 2 ? spec.shape[1] : 1;
  int64_t row, col;
  switch (spec.split) {
    case TpSplit::kReplicated:
      return Value(name, kind, local_index);
    case TpSplit::kColumns: {
      const int64_t local_cols = cols / tp;
      row = local_index / local_cols;
      col = tp_rank * local_cols + local_index % local_cols;
      break;
    }
    case TpSplit::kSwigluRows: {
      const int64_t block = spec.shape[0] / 2 / tp;
      const int64_t r = local_index / cols;
      row = r < block ? tp_rank * block + r : spec.shape[0] / 2 + tp_rank * block + (r - block);
      col = local_index % cols;
      break;
    }
    default: {
      const int64_t block = spec.shape[0] / tp;
      row = tp_rank * block + local_index / cols;
      col = local_index % cols;
      if (spec.split == TpSplit::kVocabRows && row >= vocab) return 0.0f;
    }
  }
  return Value(name, kind, row * cols + col);
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("libckpt_ckpt_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Dir(const std::string& name) { return (root_ / name).string(); }

  CheckpointMetadata Metadata(const ModelConfig& config, ParallelConfig parallel,
                              int64_t iteration) {
    CheckpointMetadata m;
    m.config = config;
    m.parallel = parallel;
    m.iteration = iteration;
    m.consumed_samples = 4096;
    m.has_optimizer = true;
    m.optimizer_step = 77;
    m.args_json = R"({"lr":0.0003,"seed":1234,"tokenizer_type":"GPT2BPETokenizer"})";
    return m;
  }

  // Every rank of `parallel` loaded from `dir` matches the synthetic values exactly.
  void ExpectRanksMatch(const std::string& dir, const ModelConfig& config,
                        ParallelConfig parallel) {
    auto layout = ModelLayout::Create(config, parallel);
    ASSERT_TRUE(layout.ok());
    for (int pp = 0; pp < parallel.pp; ++pp) {
      for (int tp = 0; tp < parallel.tp; ++tp) {
        auto state = LoadRankState(dir, std::nullopt, parallel, tp, pp);
        ASSERT_TRUE(state.ok()) << state.status();
        auto stage = layout->StageParams(pp);
        ASSERT_EQ(state->params.size(), stage.size());
        ASSERT_EQ(state->exp_avg_sq.size(), stage.size());
        EXPECT_EQ(state->metadata.optimizer_step, 77);
        EXPECT_EQ(state->metadata.consumed_samples, 4096);
        for (size_t i = 0; i < stage.size(); ++i) {
          for (auto [kind, list] : {std::pair{TensorKind::kParam, &state->params},
                                    {TensorKind::kMainParam, &state->main_params},
                                    {TensorKind::kExpAvg, &state->exp_avg},
                                    {TensorKind::kExpAvgSq, &state->exp_avg_sq}}) {
            const NamedTensor& got = (*list)[i];
            ASSERT_EQ(got.name, stage[i]->name);
            ASSERT_EQ(got.tensor.shape, layout->ShardShape(*stage[i]));
            const auto* values = reinterpret_cast<const float*>(got.tensor.data.data());
            const int64_t n = NumElements(got.tensor.shape);
            for (int64_t j = 0; j < n; ++j) {
              ASSERT_EQ(values[j],
                        ExpectedShardValue(*stage[i], kind, parallel.tp, tp, config.vocab_size, j))
                  << got.name << " kind " << static_cast<int>(kind) << " tp " << tp << " pp " << pp
                  << " element " << j;
            }
          }
        }
      }
    }
  }

  fs::path root_;
};

TEST_F(CheckpointTest, ReshardChainKeepsParamsAndOptimizerStateExactly) {
  for (const ModelConfig& config :
       {Gpt2StyleConfig(4, 16, 4, 300, 32), LlamaStyleConfig(4, 32, 40, 8, 4, 300, 32)}) {
    SyntheticSource source(config.vocab_size);
    ASSERT_TRUE(SaveCheckpointFrom(source, Metadata(config, {2, 2, 1}, 10), Dir("a")).ok());
    ExpectRanksMatch(Dir("a"), config, {2, 2, 1});
    const std::vector<ParallelConfig> chain = {{4, 1, 1}, {1, 4, 1}, {2, 2, 2}, {1, 1, 1}};
    std::string from = Dir("a");
    for (size_t i = 0; i < chain.size(); ++i) {
      const std::string to = Dir("b" + std::to_string(i));
      ASSERT_TRUE(ReshardCheckpoint(from, to, {std::nullopt, chain[i]}).ok());
      ExpectRanksMatch(to, config, chain[i]);
      from = to;
    }
    // Any layout loads directly into any other.
    ExpectRanksMatch(Dir("a"), config, {4, 2, 1});
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
}

TEST_F(CheckpointTest, DirectoryHasMegatronShape) {
  ModelConfig config = Gpt2StyleConfig(4, 16, 4, 300, 32);
  SyntheticSource source(config.vocab_size);
  ASSERT_TRUE(SaveCheckpointFrom(source, Metadata(config, {2, 2, 1}, 123), Dir("c")).ok());
  EXPECT_TRUE(fs::exists(Dir("c/iter_0000123/mp_rank_01_001/model.safetensors")));
  EXPECT_TRUE(fs::exists(Dir("c/iter_0000123/mp_rank_00_000/optimizer.safetensors")));
  EXPECT_TRUE(fs::exists(Dir("c/iter_0000123/metadata.json")));
  EXPECT_EQ(*ReadLatestIteration(Dir("c")), 123);
  ASSERT_TRUE(ReshardCheckpoint(Dir("c"), Dir("d"), {std::nullopt, {2, 1, 1}}).ok());
  EXPECT_TRUE(fs::exists(Dir("d/iter_0000123/mp_rank_01/model.safetensors")));
  auto reader = CheckpointReader::Open(Dir("d"), 123);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(reader->get()->metadata().args_json,
            R"({"lr":0.0003,"seed":1234,"tokenizer_type":"GPT2BPETokenizer"})");
  // Tied embeddings: the last stage's copy exists only with PP > 1.
  EXPECT_EQ(reader->get()->shard_file(0, 0, false).Find("output_layer.weight"), nullptr);
  auto pp2 = CheckpointReader::Open(Dir("c"), std::nullopt);
  EXPECT_NE(pp2->get()->shard_file(0, 1, false).Find("output_layer.weight"), nullptr);
}

TEST_F(CheckpointTest, LoadRefusesIncompleteOrInconsistentCheckpoints) {
  ModelConfig config = LlamaStyleConfig(4, 32, 40, 8, 4, 300, 32);
  SyntheticSource source(config.vocab_size);
  ASSERT_TRUE(SaveCheckpointFrom(source, Metadata(config, {2, 2, 1}, 5), Dir("e")).ok());
  const std::string shard = Dir("e/iter_0000005/mp_rank_01_001/model.safetensors");
  fs::rename(shard, shard + ".bak");
  auto missing = CheckpointReader::Open(Dir("e"), std::nullopt);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("mp_rank_01_001"), std::string::npos);
  // A shard with a tensor missing is named precisely.
  std::vector<float> tiny(32);
  ASSERT_TRUE(WriteSafetensors(shard, {{{"decoder.final_layernorm.weight", DType::kF32, {32}},
                                        std::as_bytes(std::span(tiny))}})
                  .ok());
  auto incomplete = CheckpointReader::Open(Dir("e"), std::nullopt);
  ASSERT_FALSE(incomplete.ok());
  EXPECT_NE(incomplete.status().message().find("is missing"), std::string::npos)
      << incomplete.status();
  fs::rename(shard + ".bak", shard);
  EXPECT_TRUE(CheckpointReader::Open(Dir("e"), std::nullopt).ok());
  auto impossible = ReshardCheckpoint(Dir("e"), Dir("f"), {std::nullopt, {8, 1, 1}});
  ASSERT_FALSE(impossible.ok());
  EXPECT_NE(impossible.message().find("query groups"), std::string::npos);
  EXPECT_FALSE(fs::exists(Dir("f")));
  EXPECT_FALSE(CheckpointReader::Open(Dir("e"), 6).ok());
}

TEST_F(CheckpointTest, PerRankSaveAsATrainerDoesIt) {
  // Each rank holds only its shards (here: loaded from a TP1/PP1 checkpoint into TP2/PP2 ranks)
  // and writes them itself; rank 0 prepares and commits.
  ModelConfig config = LlamaStyleConfig(4, 32, 40, 8, 4, 300, 32);
  SyntheticSource source(config.vocab_size);
  ASSERT_TRUE(SaveCheckpointFrom(source, Metadata(config, {1, 1, 1}, 3), Dir("src")).ok());
  const ParallelConfig parallel = {2, 2, 1};
  auto layout = ModelLayout::Create(config, parallel);
  ASSERT_TRUE(layout.ok());
  auto temp = PrepareCheckpointSave(Dir("dst"), 4);
  ASSERT_TRUE(temp.ok()) << temp.status();
  for (int pp = 0; pp < 2; ++pp) {
    for (int tp = 0; tp < 2; ++tp) {
      auto state = LoadRankState(Dir("src"), std::nullopt, parallel, tp, pp);
      ASSERT_TRUE(state.ok()) << state.status();
      auto views = [](const std::vector<NamedTensor>& list) {
        std::vector<RankTensor> out;
        for (const NamedTensor& t : list) out.push_back({t.name, t.tensor.bytes()});
        return out;
      };
      auto params = views(state->params), main = views(state->main_params),
           avg = views(state->exp_avg), avg_sq = views(state->exp_avg_sq);
      ASSERT_TRUE(WriteRankShard(*temp, *layout, tp, pp, params, &main, &avg, &avg_sq).ok());
    }
  }
  CheckpointMetadata metadata = Metadata(config, parallel, 4);
  // A missing rank is caught at commit: nothing is published.
  fs::rename(*temp + "/mp_rank_01_001", Dir("held_back"));
  EXPECT_FALSE(CommitCheckpointSave(Dir("dst"), *temp, metadata).ok());
  EXPECT_FALSE(fs::exists(Dir("dst/iter_0000004")));
  fs::rename(Dir("held_back"), *temp + "/mp_rank_01_001");
  ASSERT_TRUE(CommitCheckpointSave(Dir("dst"), *temp, metadata).ok());
  EXPECT_FALSE(fs::exists(*temp));
  ExpectRanksMatch(Dir("dst"), config, parallel);
  ExpectRanksMatch(Dir("dst"), config, {4, 1, 1});
}

TEST(CheckpointMetadataTest, UnevenPipelineSplitRoundTrips) {
  ModelConfig config = Gpt2StyleConfig(36, 16, 4, 300, 32);
  CheckpointMetadata m;
  m.config = config;
  m.iteration = 9;
  for (const ParallelConfig& p : std::vector<ParallelConfig>{
           {2, 4, 1, 5, 7}, {1, 2, 1, 19, 0}, {1, 4, 1, 0, 6}, {2, 4, 1, 0, 0}}) {
    m.parallel = p;
    auto layout = ModelLayout::Create(config, p);
    ASSERT_TRUE(layout.ok()) << layout.status();
    const std::string json = CheckpointMetadataToJson(m, *layout);
    // Written inside "parallel" under Megatron's names, only when set.
    const size_t parallel = json.find("\"parallel\": {");
    const size_t parallel_end = json.find('}', parallel);
    ASSERT_NE(parallel, std::string::npos);
    for (auto [key, value] : {std::pair{"decoder_first_pipeline_num_layers", p.first_stage_layers},
                              std::pair{"decoder_last_pipeline_num_layers", p.last_stage_layers}}) {
      const size_t at = json.find(Cat("\"", key, "\": "));
      if (value == 0) {
        EXPECT_EQ(at, std::string::npos) << json;
      } else {
        EXPECT_NE(json.find(Cat("\"", key, "\": ", value)), std::string::npos) << json;
        EXPECT_TRUE(at > parallel && at < parallel_end) << json;
      }
    }
    auto back = ParseCheckpointMetadata(json, "test");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->parallel.tp, p.tp);
    EXPECT_EQ(back->parallel.pp, p.pp);
    EXPECT_EQ(back->parallel.vpp, p.vpp);
    EXPECT_EQ(back->parallel.first_stage_layers, p.first_stage_layers);
    EXPECT_EQ(back->parallel.last_stage_layers, p.last_stage_layers);
  }
  // The descriptive layout block lists the uneven stages.
  m.parallel = {1, 4, 1, 5, 7};
  const std::string json = CheckpointMetadataToJson(m, *ModelLayout::Create(config, m.parallel));
  EXPECT_NE(json.find("\"layers\": [[0, 5]]}, {\"pp_rank\": 1, \"layers\": [[5, 17]]}, "
                      "{\"pp_rank\": 2, \"layers\": [[17, 29]]}, {\"pp_rank\": 3, \"layers\": "
                      "[[29, 36]]}"),
            std::string::npos)
      << json;
  // Written by hand: one key only, the other absent; a non-number is refused.
  const std::string base =
      Cat("{\"format\": \"leantron-checkpoint\", \"format_version\": 1, \"iteration\": 1, "
          "\"consumed_samples\": 0, \"model\": ",
          ModelConfigToJson(config),
          ", \"parallel\": {\"tensor_model_parallel_size\": 1, \"pipeline_model_parallel_size\": "
          "3, \"virtual_pipeline_model_parallel_size\": 1");
  auto only_last =
      ParseCheckpointMetadata(base + ", \"decoder_last_pipeline_num_layers\": 4}}", "t");
  ASSERT_TRUE(only_last.ok()) << only_last.status();
  EXPECT_EQ(only_last->parallel.first_stage_layers, 0);
  EXPECT_EQ(only_last->parallel.last_stage_layers, 4);
  auto even = ParseCheckpointMetadata(base + "}}", "t");
  ASSERT_TRUE(even.ok()) << even.status();
  EXPECT_EQ(even->parallel.first_stage_layers, 0);
  EXPECT_EQ(even->parallel.last_stage_layers, 0);
  EXPECT_FALSE(
      ParseCheckpointMetadata(base + ", \"decoder_first_pipeline_num_layers\": \"4\"}}", "t").ok());
  EXPECT_FALSE(
      ParseCheckpointMetadata(base + ", \"decoder_first_pipeline_num_layers\": -2}}", "t").ok());
}

TEST_F(CheckpointTest, UnevenPipelineSplitSavesLoadsAndReshards) {
  for (const ModelConfig& config :
       {Gpt2StyleConfig(4, 16, 4, 300, 32), LlamaStyleConfig(4, 32, 40, 8, 4, 300, 32)}) {
    SyntheticSource source(config.vocab_size);
    // PP 3, first stage 2 layers: stages hold layers [0, 2), [2, 3), [3, 4).
    const ParallelConfig uneven = {2, 3, 1, 2, 0};
    ASSERT_TRUE(SaveCheckpointFrom(source, Metadata(config, uneven, 10), Dir("u")).ok());
    auto reader = CheckpointReader::Open(Dir("u"), std::nullopt);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->metadata().parallel.first_stage_layers, 2);
    EXPECT_EQ((*reader)->metadata().parallel.last_stage_layers, 0);
    // Which layers each shard file holds, by name.
    const std::vector<std::vector<int>> held = {{0, 1}, {2}, {3}};
    for (int pp = 0; pp < 3; ++pp) {
      for (int tp = 0; tp < 2; ++tp) {
        const SafetensorsFile& file = (*reader)->shard_file(tp, pp, false);
        for (int layer = 0; layer < 4; ++layer) {
          const bool here = std::find(held[pp].begin(), held[pp].end(), layer) != held[pp].end();
          EXPECT_EQ(file.Find(Cat("decoder.layers.", layer, ".mlp.linear_fc2.weight")) != nullptr,
                    here)
              << "pp " << pp << " layer " << layer;
        }
        EXPECT_EQ(file.Find("decoder.final_layernorm.weight") != nullptr, pp == 2);
        EXPECT_EQ(file.Find("embedding.word_embeddings.weight") != nullptr, pp == 0);
      }
    }
    ExpectRanksMatch(Dir("u"), config, uneven);
    // Into even and other uneven layouts, and back.
    const std::vector<ParallelConfig> chain = {
        {1, 1, 1, 0, 0}, {1, 2, 1, 0, 3}, {4, 4, 1, 0, 0}, {1, 3, 1, 1, 1}, {2, 2, 2, 0, 0}};
    std::string from = Dir("u");
    for (size_t i = 0; i < chain.size(); ++i) {
      const std::string to = Dir("r" + std::to_string(i));
      ASSERT_TRUE(ReshardCheckpoint(from, to, {std::nullopt, chain[i]}).ok());
      ExpectRanksMatch(to, config, chain[i]);
      auto r = CheckpointReader::Open(to, std::nullopt);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ((*r)->metadata().parallel.first_stage_layers, chain[i].first_stage_layers);
      EXPECT_EQ((*r)->metadata().parallel.last_stage_layers, chain[i].last_stage_layers);
      from = to;
    }
    // Loaded directly into any layout, uneven ones included.
    ExpectRanksMatch(Dir("u"), config, {1, 4, 1, 0, 0});
    ExpectRanksMatch(Dir("u"), config, {2, 2, 1, 3, 1});
    ExpectRanksMatch(Dir("r0"), config, {1, 3, 1, 0, 2});
    // An impossible target is refused before anything is written.
    auto bad = ReshardCheckpoint(Dir("u"), Dir("bad"), {std::nullopt, {1, 3, 1, 0, 3}});
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.message().find("decoder_last_pipeline_num_layers 3"), std::string::npos)
        << bad.message();
    EXPECT_FALSE(fs::exists(Dir("bad")));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
}

TEST_F(CheckpointTest, KilledWriterLeavesPreviousCheckpointLoadable) {
  ModelConfig config = Gpt2StyleConfig(4, 16, 4, 300, 32);
  SyntheticSource source(config.vocab_size);
  ASSERT_TRUE(SaveCheckpointFrom(source, Metadata(config, {2, 2, 1}, 1), Dir("k")).ok());
  // 8 shard files + metadata + verified + renamed + tracker = 12 steps; kill after each of them
  // and before the first (0), then once more without a kill (13): the child must have died of
  // the SIGKILL at every step that kills, or the test would prove nothing.
  constexpr int kSteps = 12;
  for (int kill_at = 0; kill_at <= kSteps + 1; ++kill_at) {
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      int step = 0;
      if (kill_at == 0) ::raise(SIGKILL);
      auto status = SaveCheckpointFrom(source, Metadata(config, {2, 2, 1}, 2), Dir("k"),
                                       [&](std::string_view) {
                                         if (++step == kill_at) ::raise(SIGKILL);
                                       });
      ::_exit(status.ok() ? (step == kSteps ? 0 : 3) : 1);
    }
    int wstatus = 0;
    ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
    if (kill_at <= kSteps) {
      ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
          << "the writer was not killed at step " << kill_at << " (status " << wstatus << ")";
    } else {
      ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
          << "the save without a kill failed or took other than " << kSteps << " steps";
    }
    auto reader = CheckpointReader::Open(Dir("k"), std::nullopt);
    ASSERT_TRUE(reader.ok()) << "killed at step " << kill_at << ": " << reader.status();
    // The tracker is the last thing written: only a kill after it sees iteration 2.
    const int64_t expected = kill_at >= kSteps ? 2 : 1;
    EXPECT_EQ(reader->get()->metadata().iteration, expected) << "killed at step " << kill_at;
    if (expected == 2) fs::remove_all(Dir("k/iter_0000002"));
    ASSERT_TRUE(SaveCheckpointFrom(source, Metadata(config, {2, 2, 1}, 1), Dir("k")).ok());
  }
}

}  // namespace
}  // namespace leantron::ckpt
