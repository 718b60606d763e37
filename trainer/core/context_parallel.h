// Context parallelism's backend-neutral facts: which tokens of a sample a CP rank holds, and the
// three ways its attention meets the other ranks' tokens (Megatron's --cp-comm-type).
//
// Megatron's causal load balance: a sample of T tokens is cut into 2·CP chunks of T/(2·CP); CP
// rank r holds chunks r and 2·CP−1−r, in that order, as its "local sequence" of T/CP tokens. Every
// rank then has the same amount of causal attention work (an early chunk sees few keys, its late
// partner many). Everything outside core attention runs on the local sequence unchanged; positions
// (learned table, RoPE), dropout masks and attention masks use each token's position in the whole
// sample, so every CP size computes the same model.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

#if defined(__CUDACC__)
#define LEANTRON_HOST_DEVICE __host__ __device__
#else
#define LEANTRON_HOST_DEVICE
#endif

namespace leantron::trainer {

// Position in the whole sample (T tokens) of token t of CP rank `rank`'s local sequence.
LEANTRON_HOST_DEVICE inline int64_t ChunkTokenPosition(int64_t t, int64_t seq_length, int rank,
                                                       int size) {
  if (size <= 1) return t;
  const int64_t chunk = seq_length / (2 * size);
  return t < chunk ? rank * chunk + t : (2 * size - 1 - rank) * chunk + (t - chunk);
}

// One CP rank's part of every sample.
struct SequenceChunks {
  int64_t seq_length = 0;  // tokens of a whole sample
  int rank = 0, size = 1;  // CP rank and CP size
  int64_t local_length() const { return seq_length / size; }
  int64_t Position(int64_t t) const { return ChunkTokenPosition(t, seq_length, rank, size); }
};

// How core attention reaches the keys and values of the other CP ranks.
//   kP2P       ring attention: K/V blocks passed around the CP ring while the block in hand is
//              computed, partial outputs merged by their log-sum-exp; in the backward the K/V
//              blocks travel again with their accumulating dK/dV, which end at their owner.
//   kAllGather K/V of every rank gathered once (again in the backward), dK/dV reduce-scattered.
//   kAllToAll  DeepSpeed-Ulysses: an all-to-all turns "my tokens, all heads" into "all tokens, my
//              heads" (query groups split over CP), local attention, and back.
enum class CpCommType { kP2P, kAllGather, kAllToAll };

// Megatron's names: p2p, all_gather, a2a.
absl::StatusOr<CpCommType> ParseCpCommType(const std::string& name);
const char* CpCommTypeName(CpCommType type);

}  // namespace leantron::trainer
