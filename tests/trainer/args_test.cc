// The `train` command line: inconsistent settings refused with one line naming the numbers.
#include "trainer/core/args.h"

#include "CLI/CLI.hpp"
#include "gtest/gtest.h"

namespace leantron::trainer {
namespace {

absl::Status Check(std::vector<std::string> argv, int world) {
  CLI::App app;
  TrainArgs args;
  AddTrainFlags(app, &args);
  std::vector<std::string> full = {"train", "--num-layers",          "4",  "--hidden-size",
                                   "64",    "--num-attention-heads", "4",  "--seq-length",
                                   "32",    "--train-iters",         "10", "--lr",
                                   "1e-3",  "--global-batch-size",   "8",  "--mock-data"};
  full.insert(full.end(), argv.begin(), argv.end());
  std::vector<const char*> c;
  for (const std::string& s : full) c.push_back(s.c_str());
  app.parse(static_cast<int>(c.size()), c.data());
  args.world_size = world;
  return ValidateTrainArgs(&args);
}

TEST(ArgsTest, InconsistentSettingsAreRefusedWithOneLine) {
  EXPECT_TRUE(Check({}, 1).ok());
  EXPECT_TRUE(
      Check({"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}, 8).ok());
  auto msg = [](const absl::Status& s) { return std::string(s.message()); };
  EXPECT_EQ(msg(Check({"--tensor-model-parallel-size", "3"}, 3)),
            "--num-attention-heads 4 is not divisible by TP 3");
  EXPECT_EQ(msg(Check({"--pipeline-model-parallel-size", "3"}, 3)),
            "--num-layers 4 is not divisible by PP 3");
  EXPECT_EQ(msg(Check({"--micro-batch-size", "3"}, 1)),
            "--global-batch-size 8 is not divisible by micro-batch 3 x DP 1");
  EXPECT_EQ(msg(Check({"--tensor-model-parallel-size", "2"}, 3)),
            "world size 3 is not divisible by TP 2 x PP 1");
  EXPECT_FALSE(Check({"--data-path", "x"}, 1).ok());  // both --mock-data and --data-path
  EXPECT_EQ(msg(Check({"--fp16"}, 1)), "--fp16 is not implemented (loss scaling); use --bf16");
  EXPECT_EQ(msg(Check({"--bf16", "--ops-backend", "cpu"}, 1)), "--bf16 needs --ops-backend cuda");
  EXPECT_TRUE(Check({"--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                     "--group-query-attention", "--num-query-groups", "2"},
                    1)
                  .ok());
  EXPECT_EQ(msg(Check({"--group-query-attention", "--num-query-groups", "2",
                       "--tensor-model-parallel-size", "4"},
                      4)),
            "--num-query-groups 2 is not divisible by TP 4");
  EXPECT_FALSE(Check({"--max-position-embeddings", "16"}, 1).ok());
  EXPECT_FALSE(Check({"--lr-decay-style", "WSD"}, 1).ok());
  EXPECT_EQ(msg(Check({"--optimizer-cpu-offload"}, 1)),
            "--optimizer-cpu-offload needs --bf16 (the float32 model computes with its fp32 "
            "weights)");
#ifdef LEANTRON_HAVE_CUDA
  EXPECT_TRUE(Check({"--bf16", "--optimizer-cpu-offload"}, 2).ok());
  EXPECT_TRUE(Check({"--bf16", "--optimizer-cpu-offload", "--use-distributed-optimizer"}, 1).ok());
  EXPECT_TRUE(
      Check({"--bf16", "--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.25"}, 1).ok());
  EXPECT_EQ(msg(Check({"--bf16", "--optimizer-offload-fraction", "0.5"}, 1)),
            "--optimizer-offload-fraction needs --optimizer-cpu-offload");
  EXPECT_EQ(
      msg(Check({"--bf16", "--optimizer-cpu-offload", "--optimizer-offload-fraction", "0"}, 1)),
      "--optimizer-offload-fraction must be in (0, 1], not 0");
  EXPECT_TRUE(Check({"--bf16", "--optimizer-cpu-offload", "--use-distributed-optimizer"}, 2).ok());
  EXPECT_EQ(msg(Check({"--bf16", "--optimizer-cpu-offload", "--use-distributed-optimizer",
                       "--optimizer-offload-fraction", "0.5"},
                      2)),
            "--optimizer-offload-fraction below 1 with --use-distributed-optimizer is implemented "
            "for one data-parallel rank (DP x CP = 1), not 2: each rank offloads its whole part");
#endif
}

// Megatron-FSDP's spelling of what the data-parallel ranks shard, over the distributed optimizer.
TEST(ArgsTest, ShardingStrategyIsCheckedAgainstTheDistributedOptimizer) {
  auto msg = [](const absl::Status& s) { return std::string(s.message()); };
  EXPECT_TRUE(Check({"--data-parallel-sharding-strategy", "no_shard"}, 2).ok());
  EXPECT_TRUE(
      Check({"--use-distributed-optimizer", "--data-parallel-sharding-strategy", "optim"}, 2).ok());
  EXPECT_TRUE(
      Check({"--use-distributed-optimizer", "--data-parallel-sharding-strategy", "optim_grads"}, 2)
          .ok());
  EXPECT_EQ(msg(Check({"--data-parallel-sharding-strategy", "optim_grads"}, 2)),
            "--data-parallel-sharding-strategy optim_grads needs --use-distributed-optimizer");
  EXPECT_EQ(
      msg(Check({"--use-distributed-optimizer", "--data-parallel-sharding-strategy", "no_shard"},
                2)),
      "--data-parallel-sharding-strategy no_shard contradicts --use-distributed-optimizer");
  EXPECT_EQ(
      msg(Check({"--use-distributed-optimizer", "--data-parallel-sharding-strategy", "zero2"}, 2)),
      "--data-parallel-sharding-strategy must be no_shard, optim, optim_grads or "
      "optim_grads_params, not zero2");
  EXPECT_TRUE(Check({"--use-distributed-optimizer", "--data-parallel-sharding-strategy",
                     "optim_grads_params"},
                    2)
                  .ok());
  EXPECT_EQ(msg(Check({"--data-parallel-sharding-strategy", "optim_grads_params"}, 2)),
            "--data-parallel-sharding-strategy optim_grads_params needs "
            "--use-distributed-optimizer");
#ifdef LEANTRON_HAVE_CUDA
  for (const char* strategy : {"optim_grads", "optim_grads_params"}) {
    EXPECT_EQ(msg(Check({"--bf16", "--optimizer-cpu-offload", "--use-distributed-optimizer",
                         "--data-parallel-sharding-strategy", strategy},
                        1)),
              std::string("--optimizer-cpu-offload steps whole gradients on the host; it does "
                          "not go with --data-parallel-sharding-strategy ") +
                  strategy);
  }
  EXPECT_EQ(msg(Check({"--bf16", "--fp8-format", "hybrid", "--use-distributed-optimizer",
                       "--data-parallel-sharding-strategy", "optim_grads_params"},
                      2)),
            "--data-parallel-sharding-strategy optim_grads_params gathers the bf16 weights per "
            "layer; the FP8 layers' weight copies (--fp8-format) are not sharded: use "
            "optim_grads");
#endif
}

TEST(ArgsTest, Fp8FlagsAreChecked) {
  auto msg = [](const absl::Status& s) { return std::string(s.message()); };
  EXPECT_TRUE(Check({"--bf16", "--fp8-format", "hybrid"}, 1).ok());
  EXPECT_TRUE(Check({"--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "tensorwise",
                     "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "2",
                     "--num-layers-at-end-in-bf16", "2"},
                    1)
                  .ok());
  EXPECT_EQ(msg(Check({"--fp8-format", "hybrid"}, 1)),
            "--fp8-format needs the bf16 model on GPUs (--bf16, --ops-backend cuda)");
  EXPECT_EQ(msg(Check({"--bf16", "--fp8-format", "e5m2"}, 1)),
            "--fp8-format must be e4m3 or hybrid, not e5m2");
  EXPECT_EQ(msg(Check({"--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"}, 1)),
            "--fp8-recipe mxfp8 is not implemented (block scales); use delayed or tensorwise");
  EXPECT_EQ(msg(Check({"--bf16", "--fp8-format", "hybrid", "--fp8-amax-compute-algo", "mean"}, 1)),
            "--fp8-amax-compute-algo must be most_recent or max, not mean");
  EXPECT_EQ(msg(Check({"--bf16", "--fp8-format", "hybrid", "--fp8-amax-history-len", "0"}, 1)),
            "--fp8-amax-history-len must be in [1, 65536], not 0");
  EXPECT_EQ(msg(Check({"--bf16", "--fp8-format", "hybrid", "--first-last-layers-bf16",
                       "--num-layers-at-start-in-bf16", "3", "--num-layers-at-end-in-bf16", "2"},
                      1)),
            "--num-layers-at-start-in-bf16 3 and --num-layers-at-end-in-bf16 2 must be "
            "non-negative and sum to at most --num-layers 4");
  EXPECT_TRUE(Check({"--bf16", "--fp8-format", "hybrid", "--fp8-output-layer"}, 1).ok());
  EXPECT_EQ(msg(Check({"--bf16", "--fp8-output-layer"}, 1)),
            "--fp8-output-layer needs --fp8-format");
  EXPECT_EQ(msg(Check({"--bf16", "--fp8-format", "e4m3", "--fp8-output-layer"}, 1)),
            "--fp8-output-layer needs --fp8-format hybrid: the logits' gradient, spread over the "
            "vocabulary by the softmax, needs E5M2's range");
}

TEST(ArgsTest, ContextParallelAndTheLongContextCompanionsAreChecked) {
  auto msg = [](const absl::Status& s) { return std::string(s.message()); };
  EXPECT_TRUE(Check({"--context-parallel-size", "2"}, 2).ok());
  EXPECT_TRUE(Check({"--context-parallel-size", "4", "--cp-comm-type", "a2a"}, 4).ok());
  EXPECT_TRUE(Check({"--context-parallel-size", "2", "--tensor-model-parallel-size", "2",
                     "--sequence-parallel", "--cp-comm-type", "all_gather"},
                    8)
                  .ok());
  EXPECT_EQ(msg(Check({"--context-parallel-size", "2"}, 3)),
            "world size 3 is not divisible by TP 1 x CP 2 x PP 1");
  EXPECT_EQ(msg(Check({"--context-parallel-size", "2", "--cp-comm-type", "ring"}, 2)),
            "--cp-comm-type must be p2p, all_gather or a2a, not ring");
  // 32 tokens in 2 x CP chunks: CP 3 does not divide them.
  EXPECT_EQ(msg(Check({"--context-parallel-size", "3"}, 3)),
            "--seq-length 32 is not divisible by 2 x CP 3 (each CP rank holds two of 2 x CP equal "
            "chunks of a sequence)");
  EXPECT_EQ(
      msg(Check({"--context-parallel-size", "2", "--cp-comm-type", "a2a", "--group-query-attention",
                 "--num-query-groups", "2", "--tensor-model-parallel-size", "2"},
                4)),
      "--cp-comm-type a2a splits each TP rank's query groups over CP: 1 query group(s) per "
      "TP rank (--num-query-groups 2 / TP 2) is not divisible by CP 2");
  EXPECT_EQ(msg(Check({"--context-parallel-size", "8", "--tensor-model-parallel-size", "8",
                       "--num-attention-heads", "8", "--sequence-parallel", "--seq-length", "48"},
                      64)),
            "--sequence-parallel needs each CP rank's 6 tokens (--seq-length 48 / CP 8) divisible "
            "by TP 8");
  EXPECT_EQ(msg(Check({"--context-parallel-size", "2", "--bf16"}, 2)),
            "--context-parallel-size > 1 runs on the float32 model so far (drop --bf16: "
            "--ops-backend cpu, or cuda in float32); the bf16 model's context-parallel and "
            "document-masked attention are not built yet");
  EXPECT_EQ(msg(Check({"--reset-attention-mask", "--bf16"}, 1)).substr(0, 50),
            "--reset-attention-mask runs on the float32 model s");
  // The companions need an end-of-document token: GPT-2's 50256 (the default tokenizer) has one.
  EXPECT_TRUE(Check({"--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"}, 1).ok());
}

TEST(ArgsTest, UnevenPipelineSplitIsCheckedLikeMegatronCore) {
  auto msg = [](const absl::Status& s) { return std::string(s.message()); };
  // 4 layers: 3 + 1, 1 + 3, 1 + 2 + 1 (both, one middle stage), 2 + 1 + 1 (first, two others).
  EXPECT_TRUE(
      Check({"--pipeline-model-parallel-size", "2", "--decoder-last-pipeline-num-layers", "1"}, 2)
          .ok());
  EXPECT_TRUE(
      Check({"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1"}, 2)
          .ok());
  EXPECT_TRUE(Check({"--pipeline-model-parallel-size", "3", "--decoder-first-pipeline-num-layers",
                     "1", "--decoder-last-pipeline-num-layers", "1"},
                    3)
                  .ok());
  EXPECT_TRUE(
      Check({"--pipeline-model-parallel-size", "3", "--decoder-first-pipeline-num-layers", "2"}, 3)
          .ok());
  EXPECT_EQ(
      msg(Check({"--pipeline-model-parallel-size", "3", "--decoder-last-pipeline-num-layers", "1"},
                3)),
      "--num-layers 4 minus --decoder-last-pipeline-num-layers 1 leaves 3 layers, which do not "
      "split evenly over the other 2 pipeline stages of PP 3 (at least 1 layer each)");
  EXPECT_EQ(
      msg(Check({"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "4"},
                2)),
      "--num-layers 4 minus --decoder-first-pipeline-num-layers 4 leaves 0 layers, which do "
      "not split evenly over the other 1 pipeline stage of PP 2 (at least 1 layer each)");
  EXPECT_EQ(msg(Check({"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers",
                       "1", "--decoder-last-pipeline-num-layers", "2"},
                      2)),
            "--decoder-first-pipeline-num-layers 1 and --decoder-last-pipeline-num-layers 2 must "
            "add up to --num-layers 4 with PP 2");
  EXPECT_EQ(msg(Check({"--decoder-last-pipeline-num-layers", "2"}, 1)),
            "--decoder-last-pipeline-num-layers 2 needs PP > 1");
  EXPECT_EQ(
      msg(Check({"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "0"},
                2)),
      "--decoder-first-pipeline-num-layers must be at least 1, not 0");
  EXPECT_EQ(
      msg(Check({"--pipeline-model-parallel-size", "2", "--decoder-last-pipeline-num-layers", "-1"},
                2)),
      "--decoder-last-pipeline-num-layers must be at least 1, not -1");
  EXPECT_EQ(
      msg(Check({"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
                 "1", "--decoder-last-pipeline-num-layers", "1"},
                2)),
      "--decoder-last-pipeline-num-layers 1 does not work with "
      "--num-layers-per-virtual-pipeline-stage");
  // With the flags, --num-layers need not be divisible by PP.
  EXPECT_TRUE(Check({"--num-layers", "7", "--pipeline-model-parallel-size", "2",
                     "--decoder-last-pipeline-num-layers", "3"},
                    2)
                  .ok());
  // What reaches the layout and the checkpoint's args.
  CLI::App app;
  TrainArgs args;
  AddTrainFlags(app, &args);
  app.parse(
      "--pipeline-model-parallel-size 3 --decoder-first-pipeline-num-layers 2 --adam-beta2 0.95 "
      "--adam-eps 1e-5 --optimizer-cpu-offload",
      false);
  const ckpt::ParallelConfig p = ParallelConfigFromArgs(args);
  EXPECT_EQ(p.pp, 3);
  EXPECT_EQ(p.first_stage_layers, 2);
  EXPECT_EQ(p.last_stage_layers, 0);
  const std::string json = TrainArgsToJson(args);
  EXPECT_NE(json.find("\"decoder_first_pipeline_num_layers\": 2"), std::string::npos) << json;
  EXPECT_NE(json.find("\"decoder_last_pipeline_num_layers\": null"), std::string::npos) << json;
  // Adam's hyperparameters travel into Megatron checkpoints' param groups (--save-format megatron).
  EXPECT_NE(json.find("\"adam_beta1\": 0.90000000000000002"), std::string::npos) << json;
  EXPECT_NE(json.find("\"adam_beta2\": 0.94999999999999996"), std::string::npos) << json;
  EXPECT_NE(json.find("\"adam_eps\": 1.0000000000000001e-05"), std::string::npos) << json;
  EXPECT_NE(json.find("\"optimizer_cpu_offload\": true,"), std::string::npos) << json;
  // Megatron-FSDP's name; without --use-distributed-optimizer plain DP.
  EXPECT_NE(json.find("\"data_parallel_sharding_strategy\": \"no_shard\","), std::string::npos)
      << json;
  // Megatron's `fp8` is the format, null without FP8.
  EXPECT_NE(json.find("\"fp8\": null, \"fp8_recipe\": \"delayed\"}"), std::string::npos) << json;
}

// Megatron's --use-rope-scaling / --rope-scaling-factor: Llama 3.1's scaling with the factor
// given (default 8) and the rest fixed at 1, 4 and 8192.
TEST(ArgsTest, RopeScalingFlagsReachTheModelConfig) {
  auto msg = [](const absl::Status& s) { return std::string(s.message()); };
  const std::vector<std::string> rope = {"--position-embedding-type", "rope"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), rope.begin(), rope.end());
    return extra;
  };
  EXPECT_TRUE(Check(with({"--use-rope-scaling"}), 1).ok());
  EXPECT_EQ(msg(Check({"--use-rope-scaling"}, 1)),
            "--use-rope-scaling needs --position-embedding-type rope");
  EXPECT_EQ(msg(Check(with({"--use-rope-scaling", "--rope-scaling-factor", "0"}), 1)),
            "--rope-scaling-factor must be positive, not 0");
  EXPECT_EQ(msg(Check(with({"--use-rope-scaling", "--rope-scaling-factor", "-2"}), 1)),
            "--rope-scaling-factor must be positive, not -2");
  EXPECT_EQ(msg(Check(with({"--use-rope-scaling", "--rope-scaling-factor", "nan"}), 1)),
            "--rope-scaling-factor must be a finite number, not nan");
  EXPECT_EQ(msg(Check(with({"--use-rope-scaling", "--rope-scaling-factor", "inf"}), 1)),
            "--rope-scaling-factor must be a finite number, not inf");

  for (const char* factor : {"", "32"}) {
    CLI::App app;
    TrainArgs args;
    AddTrainFlags(app, &args);
    app.parse(std::string("--position-embedding-type rope --use-rope-scaling") +
                  (*factor ? std::string(" --rope-scaling-factor ") + factor : ""),
              false);
    const ckpt::RopeScaling r = ModelConfigFromArgs(args).rope_scaling;
    EXPECT_TRUE(r.llama3);
    EXPECT_EQ(r.factor, *factor ? 32.0 : 8.0);  // Megatron's default factor is 8
    EXPECT_EQ(r.low_freq_factor, 1.0);
    EXPECT_EQ(r.high_freq_factor, 4.0);
    EXPECT_EQ(r.original_max_position_embeddings, 8192);
  }
  CLI::App app;
  TrainArgs args;
  AddTrainFlags(app, &args);
  app.parse("--position-embedding-type rope --rope-scaling-factor 32", false);
  EXPECT_FALSE(ModelConfigFromArgs(args).rope_scaling.llama3);  // the factor alone scales nothing
}

}  // namespace

// Megatron's --recompute-modules: a list (default core_attn), the modules implemented here taken,
// Megatron's others refused by name.
TEST(ArgsTest, RecomputeModulesAreAListOfMegatronsNames) {
  auto msg = [](const absl::Status& s) { return std::string(s.message()); };
  const std::vector<std::string> selective = {"--recompute-granularity", "selective"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), selective.begin(), selective.end());
    return extra;
  };
  EXPECT_TRUE(Check(with({"--recompute-modules", "core_attn", "layernorm", "mlp"}), 1).ok());
  EXPECT_EQ(msg(Check(with({"--recompute-modules", "layernorm", "moe_act"}), 1)),
            "--recompute-modules moe_act is not implemented (core_attn, layernorm and mlp are)");
  EXPECT_EQ(msg(Check(with({"--recompute-modules", "norms"}), 1)),
            "--recompute-modules takes core_attn, layernorm or mlp, not norms");
  CLI::App app;
  TrainArgs args;
  AddTrainFlags(app, &args);
  app.parse("--recompute-granularity selective", false);
  EXPECT_EQ(args.recompute_modules, std::vector<std::string>{"core_attn"});
  app.parse("--recompute-granularity selective --recompute-modules layernorm core_attn", false);
  EXPECT_EQ(args.recompute_modules, (std::vector<std::string>{"layernorm", "core_attn"}));
}

}  // namespace leantron::trainer
