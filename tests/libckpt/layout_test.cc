// The parallel layout against hand-derived Megatron facts (spec §1-2): names, shapes, which rows
// a TP rank holds for grouped QKV and SwiGLU, pipeline stages with virtual chunks, vocab padding.
#include "libckpt/layout.h"

#include <cstring>
#include <numeric>

#include "gtest/gtest.h"

namespace leantron::ckpt {
namespace {

TEST(LayoutTest, PaddedVocabMatchesMegatron) {
  EXPECT_EQ(PaddedVocabSize(50257, 128, 1), 50304);
  EXPECT_EQ(PaddedVocabSize(50257, 128, 2), 50432);
  EXPECT_EQ(PaddedVocabSize(50257, 128, 8), 51200);
  EXPECT_EQ(PaddedVocabSize(256, 128, 2), 256);
  EXPECT_EQ(PaddedVocabSize(100, 64, 1), 128);
}

TEST(LayoutTest, Gpt2NamesAndShapes) {
  ModelConfig config = Gpt2StyleConfig(2, 768, 12, 50257, 1024);
  auto layout = ModelLayout::Create(config, {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  int64_t total = 0;
  for (const ParamSpec& spec : layout->params()) total += NumElements(spec.shape);
  // Embedding padded to 50304 rows; 12 tensors per layer; final norm; tied output (no tensor).
  EXPECT_EQ(layout->params().size(), 2u + 2 * 12 + 2);
  EXPECT_EQ(layout->Find("output_layer.weight"), nullptr);
  const ParamSpec* qkv = layout->Find("decoder.layers.1.self_attention.linear_qkv.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (std::vector<int64_t>{2304, 768}));
  EXPECT_EQ(layout->Find("decoder.layers.0.mlp.linear_fc2.weight")->shape,
            (std::vector<int64_t>{768, 3072}));
  // gpt2 124M has 124,439,808 parameters with V = 50257 and 12 layers; here 2 layers + padding.
  const int64_t per_layer =
      4 * 768 + 768 * 2304 + 2304 + 768 * 768 + 768 + 2 * 768 * 3072 + 3072 + 768;
  EXPECT_EQ(total, 50304 * 768 + 1024 * 768 + 2 * per_layer + 2 * 768);
}

TEST(LayoutTest, GroupedQkvShardsAreWholeGroups) {
  // 8 heads, 2 query groups, head dim 4: rows per group = (8/2 + 2) * 4 = 24.
  ModelConfig config = LlamaStyleConfig(2, 32, 48, 8, 2, 1000, 64);
  auto layout = ModelLayout::Create(config, {2, 1, 1});
  ASSERT_TRUE(layout.ok());
  const ParamSpec* qkv = layout->Find("decoder.layers.0.self_attention.linear_qkv.weight");
  EXPECT_EQ(qkv->shape, (std::vector<int64_t>{48, 32}));
  auto pieces = layout->Pieces(*qkv, 1);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].begin, 24);
  EXPECT_EQ(pieces[0].count, 24);
  EXPECT_EQ(layout->ShardShape(*qkv), (std::vector<int64_t>{24, 32}));
}

TEST(LayoutTest, SwigluShardTakesGateAndUpBlocks) {
  ModelConfig config = LlamaStyleConfig(2, 8, 12, 2, 2, 100, 16);
  auto layout = ModelLayout::Create(config, {2, 1, 1});
  ASSERT_TRUE(layout.ok());
  const ParamSpec* fc1 = layout->Find("decoder.layers.0.mlp.linear_fc1.weight");
  ASSERT_EQ(fc1->shape, (std::vector<int64_t>{24, 8}));
  // Full rows 0..11 gate, 12..23 up. Rank 1 holds gate rows 6..11 then up rows 18..23.
  std::vector<float> full(24 * 8);
  std::iota(full.begin(), full.end(), 0.0f);
  std::vector<float> shard(12 * 8);
  layout->ExtractShard(*fc1, 1, 4, std::as_bytes(std::span(full)),
                       std::as_writable_bytes(std::span(shard)));
  for (int r = 0; r < 12; ++r) {
    const int global_row = r < 6 ? 6 + r : 18 + (r - 6);
    for (int c = 0; c < 8; ++c) ASSERT_EQ(shard[r * 8 + c], full[global_row * 8 + c]) << r;
  }
  std::vector<float> back(24 * 8, -1.0f);
  for (int t = 0; t < 2; ++t) {
    layout->ExtractShard(*fc1, t, 4, std::as_bytes(std::span(full)),
                         std::as_writable_bytes(std::span(shard)));
    layout->InsertShard(*fc1, t, 4, std::as_bytes(std::span(shard)),
                        std::as_writable_bytes(std::span(back)));
  }
  EXPECT_EQ(back, full);
}

TEST(LayoutTest, RowParallelSplitsColumns) {
  ModelConfig config = LlamaStyleConfig(2, 8, 12, 2, 2, 100, 16);
  auto layout = ModelLayout::Create(config, {2, 1, 1});
  const ParamSpec* fc2 = layout->Find("decoder.layers.1.mlp.linear_fc2.weight");
  ASSERT_EQ(fc2->shape, (std::vector<int64_t>{8, 12}));
  std::vector<float> full(8 * 12);
  std::iota(full.begin(), full.end(), 0.0f);
  std::vector<float> shard(8 * 6);
  layout->ExtractShard(*fc2, 1, 4, std::as_bytes(std::span(full)),
                       std::as_writable_bytes(std::span(shard)));
  for (int r = 0; r < 8; ++r) {
    for (int c = 0; c < 6; ++c) ASSERT_EQ(shard[r * 6 + c], full[r * 12 + 6 + c]);
  }
}

TEST(LayoutTest, RunsInAByteRangeCutTheShardExtractShardCuts) {
  // Every parameter kind (SwiGLU rows, row-parallel columns, grouped QKV rows, vocabulary rows,
  // replicated), every rank, the full tensor walked in pieces of several sizes: the runs of each
  // piece are one contiguous range of the shard, the next piece's starts where it ended, and
  // together they rebuild the shard ExtractShard cuts.
  ModelConfig config = LlamaStyleConfig(2, 8, 12, 2, 2, 100, 16);
  auto layout = ModelLayout::Create(config, {2, 1, 1});
  ASSERT_TRUE(layout.ok());
  for (const ParamSpec& spec : layout->params()) {
    const size_t bytes = static_cast<size_t>(NumElements(spec.shape)) * 4;
    std::vector<std::byte> full(bytes);
    for (size_t i = 0; i < bytes; ++i) full[i] = static_cast<std::byte>(i * 13 + i / 256);
    const size_t shard_bytes = static_cast<size_t>(NumElements(layout->ShardShape(spec))) * 4;
    for (int tp = 0; tp < 2; ++tp) {
      std::vector<std::byte> want(shard_bytes);
      layout->ExtractShard(spec, tp, 4, full, want);
      for (size_t piece : {size_t{4}, size_t{20}, size_t{52}, size_t{1000}, bytes}) {
        std::vector<std::byte> got(shard_bytes, std::byte{0xee});
        size_t next = 0;  // Where the shard's next byte must come from.
        for (size_t at = 0; at < bytes; at += piece) {
          layout->ForEachRunIn(spec, tp, 4, at, at + piece,
                               [&](size_t full_at, size_t shard_at, size_t n) {
                                 ASSERT_GE(full_at, at);
                                 ASSERT_LE(full_at + n, at + piece);
                                 ASSERT_EQ(shard_at, next) << spec.name;
                                 std::memcpy(got.data() + shard_at, full.data() + full_at, n);
                                 next += n;
                               });
        }
        EXPECT_EQ(next, shard_bytes) << spec.name << " rank " << tp << " piece " << piece;
        EXPECT_EQ(got, want) << spec.name << " rank " << tp << " piece " << piece;
      }
    }
  }
}

TEST(LayoutTest, PipelineStagesWithVirtualChunks) {
  ModelConfig config = LlamaStyleConfig(8, 8, 12, 2, 2, 100, 16);
  auto layout = ModelLayout::Create(config, {1, 2, 2});
  ASSERT_TRUE(layout.ok());
  // Chunk v on stage p starts at v * (L / vpp) + p * (L / pp / vpp): stage 0 = layers 0-1, 4-5.
  EXPECT_EQ(layout->StageLayers(0, 0), (std::pair<int, int>{0, 2}));
  EXPECT_EQ(layout->StageLayers(1, 0), (std::pair<int, int>{2, 4}));
  EXPECT_EQ(layout->StageLayers(0, 1), (std::pair<int, int>{4, 6}));
  EXPECT_EQ(layout->StageLayers(1, 1), (std::pair<int, int>{6, 8}));
  EXPECT_EQ(layout->Find("decoder.layers.5.mlp.linear_fc2.weight")->stage, 0);
  EXPECT_EQ(layout->Find("decoder.layers.5.mlp.linear_fc2.weight")->virtual_chunk, 1);
  EXPECT_EQ(layout->Find("decoder.layers.7.input_layernorm.weight")->stage, 1);
  EXPECT_EQ(layout->Find("output_layer.weight")->stage, 1);
  EXPECT_EQ(layout->Find("embedding.word_embeddings.weight")->stage, 0);
  EXPECT_EQ(layout->ShardDirName(3, 1), "mp_rank_03_001");
  auto flat = ModelLayout::Create(config, {4, 1, 1});
  ASSERT_FALSE(flat.ok());  // 2 heads over TP 4.
}

TEST(LayoutTest, TiedEmbeddingCopyOnLastStageOnlyWithPipeline) {
  ModelConfig config = Gpt2StyleConfig(4, 16, 4, 300, 32);
  auto pp1 = ModelLayout::Create(config, {1, 1, 1});
  EXPECT_EQ(pp1->Find("output_layer.weight"), nullptr);
  auto pp2 = ModelLayout::Create(config, {2, 2, 1});
  const ParamSpec* copy = pp2->Find("output_layer.weight");
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->tied_to, "embedding.word_embeddings.weight");
  EXPECT_EQ(copy->stage, 1);
  EXPECT_EQ(copy->shape, (std::vector<int64_t>{512, 16}));
}

TEST(LayoutTest, RefusesImpossibleLayoutsWithReasons) {
  ModelConfig config = LlamaStyleConfig(6, 32, 48, 8, 2, 1000, 64);
  auto groups = ModelLayout::Create(config, {4, 1, 1});
  ASSERT_FALSE(groups.ok());
  EXPECT_NE(groups.status().message().find("query groups"), std::string::npos);
  auto layers = ModelLayout::Create(config, {1, 4, 1});
  ASSERT_FALSE(layers.ok());
  EXPECT_NE(layers.status().message().find("6 layers"), std::string::npos);
  EXPECT_FALSE(ModelLayout::Create(config, {1, 2, 2}).ok());  // 6 % (2 * 2) != 0.
  EXPECT_TRUE(ModelLayout::Create(config, {2, 3, 2}).ok());
  EXPECT_FALSE(ModelLayout::Create(config, {1, 1, 2}).ok());
  EXPECT_FALSE(ModelLayout::Create(config, {0, 1, 1}).ok());
  ModelConfig bad_heads = config;
  bad_heads.num_attention_heads = 6;
  bad_heads.num_query_groups = 4;
  EXPECT_FALSE(ModelLayout::Create(bad_heads, {1, 1, 1}).ok());
}

// Megatron-Core's --decoder-first/last-pipeline-num-layers. Expected boundaries are written out by
// hand: with only the first set the other PP-1 stages share the rest, with only the last set the
// first PP-1 stages, with both the PP-2 middle stages.
TEST(LayoutTest, UnevenPipelineSplit) {
  ModelConfig config = LlamaStyleConfig(36, 32, 48, 8, 2, 1000, 64);
  struct Case {
    ParallelConfig parallel;
    std::vector<std::pair<int, int>> stages;
  };
  const std::vector<Case> cases = {
      {{1, 2, 1, 19, 0}, {{0, 19}, {19, 36}}},
      {{2, 2, 1, 0, 10}, {{0, 26}, {26, 36}}},
      {{1, 4, 1, 5, 7}, {{0, 5}, {5, 17}, {17, 29}, {29, 36}}},
      {{1, 4, 1, 0, 6}, {{0, 10}, {10, 20}, {20, 30}, {30, 36}}},
      {{1, 3, 1, 12, 0}, {{0, 12}, {12, 24}, {24, 36}}},  // Same as even, asked for.
      {{1, 2, 1, 20, 16}, {{0, 20}, {20, 36}}},           // PP 2: both given, nothing in between.
  };
  for (const Case& c : cases) {
    const ParallelConfig& p = c.parallel;
    SCOPED_TRACE(::testing::Message() << "PP " << p.pp << " first " << p.first_stage_layers
                                      << " last " << p.last_stage_layers);
    auto layout = ModelLayout::Create(config, p);
    ASSERT_TRUE(layout.ok()) << layout.status();
    ASSERT_EQ(static_cast<int>(c.stages.size()), p.pp);
    for (int s = 0; s < p.pp; ++s) EXPECT_EQ(layout->StageLayers(s, 0), c.stages[s]) << s;
    // Every layer's parameters sit on the stage whose range holds the layer.
    int layer_params = 0;
    for (const ParamSpec& spec : layout->params()) {
      if (spec.layer < 0) continue;
      ++layer_params;
      int want = 0;
      while (spec.layer >= c.stages[want].second) ++want;
      EXPECT_EQ(spec.stage, want) << spec.name;
      EXPECT_EQ(spec.virtual_chunk, 0) << spec.name;
    }
    EXPECT_EQ(layer_params, 36 * 6);  // Llama style: 2 norms, qkv, proj, fc1, fc2 per layer.
    EXPECT_EQ(layout->Find("embedding.word_embeddings.weight")->stage, 0);
    EXPECT_EQ(layout->Find("decoder.final_layernorm.weight")->stage, p.pp - 1);
    EXPECT_EQ(layout->Find("output_layer.weight")->stage, p.pp - 1);
    // The last stage holds its layers' tensors plus the final norm and the (untied) output layer.
    const int last_layers = c.stages.back().second - c.stages.back().first;
    EXPECT_EQ(static_cast<int>(layout->StageParams(p.pp - 1).size()), last_layers * 6 + 2);
  }
  // With an uneven split, the layer count need not be divisible by PP.
  auto odd = ModelLayout::Create(LlamaStyleConfig(7, 32, 48, 8, 2, 1000, 64), {1, 2, 1, 0, 3});
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_EQ(odd->StageLayers(0, 0), (std::pair<int, int>{0, 4}));
  EXPECT_EQ(odd->StageLayers(1, 0), (std::pair<int, int>{4, 7}));
  EXPECT_EQ(odd->Find("decoder.layers.3.mlp.linear_fc1.weight")->stage, 0);
  EXPECT_EQ(odd->Find("decoder.layers.4.mlp.linear_fc1.weight")->stage, 1);
}

TEST(LayoutTest, UnevenPipelineSplitRefusals) {
  ModelConfig config = LlamaStyleConfig(36, 32, 48, 8, 2, 1000, 64);
  auto refused = [&](ParallelConfig p, std::vector<std::string> phrases) {
    auto layout = ModelLayout::Create(config, p);
    ASSERT_FALSE(layout.ok()) << "PP " << p.pp << " first " << p.first_stage_layers << " last "
                              << p.last_stage_layers;
    const std::string message(layout.status().message());
    for (const std::string& phrase : phrases) {
      EXPECT_NE(message.find(phrase), std::string::npos) << message << "\n  lacks: " << phrase;
    }
  };
  // 36 - 5 = 31 over 2 stages; 36 - 7 = 29 over 3; 36 - 5 - 8 = 23 over 2.
  refused({1, 3, 1, 5, 0}, {"decoder_first_pipeline_num_layers 5", "leave 31 layers", "other 2"});
  refused({1, 4, 1, 0, 7}, {"decoder_last_pipeline_num_layers 7", "leave 29 layers", "other 3"});
  refused({1, 4, 1, 5, 8},
          {"decoder_first_pipeline_num_layers 5 and decoder_last_pipeline_num_layers 8",
           "leave 23 layers"});
  // PP 2 with both: they must cover the model.
  refused({1, 2, 1, 20, 15}, {"must add up to the model's 36 layers"});
  // A stage left without layers, or asked for more than there are.
  refused({1, 2, 1, 36, 0}, {"leave 0 layers"});
  refused({1, 3, 1, 18, 18}, {"leave 0 layers", "other 1 pipeline stage "});
  refused({1, 2, 1, 0, 40}, {"leave -4 layers"});
  // Counts below 1 (0 means "not set").
  refused({1, 2, 1, -1, 0}, {"decoder_first_pipeline_num_layers must be at least 1", "not -1"});
  refused({1, 2, 1, 0, -3}, {"decoder_last_pipeline_num_layers must be at least 1", "not -3"});
  // PP 1, and virtual pipeline chunks.
  refused({1, 1, 1, 36, 0}, {"decoder_first_pipeline_num_layers 36 needs PP > 1"});
  refused({1, 1, 1, 0, 4}, {"decoder_last_pipeline_num_layers 4 needs PP > 1"});
  refused({1, 2, 2, 10, 0}, {"decoder_first_pipeline_num_layers 10", "virtual pipeline"});
  refused({1, 2, 3, 0, 12}, {"decoder_last_pipeline_num_layers 12", "virtual pipeline"});
  // The plain check still applies without the flags.
  refused({1, 5, 1, 0, 0}, {"36 layers are not divisible by PP x VPP = 5"});
}

TEST(LayoutTest, ConfigJsonRoundTrip) {
  ModelConfig config = LlamaStyleConfig(6, 32, 48, 8, 2, 1000, 64);
  config.rotary_base = 500000.0;
  config.norm_epsilon = 1e-6;
  config.params_dtype = DType::kBF16;
  config.rope_scaling.llama3 = true;
  config.rope_scaling.factor = 32.0;
  config.rope_scaling.original_max_position_embeddings = 8192;
  auto back = ModelConfigFromJson(ModelConfigToJson(config));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ModelConfigToJson(*back), ModelConfigToJson(config));
  EXPECT_EQ(back->norm_epsilon, 1e-6);
  EXPECT_EQ(back->params_dtype, DType::kBF16);
  EXPECT_EQ(back->rope_scaling, config.rope_scaling);
}

}  // namespace
}  // namespace leantron::ckpt
