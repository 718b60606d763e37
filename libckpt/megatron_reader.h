// Megatron-LM's own checkpoints as CheckpointSources, read without Python:
//
//   --ckpt-format torch (legacy): iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt, one torch.save
//     file per (tp, pp) rank holding `args`, `iteration`, `model` (or `model0`, `model1`, ... with
//     virtual pipeline chunks) and the optimizer; with --use-distributed-optimizer the parameter
//     state is in distrib_optim.pt beside it (flat fp32 buffers, megatron_layout.h).
//   --ckpt-format torch_dist: iter_NNNNNNN/.metadata (torch.distributed.checkpoint's Metadata),
//     __R_S.distcp data files (a torch.save archive per tensor chunk), metadata.json, and the
//     non-tensor state in a `common_state` item (or common.pt in older versions).
//
// Model weights and, where present, the optimizer state (fp32 main weights, Adam moments, step)
// come out in the project's terms: Megatron-Core names with global layer indices, the layout the
// checkpoint was saved in, full tensors merged over tensor parallelism. Every name, shape and
// dtype is checked against the layout the saved arguments describe before anything is read.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "libckpt/checkpoint_reader.h"

namespace leantron::ckpt {

// `iteration_dir` is iter_NNNNNNN (or release) of a Megatron checkpoint directory.
absl::StatusOr<std::unique_ptr<CheckpointSource>> OpenMegatronTorchCheckpoint(
    const std::string& iteration_dir, CheckpointReadOptions options);
absl::StatusOr<std::unique_ptr<CheckpointSource>> OpenMegatronDistCheckpoint(
    const std::string& iteration_dir, CheckpointReadOptions options);

// What an iteration directory holds, judged from its files: "torch_dist" (.metadata),
// "torch" (mp_rank_*/model_optim_rng.pt), "leantron" (metadata.json of ours) or "" (none).
std::string DetectIterationFormat(const std::string& iteration_dir);

}  // namespace leantron::ckpt
