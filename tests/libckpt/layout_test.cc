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

TEST(LayoutTest, ConfigJsonRoundTrip) {
  ModelConfig config = LlamaStyleConfig(6, 32, 48, 8, 2, 1000, 64);
  config.rotary_base = 500000.0;
  config.norm_epsilon = 1e-6;
  config.params_dtype = DType::kBF16;
  config.rope_scaling_json = R"({"rope_type":"llama3","factor":8.0})";
  auto back = ModelConfigFromJson(ModelConfigToJson(config));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ModelConfigToJson(*back), ModelConfigToJson(config));
  EXPECT_EQ(back->norm_epsilon, 1e-6);
  EXPECT_EQ(back->params_dtype, DType::kBF16);
}

}  // namespace
}  // namespace leantron::ckpt
