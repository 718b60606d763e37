// Forward/backward schedules over pipeline stages. With one stage: every micro-batch forward then
// backward in turn (gradient accumulation). With several: Megatron's 1F1B without interleaving —
// min(PP − rank − 1, M) warm-up forwards, then one forward / one backward, then the remaining
// backwards — exchanging activations and their gradients with the neighbouring stages.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/comm.h"
#include "trainer/model.h"

namespace leantron::trainer {

// Returns the sum of the micro-batch losses on the last stage (0 elsewhere). Gradients of
// loss / M accumulate into the model's ParamStore unless forward_only.
double RunSchedule(GptModel& model, Communicator& pp, const std::vector<MicroBatch>& micro_batches,
                   bool forward_only);

}  // namespace leantron::trainer
