// What Megatron's FP8 flags choose for the bf16 model (--fp8-format, --fp8-recipe,
// --fp8-amax-history-len, --fp8-amax-compute-algo, --fp8-margin, --first-last-layers-bf16 with
// --num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16), and our --fp8-output-layer. No
// CUDA types: the argument parser fills it.
#pragma once

namespace leantron::trainer::cuda {

struct Fp8Options {
  bool enabled = false;
  // e4m3: E4M3 everywhere; hybrid: E4M3 forward, E5M2 gradients.
  bool hybrid = false;
  // delayed: scales from the amax history of earlier steps (one pass per cast); tensorwise: each
  // tensor's scale from its own amax, measured before the cast (current scaling).
  bool delayed = true;
  int amax_history_len = 1;
  bool amax_most_recent = true;  // --fp8-amax-compute-algo most_recent (else max)
  float margin = 0.0f;
  // Transformer layers kept in bf16 at each end of the model (global indices).
  int bf16_layers_start = 0, bf16_layers_end = 0;
  // The output layer's products in FP8 too (--fp8-output-layer; Megatron keeps it in bf16).
  bool output_layer = false;
};

}  // namespace leantron::trainer::cuda
