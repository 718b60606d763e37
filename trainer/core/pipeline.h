// Forward/backward schedules over pipeline stages, Megatron's order:
//   one stage: each micro-batch forward then backward (gradient accumulation);
//   1F1B: min(PP − rank − 1, M) warm-up forwards, then one forward / one backward, then the
//   remaining backwards;
//   interleaved (V model chunks per stage): virtual step k runs chunk (k mod PP·V) / PP (reversed
//   for backwards) on micro-batch (k / PP·V)·PP + k mod PP, with (PP − rank − 1)·2 + (V − 1)·PP
//   warm-up forwards.
// Activations travel to the next rank of the ring (the last stage's chunk c feeds chunk c + 1 of
// stage 0) and gradients back. Sends do not block, so a rank only ever waits for data it needs.
#pragma once

#include <vector>

#include "trainer/dist/comm.h"
#include "trainer/reference/model.h"

namespace leantron::trainer {

// `chunks`: this rank's model chunks in virtual order (one without interleaving). Returns the sum
// of the micro-batch losses on the last stage (0 elsewhere). Gradients of loss / M accumulate
// into the chunks' ParamStore unless forward_only.
double RunSchedule(const std::vector<StageModel*>& chunks, Communicator& pp,
                   const std::vector<MicroBatch>& micro_batches, bool forward_only);

}  // namespace leantron::trainer
