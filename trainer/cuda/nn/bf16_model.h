// The bf16 model for NVIDIA GPUs (Megatron's --bf16) on one pipeline stage (or virtual chunk) of
// one tensor-parallel rank: bf16 activations and a bf16 copy of the weights for compute, fp32 main
// weights, fp32 gradients accumulated in place by cuBLASLt. Built from the same ModelSpec as the
// float32 reference model, out of the modules in modules.h (transformer_layer.h composes a layer);
// tensor parallelism is in the linear layers (parallel/tp_linear.h), core attention behind an
// interface (core_attention.h), and data parallelism outside: the model fires ModelEvents and the
// gradient reducer (parallel/grad_reduce.h) listens. Every buffer is allocated up front: the steady
// state makes no cudaMalloc.
//
// Scope: GPT-2 and Llama-family layers (LayerNorm or RMSNorm; GELU or SwiGLU; learned positions
// or RoPE with Llama 3.1's scaling; multi-head or grouped-query attention; biases or not, the QKV
// bias alone; tied or untied output) under data, tensor (with sequence) and pipeline (1F1B,
// interleaved) parallelism over NCCL; hidden dropout supported, attention dropout refused (the
// float32 ReferenceModel over CudaOps runs it).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "libckpt/layout.h"
#include "trainer/core/params.h"
#include "trainer/core/stage_model.h"
#include "trainer/cuda/fp8_options.h"
#include "trainer/dist/comm.h"

namespace leantron::trainer::cuda {

struct Bf16Options {
  ModelOptions model;
  // The per-micro-batch loss scale the schedule will pass to Backward (1 / micro-batches): the
  // head's gradient is computed during the forward, so it must be known then.
  float loss_scale = 1.0f;
  // Recompute GELU from its input in the backward instead of keeping it (saves 4h per token and
  // layer for one elementwise pass).
  bool recompute_gelu = false;
  // Rows of logits materialised at a time (0: as many as 2 GiB of bf16 logits hold).
  int64_t logits_chunk_rows = 0;
  // Tensor parallelism (an NCCL group; null or of size one without) and where this chunk sits.
  Communicator* tp = nullptr;
  int pp_rank = 0, virtual_chunk = 0;
  // Under SP on two GPUs of one node, move the overlapped blocks by copy engine (else NCCL).
  bool tp_copy_engine = true;
  // Take cuBLASLt's heuristic algorithm for every product instead of timing candidates at the
  // first call, and cuDNN's deterministic attention backward (--deterministic-mode): bitwise
  // repeatable runs.
  bool deterministic = false;
  // Time every op category on the device and print the table when the model goes
  // (--timing-log-level 2); the coarse split (compute, TP communication) is always measured.
  bool profile_ops = false;
  // FP8 linear layers (--fp8-format), and the group whose ranks' amaxes are reduced so that
  // their delayed scales agree (data-parallel with context-parallel; null: none).
  Fp8Options fp8;
  Communicator* fp8_amax_group = nullptr;
};

// Why the bf16 model cannot run this configuration, or OK.
absl::Status Bf16Supported(const ckpt::ModelLayout& layout, const Bf16Options& options);

absl::StatusOr<std::unique_ptr<StageModel>> CreateBf16Model(const ckpt::ModelLayout& layout,
                                                            ParamStore* params,
                                                            const Bf16Options& options);

// Bytes in use on the current device (cudaMemGetInfo), for the log.
int64_t DeviceMemoryInUse();

}  // namespace leantron::trainer::cuda
