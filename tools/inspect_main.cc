// inspect: look inside the project's files. Each subcommand is a thin layer over one library call.
//   inspect dataset PREFIX | W1 P1 W2 P2 ... [--document K] [--sample K --seq-length N ...]
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "libckpt/checkpoint_source.h"
#include "libckpt/inspect.h"
#include "libdata/dataset_inspect.h"
#include "libdata/tokenizer_flags.h"

namespace {

int Fail(const absl::Status& status) {
  std::cerr << "inspect: " << status.message() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Inspect Leantron / Megatron files"};
  app.require_subcommand(1);

  // ---- inspect dataset ----
  leantron::data::InspectDatasetOptions dataset;
  std::optional<int64_t> document, sample;
  std::vector<int64_t> num_samples = {0, 0, 0};
  std::string split_name = "train";
  bool no_cache = false;
  CLI::App* dataset_cmd =
      app.add_subcommand("dataset", "Summarize an indexed dataset (.bin/.idx); show GPT samples");
  dataset_cmd
      ->add_option("data-path", dataset.data_path,
                   "Dataset prefix, or a Megatron --data-path blend: W1 PREFIX1 W2 PREFIX2 ...")
      ->required();
  dataset_cmd->add_option("--document", document, "Print (and decode) document K")
      ->check(CLI::NonNegativeNumber);
  leantron::data::AddTokenizerFlags(dataset_cmd, &dataset.tokenizer);
  dataset_cmd->add_option("--sample", sample, "Print (and decode) GPT sample K of --split-name")
      ->check(CLI::NonNegativeNumber);
  dataset_cmd->add_option("--seq-length", dataset.gpt.seq_length, "Megatron --seq-length")
      ->capture_default_str();
  dataset_cmd->add_option("--split", dataset.gpt.split, "Megatron --split")->capture_default_str();
  dataset_cmd->add_option("--seed", dataset.gpt.seed, "Megatron --seed")->capture_default_str();
  dataset_cmd
      ->add_option("--num-samples", num_samples,
                   "Samples requested for train valid test (Megatron: train_iters*GBS, ...)")
      ->expected(3)
      ->check(CLI::NonNegativeNumber);
  dataset_cmd->add_option("--split-name", split_name, "train, valid or test")
      ->check(CLI::IsMember({"train", "valid", "test"}));
  dataset_cmd->add_option("--cache-dir", dataset.gpt.cache_dir,
                          "Where the index cache lives (default: beside the data)");
  dataset_cmd->add_flag("--no-cache", no_cache, "Neither read nor write the index cache");
  dataset_cmd->add_option("--export-dir", dataset.export_dir,
                          "Write index arrays and samples as .npy files here");
  dataset_cmd->add_option("--export-samples", dataset.export_samples,
                          "How many samples to write to samples.npy");

  // ---- inspect checkpoint ----
  std::string checkpoint_dir;
  std::optional<int64_t> checkpoint_iteration;
  bool no_verify = false;
  CLI::App* checkpoint_cmd =
      app.add_subcommand("checkpoint", "Summarize a checkpoint (config, layout, tensors, norms)");
  checkpoint_cmd->add_option("dir", checkpoint_dir, "Checkpoint directory")->required();
  checkpoint_cmd->add_option("--iteration", checkpoint_iteration, "Iteration (default: latest)")
      ->check(CLI::NonNegativeNumber);
  std::string load_format = "auto";
  checkpoint_cmd
      ->add_option("--load-format", load_format,
                   "auto (detected), leantron, or megatron (Megatron-LM's torch / torch_dist)")
      ->check(CLI::IsMember({"auto", "leantron", "megatron"}));
  checkpoint_cmd->add_flag("--no-verify-checkpoint", no_verify,
                           "Skip the content checks (checksums, NaN, replicated copies)");

  CLI11_PARSE(app, argc, argv);

  if (checkpoint_cmd->parsed()) {
    if (absl::Status s = leantron::ckpt::PrintCheckpointSummary(
            checkpoint_dir, checkpoint_iteration, std::cout, !no_verify,
            *leantron::ckpt::ParseCheckpointFormat(load_format));
        !s.ok())
      return Fail(s);
    return 0;
  }

  if (dataset_cmd->parsed()) {
    dataset.document = document;
    dataset.sample = sample;
    for (int j = 0; j < 3; ++j) dataset.gpt.num_samples[j] = num_samples[j];
    dataset.gpt.use_cache = !no_cache;
    dataset.split_kind = split_name == "train"   ? leantron::data::SplitKind::kTrain
                         : split_name == "valid" ? leantron::data::SplitKind::kValid
                                                 : leantron::data::SplitKind::kTest;
    if (absl::Status s = leantron::data::InspectDataset(dataset, std::cout); !s.ok())
      return Fail(s);
    return 0;
  }
  return 0;
}
