// Writing Megatron-LM's legacy `torch` checkpoint format (`--save-format megatron`), so that
// `pretrain_gpt.py --ckpt-format torch --load DIR` resumes from it: per (tp, pp) rank
// mp_rank_TT[_PPP]/model_optim_rng.pt with `args` (an argparse.Namespace Megatron's argument
// checks accept), `checkpoint_version` 3.0, `iteration`, the model state dict (`model`, or
// `model0`... with virtual pipeline chunks; chunk-local Megatron-Core names of the local
// implementation, `_extra_state` entries), and with optimizer state:
//   - the non-distributed optimizer: torch AdamW's state dict (per-parameter `step`, `exp_avg`,
//     `exp_avg_sq`, Megatron's two weight-decay groups) and `fp32_from_fp16_params`;
//   - the distributed optimizer (resume with --use-distributed-optimizer): the param groups in the
//     model file and distrib_optim.pt with the coalesced fp32 buffers in Megatron's layout
//     (megatron_layout.h), for one DDP bucket (resume without --overlap-grad-reduce, or with a
//     --ddp-bucket-size no smaller than the buffer);
//   - `opt_param_scheduler` computed from the saved arguments (lr, min_lr, warmup, decay, weight
//     decay, global batch size), as Megatron's get_optimizer_param_scheduler does.
// No RNG state is written (there is none to carry over): resume with --no-load-rng.
//
// The iteration is written into iter_XXXXXXX.tmp through libfs, re-read and checked by the
// Megatron reader, then renamed into place and the tracker replaced, as for the project's format.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "libckpt/checkpoint_reader.h"
#include "libckpt/progress.h"

namespace leantron::ckpt {

struct MegatronSaveOptions {
  bool distributed_optimizer = false;
  ProgressOptions progress = {};
};

// Whether a checkpoint's training arguments (CheckpointMetadata::args_json) name
// use_distributed_optimizer: true.
bool UsesDistributedOptimizer(const std::string& args_json);

// Pulls every parameter (and the optimizer state when metadata.has_optimizer) from `source` and
// saves it in Megatron's format in the layout of `metadata`.
absl::Status SaveMegatronCheckpoint(FullTensorSource& source, const CheckpointMetadata& metadata,
                                    const std::string& checkpoint_dir,
                                    const MegatronSaveOptions& options);

}  // namespace leantron::ckpt
