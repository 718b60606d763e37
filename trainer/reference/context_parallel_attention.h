// Context-parallel core attention of the float32 reference model: each CP rank holds two chunks of
// every sample (trainer/core/context_parallel.h) and meets the other ranks' tokens through the
// cp group, by --cp-comm-type:
//   p2p         ring attention: the K/V block in hand is computed while it is sent on to the next
//               rank of the ring and the previous rank's arrives; the blocks' partial outputs are
//               merged by their log-sum-exp (Ops::BlockAttentionForward's merge). The backward
//               passes each block around again with its dK/dV, which every rank adds to and which
//               ends at the block's owner.
//   all_gather  K/V of every rank all-gathered (again in the backward), the same blocks computed
//               in the same order as p2p (so the outputs are bitwise p2p's), dK/dV reduce-
//               scattered.
//   a2a         DeepSpeed-Ulysses: an all-to-all sends each rank its query groups of every token
//               (heads and query groups must divide by CP), local attention over the whole
//               samples, an all-to-all back; the backward mirrors it.
// Causality and documents follow each token's position in the whole sample, and attention
// dropout drops what the whole-sequence attention drops, so every CP size computes the same
// model. Only the log-sum-exp is kept for the backward (a2a also keeps its exchanged qkv and
// output), which recomputes the probabilities as flash attention does.
#pragma once

#include <memory>

#include "trainer/core/context_parallel.h"
#include "trainer/core/layer_spec.h"
#include "trainer/reference/modules.h"

namespace leantron::trainer::reference {

// `ctx` names the cp group, this rank's chunks and every rank's positions.
std::unique_ptr<CoreAttention> MakeContextParallelAttention(const Context& ctx, Workspace& ws,
                                                            const LayerShard& shard,
                                                            CpCommType type);

}  // namespace leantron::trainer::reference
