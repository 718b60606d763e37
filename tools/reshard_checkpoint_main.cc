// reshard_checkpoint: rewrite a checkpoint for another tensor/pipeline-parallel layout, keeping the
// optimizer state. Streams one parameter at a time.
//   reshard_checkpoint --load DIR --save DIR --target-tp N --target-pp M [--target-vpp V]
//                      [--target-decoder-first-pipeline-num-layers F]
//                      [--target-decoder-last-pipeline-num-layers L] [--iteration K]
//                      [--load-format auto|leantron|megatron] [--save-format leantron|megatron]
//                      [--[no-]use-distributed-optimizer] [--overwrite] [--no-verify-checkpoint]
#include <cstdint>
#include <iostream>
#include <optional>

#include "CLI/CLI.hpp"
#include "libckpt/checkpoint_source.h"
#include "libckpt/reshard.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Reshard a checkpoint (Leantron's, or Megatron-LM's torch / torch_dist) to another TP/PP "
      "layout, optimizer state kept"};
  std::string load, save;
  leantron::ckpt::ReshardOptions options;
  std::optional<int64_t> iteration;
  bool no_verify = false;
  app.add_option("--load", load, "Checkpoint directory to read")->required();
  app.add_option("--save", save, "Checkpoint directory to write")->required();
  app.add_option("--target-tp", options.target.tp, "Target tensor-parallel size")->required();
  app.add_option("--target-pp", options.target.pp, "Target pipeline-parallel size")->required();
  app.add_option("--target-vpp", options.target.vpp, "Target virtual pipeline chunks per stage");
  app.add_option("--target-decoder-first-pipeline-num-layers", options.target.first_stage_layers,
                 "Target layers on the first pipeline stage (uneven split; default 0: even)");
  app.add_option("--target-decoder-last-pipeline-num-layers", options.target.last_stage_layers,
                 "Target layers on the last pipeline stage (uneven split; default 0: even)");
  app.add_option("--iteration", iteration, "Iteration to read (default: the tracker's)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--overwrite", options.overwrite,
               "Write into a --save that already holds data (replacing the iteration and moving "
               "its tracker to it); without it such a --save is refused");
  std::string load_format = "auto";
  app.add_option("--load-format", load_format,
                 "Format of --load: auto (detected), leantron, or megatron (Megatron-LM's torch or "
                 "torch_dist checkpoints)")
      ->check(CLI::IsMember({"auto", "leantron", "megatron"}));
  std::string save_format = "leantron";
  app.add_option("--save-format", save_format,
                 "Format of --save: leantron (safetensors, docs/checkpoint-format.md) or megatron "
                 "(Megatron-LM's --ckpt-format torch, which pretrain_gpt.py --load resumes from; "
                 "pass it --no-load-rng)")
      ->check(CLI::IsMember({"leantron", "megatron"}));
  bool use_dist = false, no_use_dist = false;
  auto* dist_flag = app.add_flag(
      "--use-distributed-optimizer", use_dist,
      "With --save-format megatron: write the optimizer state as Megatron's distributed optimizer "
      "does (distrib_optim.pt; default: as the source's run did)");
  app.add_flag("--no-use-distributed-optimizer", no_use_dist,
               "With --save-format megatron: write it as the non-distributed optimizer does")
      ->excludes(dist_flag);
  app.add_flag("--no-verify-checkpoint", no_verify,
               "Skip the content checks of --load (checksums, NaN, replicated copies)");
  CLI11_PARSE(app, argc, argv);
  options.iteration = iteration;
  options.verify = !no_verify;
  options.load_format = *leantron::ckpt::ParseCheckpointFormat(load_format);
  options.save_format = *leantron::ckpt::ParseSaveFormat(save_format);
  if (use_dist || no_use_dist) options.distributed_optimizer = use_dist;
  options.progress = {true, "reshard_checkpoint"};  // Drawn only when stderr is a terminal.
  if (absl::Status s = leantron::ckpt::ReshardCheckpoint(load, save, options); !s.ok()) {
    std::cerr << "reshard_checkpoint: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
