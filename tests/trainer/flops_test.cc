// TFLOP/s in the log count what Megatron's num_floating_point_operations counts: grouped-query
// attention, SwiGLU and the logits, each product three times at two FLOPs per multiply-add.
// The expected numbers are worked out term by term in the comments.
#include "gtest/gtest.h"
#include "trainer/core/args.h"
#include "trainer/core/training.h"

namespace leantron::trainer {
namespace {

TEST(FlopsTest, Llama32OneBShape) {
  // 16 layers, h 2048, 32 heads / 8 query groups of 64, ffn 8192 SwiGLU, vocab 128256, seq 4096.
  // Forward FLOPs per token and layer: QKV 2·2048·(2048 + 2·512) = 12,582,912; output projection
  // 2·2048·2048 = 8,388,608; fc1 2·2048·2·8192 = 67,108,864 and fc2 2·8192·2048 = 33,554,432;
  // causal attention 2·(4096·2048/2)·2 = 16,777,216; together 138,412,032, times 16 layers
  // 2,214,592,512. Logits 2·2048·128256 = 525,336,576. Forward 2,739,929,088 per token; with the
  // backward 3x: 8,219,787,264; times 4096 tokens: 33,668,248,633,344.
  TrainArgs a;
  a.num_layers = 16;
  a.hidden_size = 2048;
  a.num_attention_heads = 32;
  a.num_query_groups = 8;
  a.group_query_attention = true;
  a.kv_channels = 64;
  a.ffn_hidden_size = 8192;
  a.swiglu = true;
  a.untie_embeddings = false;
  a.seq_length = 4096;
  a.global_batch_size = 1;
  EXPECT_EQ(FlopsPerIteration(a, 128256), 33668248633344.0);
  // Tied or untied, the logits are one product (Megatron counts it once either way).
  a.untie_embeddings = true;
  EXPECT_EQ(FlopsPerIteration(a, 128256), 33668248633344.0);
  a.global_batch_size = 4;
  EXPECT_EQ(FlopsPerIteration(a, 128256), 4 * 33668248633344.0);
}

TEST(FlopsTest, Gpt2SmallShape) {
  // 12 layers, h 768, 12 heads of 64 (multi-head), ffn 3072 GELU, padded vocab 50304, seq 1024.
  // Per token and layer: QKV 2·768·2304 = 3,538,944; projection 2·768·768 = 1,179,648; MLP
  // 2·2·768·3072 = 9,437,184; causal attention 2·(1024·768/2)·2 = 1,572,864; 15,728,640 per
  // layer, 188,743,680 for 12. Logits 2·768·50304 = 77,266,944. Forward 266,010,624; 3x
  // 798,031,872; times 1024 tokens: 817,184,636,928.
  TrainArgs a;
  a.num_layers = 12;
  a.hidden_size = 768;
  a.num_attention_heads = 12;
  a.num_query_groups = 12;
  a.kv_channels = 64;
  a.ffn_hidden_size = 3072;
  a.seq_length = 1024;
  a.global_batch_size = 1;
  EXPECT_EQ(FlopsPerIteration(a, 50304), 817184636928.0);
}

}  // namespace
}  // namespace leantron::trainer
