#include "trainer/core/context_parallel.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace leantron::trainer {

absl::StatusOr<CpCommType> ParseCpCommType(const std::string& name) {
  if (name == "p2p") return CpCommType::kP2P;
  if (name == "all_gather") return CpCommType::kAllGather;
  if (name == "a2a") return CpCommType::kAllToAll;
  return absl::InvalidArgumentError(
      absl::StrCat("--cp-comm-type must be p2p, all_gather or a2a, not ", name));
}

const char* CpCommTypeName(CpCommType type) {
  switch (type) {
    case CpCommType::kP2P:
      return "p2p";
    case CpCommType::kAllGather:
      return "all_gather";
    case CpCommType::kAllToAll:
      return "a2a";
  }
  return "?";
}

}  // namespace leantron::trainer
