// The bf16 GPT model for NVIDIA GPUs (Megatron's --bf16): bf16 activations and a bf16 copy of the
// weights for compute, fp32 main weights, fp32 gradients accumulated in place by cuBLASLt, fused
// residual + dropout + LayerNorm kernels, cuDNN flash attention, and a cross-entropy that handles
// the logits a chunk of rows at a time (forward, loss and its gradient back to the hidden state),
// so the full [tokens, vocab] logits never exist. Every buffer is allocated up front: the steady
// state makes no cudaMalloc.
//
// Scope: GPT-2-style models (LayerNorm, GELU, learned absolute positions, multi-head attention,
// tied or untied output) under data, tensor (with sequence) and pipeline (1F1B, interleaved)
// parallelism over NCCL; hidden dropout supported, attention dropout refused. The float32
// GptModel over CudaOps runs everything else (Llama-style models, attention dropout).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libckpt/layout.h"
#include "trainer/dist/comm.h"
#include "trainer/core/stage_model.h"
#include "trainer/core/params.h"
#include "trainer/core/stage_model.h"

namespace leantron::trainer::cuda {

struct BF16Options {
  ModelOptions model;
  // The per-micro-batch loss scale the schedule will pass to Backward (1 / micro-batches): the
  // head's gradient is computed during the forward, so it must be known then.
  float loss_scale = 1.0f;
  // Recompute GELU from its input in the backward instead of keeping it (saves 4h per token and
  // layer for one elementwise pass).
  bool recompute_gelu = false;
  // Rows of logits materialised at a time (0: as many as 2 GiB of bf16 logits hold).
  int64_t logits_chunk_rows = 0;
  // Data parallelism over an NCCL dp group of more than one rank: the model sums the gradient over
  // it in this chunk's buckets (PlanDpBuckets) on the last micro-batch, during the backward with
  // overlap_grad_reduce, after it otherwise; with the distributed optimizer only into the parts
  // this rank steps, and it gathers the stepped parts before the next forward (per layer with
  // overlap_param_gather). The optimizer then averages and steps.
  Communicator* dp = nullptr;
  std::vector<DpBucket> dp_buckets;
  bool distributed_optimizer = false, overlap_param_gather = false;
  // Tensor parallelism (an NCCL group; null or of size one without) and where this chunk sits.
  Communicator* tp = nullptr;
  int pp_rank = 0, virtual_chunk = 0;
  bool overlap_grad_reduce = false;
  bool grad_reduce_in_bf16 = false;  // the data-parallel reduction in bf16 (GradReducer)
  int num_micro_batches = 1;
};

// Why the bf16 model cannot run this configuration, or OK.
absl::Status BF16Supported(const ckpt::ModelLayout& layout, const BF16Options& options);

absl::StatusOr<std::unique_ptr<StageModel>> CreateBF16GptModel(const ckpt::ModelLayout& layout,
                                                               ParamStore* params,
                                                               const BF16Options& options);

// Bytes in use on the current device (cudaMemGetInfo), for the log.
int64_t DeviceMemoryInUse();

}  // namespace leantron::trainer::cuda
