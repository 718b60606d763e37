#include "libckpt/checkpoint_verify.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "libckpt/safetensors_writer.h"
#include "libckpt/strings.h"

namespace leantron::ckpt {
namespace {

const std::string* MetadataValue(const SafetensorsFile& file, std::string_view key) {
  for (const auto& [k, v] : file.metadata()) {
    if (k == key) return &v;
  }
  return nullptr;
}

absl::Status Damaged(const SafetensorsFile& file, std::string_view tensor, std::string_view what) {
  return absl::DataLossError(Cat(file.path(), ": tensor '", tensor, "' ", what));
}

// Index of the first NaN or infinity, or -1.
int64_t FirstNonFinite(DType dtype, std::span<const std::byte> data) {
  const size_t size = DTypeSize(dtype);
  if (dtype == DType::kF32) {
    for (size_t i = 0; i < data.size() / 4; ++i) {
      uint32_t bits;
      std::memcpy(&bits, data.data() + 4 * i, 4);
      if ((bits & 0x7f800000u) == 0x7f800000u) return static_cast<int64_t>(i);
    }
  } else if (dtype == DType::kBF16 || dtype == DType::kF16) {
    const uint16_t mask = dtype == DType::kBF16 ? 0x7f80 : 0x7c00;
    for (size_t i = 0; i < data.size() / 2; ++i) {
      uint16_t bits;
      std::memcpy(&bits, data.data() + 2 * i, 2);
      if ((bits & mask) == mask) return static_cast<int64_t>(i);
    }
  } else if (dtype == DType::kF64) {
    for (size_t i = 0; i < data.size() / size; ++i) {
      double v;
      std::memcpy(&v, data.data() + 8 * i, 8);
      if (!std::isfinite(v)) return static_cast<int64_t>(i);
    }
  }
  return -1;
}

// A parameter (its stored dtype) against its fp32 main copy: equal up to one bf16 step of the
// main value (what rounding the model copy to bf16, by any rounding mode, can change).
int64_t FirstDisagreement(DType dtype, std::span<const std::byte> param,
                          std::span<const std::byte> main, double* got, double* want) {
  const size_t n = main.size() / 4;
  for (size_t i = 0; i < n; ++i) {
    float m;
    std::memcpy(&m, main.data() + 4 * i, 4);
    const double p = *ElementAsDouble(dtype, param.data(), i);
    if (p == m) continue;
    int exponent = 0;
    std::frexp(m, &exponent);
    const double bf16_step = std::ldexp(1.0, std::max(exponent - 8, -133));
    if (std::fabs(p - m) <= bf16_step) continue;
    *got = p;
    *want = m;
    return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

absl::Status VerifyTensorBytes(const SafetensorsFile& file, const TensorView& view) {
  const std::string& name = view.info->name;
  if (const std::string* stored = MetadataValue(file, ChecksumKey(name))) {
    const std::string actual = TensorChecksum(view.data);
    if (actual != *stored) {
      return Damaged(file, name,
                     Cat("does not match its checksum (stored ", *stored, ", now ", actual,
                         "): the file was changed or damaged after it was saved"));
    }
  }
  if (const int64_t bad = FirstNonFinite(view.info->dtype, view.data); bad >= 0) {
    const double v = *ElementAsDouble(view.info->dtype, view.data.data(), bad);
    return Damaged(file, name,
                   Cat("holds ", std::isnan(v) ? "NaN" : "an infinity", " at element ", bad));
  }
  return absl::OkStatus();
}

absl::Status VerifyCheckpointContent(
    const CheckpointMetadata& metadata, const ModelLayout& layout,
    const std::vector<std::vector<std::unique_ptr<SafetensorsFile>>>& model_files,
    const std::vector<std::vector<std::unique_ptr<SafetensorsFile>>>& optimizer_files) {
  const ParallelConfig& p = metadata.parallel;
  for (int pp = 0; pp < p.pp; ++pp) {
    for (int tp = 0; tp < p.tp; ++tp) {
      for (bool optimizer : {false, true}) {
        if (optimizer && optimizer_files.empty()) continue;
        const SafetensorsFile& file = *(optimizer ? optimizer_files : model_files)[pp][tp];
        if (metadata.checksums) {
          for (auto [key, want] :
               {std::pair{kShardTpRankKey, tp}, std::pair{kShardPpRankKey, pp}}) {
            const std::string* got = MetadataValue(file, key);
            if (got == nullptr || *got != std::to_string(want)) {
              return absl::DataLossError(
                  Cat(file.path(), ": the file says it belongs to ", key, " ",
                      got ? *got : "(none)", " but sits in the directory of ", key, " ", want,
                      ": shard directories were swapped or copied into the wrong place"));
            }
          }
        }
        for (const TensorInfo& info : file.tensors()) {
          if (metadata.checksums && MetadataValue(file, ChecksumKey(info.name)) == nullptr) {
            return Damaged(file, info.name, "has no stored checksum");
          }
          auto view = file.Get(info.name);
          if (!view.ok()) return view.status();
          if (auto s = VerifyTensorBytes(file, *view); !s.ok()) return s;
        }
      }
      if (optimizer_files.empty()) continue;
      const SafetensorsFile& model = *model_files[pp][tp];
      const SafetensorsFile& optim = *optimizer_files[pp][tp];
      for (const ParamSpec* spec : layout.StageParams(pp)) {
        auto param = model.Get(spec->name);
        auto main = optim.Get(StoredTensorName(spec->name, TensorKind::kMainParam));
        if (!param.ok()) return param.status();
        if (!main.ok()) return main.status();
        double got = 0, want = 0;
        if (const int64_t i =
                FirstDisagreement(param->info->dtype, param->data, main->data, &got, &want);
            i >= 0) {
          return Damaged(model, spec->name,
                         Cat("differs from its main_param in ", optim.path(), " at element ", i,
                             " (", got, " vs ", want, "), beyond bf16 rounding"));
        }
      }
    }
  }
  // Replicated tensors: every TP rank holds the same copy (loaders read rank 0's).
  for (int pp = 0; pp < p.pp; ++pp) {
    for (const ParamSpec* spec : layout.StageParams(pp)) {
      if (spec->split != TpSplit::kReplicated) continue;
      std::vector<TensorKind> kinds = {TensorKind::kParam};
      if (!optimizer_files.empty()) {
        kinds.insert(kinds.end(), std::begin(kOptimizerKinds), std::end(kOptimizerKinds));
      }
      for (TensorKind kind : kinds) {
        const auto& files = (kind == TensorKind::kParam ? model_files : optimizer_files)[pp];
        const std::string name = StoredTensorName(spec->name, kind);
        auto first = files[0]->Get(name);
        if (!first.ok()) return first.status();
        for (int tp = 1; tp < p.tp; ++tp) {
          auto other = files[tp]->Get(name);
          if (!other.ok()) return other.status();
          if (other->data.size() != first->data.size() ||
              std::memcmp(other->data.data(), first->data.data(), first->data.size()) != 0) {
            return Damaged(*files[tp], name,
                           Cat("is replicated over tensor-parallel ranks but differs from rank "
                               "0's copy in ",
                               files[0]->path()));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace leantron::ckpt
