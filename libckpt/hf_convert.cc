#include "libckpt/hf_convert.h"

#include <algorithm>
#include <filesystem>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libckpt/checkpoint_reader.h"
#include "libckpt/checkpoint_writer.h"
#include "libckpt/hf_config.h"
#include "libckpt/hf_mapping.h"
#include "libckpt/strings.h"
#include "libfs/atomic_file.h"
#include "simdjson.h"

namespace leantron::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTokenizerFiles[] = {"vocab.json",
                                           "merges.txt",
                                           "tokenizer.json",
                                           "tokenizer_config.json",
                                           "special_tokens_map.json",
                                           "tokenizer.model",
                                           "generation_config.json",
                                           "added_tokens.json"};

absl::Status CopyTokenizerFiles(const fs::path& from, const fs::path& to) {
  std::error_code error;
  fs::create_directories(to, error);
  int copied = 0;
  for (const char* name : kTokenizerFiles) {
    if (!fs::exists(from / name)) continue;
    fs::copy_file(from / name, to / name, fs::copy_options::overwrite_existing, error);
    if (error)
      return absl::InternalError(Cat((to / name).string(), ": copy failed: ", error.message()));
    ++copied;
  }
  if (copied == 0) {
    return absl::NotFoundError(Cat(from.string(), ": no tokenizer files to copy"));
  }
  return absl::OkStatus();
}

// HF buffers that are not parameters.
bool IsIgnoredHfTensor(std::string_view name) {
  return absl::EndsWith(ToAbsl(name), ".attn.bias") ||
         absl::EndsWith(ToAbsl(name), ".attn.masked_bias") ||
         absl::EndsWith(ToAbsl(name), "rotary_emb.inv_freq");
}

// Distinct layer indices in HF tensor names ("...h.<i>." for GPT-2, "...layers.<i>." for Llama).
int64_t CountLayers(const std::vector<std::string>& names) {
  absl::flat_hash_set<std::string> layers;
  for (const std::string& name : names) {
    const std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
    for (size_t i = 0; i + 2 < parts.size(); ++i) {
      if ((parts[i] == "h" || parts[i] == "layers") && !parts[i + 1].empty() &&
          std::all_of(parts[i + 1].begin(), parts[i + 1].end(), absl::ascii_isdigit)) {
        layers.insert(std::string(parts[i + 1]));
      }
    }
  }
  return static_cast<int64_t>(layers.size());
}

class HfSource : public FullTensorSource {
 public:
  static absl::StatusOr<std::unique_ptr<HfSource>> Open(const std::string& dir,
                                                        int64_t vocab_divisor) {
    const std::string config_path = (fs::path(dir) / "config.json").string();
    auto text = leantron::fs::ReadFileToString(config_path);
    if (!text.ok()) return text.status();
    auto info = ParseHfConfig(*text, config_path);
    if (!info.ok()) return info.status();
    auto files = HfTensorFiles::Open(dir);
    if (!files.ok()) return files.status();
    // The counts config.json claims size everything below: check the layer count against the
    // tensors present first (each layer's tensors carry its index in their names).
    if (const int64_t present = CountLayers((*files)->Names());
        info->config.num_layers != present) {
      return absl::InvalidArgumentError(Cat(config_path, ": claims ", info->config.num_layers,
                                            " layers but the safetensors files hold ", present));
    }
    std::unique_ptr<HfSource> source(new HfSource());
    source->info_ = *std::move(info);
    source->info_.config.make_vocab_size_divisible_by = vocab_divisor;
    source->files_ = *std::move(files);
    std::string prefix = "transformer.";
    if (source->info_.config.hf_architecture == HfArchitecture::kGpt2 &&
        !source->files_->Contains("transformer.wte.weight") &&
        source->files_->Contains("wte.weight")) {
      prefix = "";
    }
    source->mappings_ =
        HfMappings(source->info_.config.hf_architecture, source->info_.config, prefix);
    if (auto s = source->Verify(dir); !s.ok()) return s;
    for (size_t i = 0; i < source->mappings_.size(); ++i) {
      source->by_megatron_[source->mappings_[i].megatron] = i;
    }
    return source;
  }

  const HfModelInfo& info() const { return info_; }

  absl::Status ReadFull(const ParamSpec& target, TensorKind kind, Tensor* out) override {
    if (kind != TensorKind::kParam) {
      return absl::FailedPreconditionError("HuggingFace folders hold no optimizer state");
    }
    const std::string& name = target.tied_to.empty() ? target.name : target.tied_to;
    auto it = by_megatron_.find(name);
    if (it == by_megatron_.end())
      return absl::NotFoundError(Cat("no HF tensor maps to '", name, "'"));
    const HfMapping& mapping = mappings_[it->second];
    std::vector<TensorView> views;
    std::vector<std::span<const std::byte>> spans;
    for (const HfTensor& tensor : mapping.hf) {
      auto view = files_->Get(tensor.name);
      if (!view.ok()) return view.status();
      views.push_back(*view);
      spans.push_back(view->data);
    }
    HfToMegatron(mapping, info_.config, info_.config.params_dtype, spans, target.shape, out);
    for (size_t i = 0; i < views.size(); ++i) files_->Release(mapping.hf[i].name, views[i]);
    return absl::OkStatus();
  }
  bool has_optimizer() const override { return false; }

 private:
  // Every expected tensor present with its shape and one float dtype; nothing unexplained left.
  absl::Status Verify(const std::string& dir) {
    absl::flat_hash_set<std::string> used;
    std::optional<DType> dtype;
    for (const HfMapping& mapping : mappings_) {
      for (const HfTensor& tensor : mapping.hf) {
        auto view = files_->Get(tensor.name);
        if (!view.ok()) return view.status();
        std::vector<int64_t> shape(view->info->shape.begin(), view->info->shape.end());
        if (shape != tensor.shape) {
          return absl::InvalidArgumentError(
              Cat(dir, ": '", tensor.name, "' has shape [", absl::StrJoin(shape, ","),
                  "], config.json implies [", absl::StrJoin(tensor.shape, ","), "]"));
        }
        if (!dtype) dtype = view->info->dtype;
        if (view->info->dtype != *dtype) {
          return absl::InvalidArgumentError(
              Cat(dir, ": '", tensor.name, "' is ", DTypeName(view->info->dtype),
                  " but others are ", DTypeName(*dtype), "; mixed dtypes are not supported"));
        }
        used.insert(tensor.name);
      }
    }
    if (*dtype != DType::kF32 && *dtype != DType::kBF16 && *dtype != DType::kF16) {
      return absl::InvalidArgumentError(
          Cat(dir, ": tensors are ", DTypeName(*dtype), "; expected F32, BF16 or F16"));
    }
    info_.config.params_dtype = *dtype;
    for (const std::string& name : files_->Names()) {
      if (used.contains(name) || IsIgnoredHfTensor(name)) continue;
      // Tied models may still store the output layer; it must be the embedding's copy.
      if (name == "lm_head.weight" && !info_.config.untie_embeddings_and_output_weights) continue;
      return absl::InvalidArgumentError(
          Cat(dir, ": unexpected tensor '", name, "' (not part of this model)"));
    }
    return absl::OkStatus();
  }

  HfSource() = default;
  HfModelInfo info_;
  std::unique_ptr<HfTensorFiles> files_;
  std::vector<HfMapping> mappings_;
  absl::flat_hash_map<std::string, size_t> by_megatron_;
};

// Values HF keeps in config.json that a Megatron config has no field for travel in "args".
std::string ArgsFromHf(const HfModelInfo& info) {
  std::string args =
      Cat("{\"converted_from\": \"", HfArchitectureName(info.config.hf_architecture), "\"");
  if (!info.bos_token_id_json.empty())
    CatAppend(&args, ", \"hf_bos_token_id\": ", info.bos_token_id_json);
  if (!info.eos_token_id_json.empty())
    CatAppend(&args, ", \"hf_eos_token_id\": ", info.eos_token_id_json);
  return args + "}";
}

}  // namespace

absl::Status ImportHfCheckpoint(const std::string& hf_dir, const std::string& save_dir,
                                const HfImportOptions& options) {
  auto source = HfSource::Open(hf_dir, options.make_vocab_size_divisible_by);
  if (!source.ok()) return source.status();
  if (auto s = CheckSaveDestination(save_dir, options.iteration, options.overwrite); !s.ok()) {
    return s;
  }
  CheckpointMetadata metadata;
  metadata.config = (*source)->info().config;
  metadata.parallel = options.target;
  metadata.iteration = options.iteration;
  metadata.args_json = ArgsFromHf((*source)->info());
  if (auto layout = ModelLayout::Create(metadata.config, metadata.parallel); !layout.ok()) {
    return layout.status();
  }
  if (auto s = SaveCheckpointFrom(**source, metadata, save_dir); !s.ok()) return s;
  if (options.copy_tokenizer_files) {
    return CopyTokenizerFiles(hf_dir, fs::path(save_dir) / "tokenizer");
  }
  return absl::OkStatus();
}

absl::Status ExportHfCheckpoint(const std::string& load_dir, const std::string& hf_dir,
                                const HfExportOptions& options) {
  std::error_code error;
  if (!options.overwrite && fs::exists(hf_dir, error) &&
      !(fs::is_directory(hf_dir, error) && fs::is_empty(hf_dir, error))) {
    return absl::FailedPreconditionError(
        Cat(hf_dir, ": not empty (--overwrite replaces the folder as a whole)"));
  }
  auto reader = CheckpointReader::Open(load_dir, options.iteration, {.verify = options.verify});
  if (!reader.ok()) return reader.status();
  const CheckpointMetadata& metadata = (*reader)->metadata();
  auto architecture = HfArchitectureFor(metadata.config);
  if (!architecture.ok()) return architecture.status();
  // The export is written into a folder of its own beside the destination and swapped in when
  // complete: the destination then holds exactly this export (no stale shard or index beside it),
  // and a failure leaves it as it was.
  fs::path final_path = fs::path(hf_dir).lexically_normal();
  if (!final_path.has_filename()) final_path = final_path.parent_path();  // "out/hf/"
  const std::string final_dir = final_path.string();
  const std::string out_dir = leantron::fs::TempPathFor(final_dir);
  struct RemoveOnExit {
    std::string dir;
    ~RemoveOnExit() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{out_dir};
  // Full tensors are requested in the TP = 1, PP = 1 layout of the same model.
  auto layout = ModelLayout::Create(metadata.config, {1, 1, 1});
  if (!layout.ok()) return layout.status();
  const std::vector<HfMapping> mappings = HfMappings(*architecture, metadata.config);
  std::vector<TensorSpec> specs;
  for (const HfMapping& mapping : mappings) {
    for (const HfTensor& tensor : mapping.hf) {
      specs.push_back(
          {tensor.name, metadata.config.params_dtype, {tensor.shape.begin(), tensor.shape.end()}});
    }
  }
  auto writer = HfShardedWriter::Create(out_dir, std::move(specs), options.max_shard_bytes);
  if (!writer.ok()) return writer.status();
  Tensor full;
  std::vector<Tensor> hf;
  for (const HfMapping& mapping : mappings) {
    const ParamSpec* spec = layout->Find(mapping.megatron);
    if (spec == nullptr) return absl::InternalError(Cat("layout has no '", mapping.megatron, "'"));
    if (auto s = (*reader)->ReadFull(*spec, TensorKind::kParam, &full); !s.ok()) return s;
    if (mapping.transform == HfTransform::kCopy || mapping.transform == HfTransform::kVocabRows) {
      // The HF tensor is a prefix of the full one (padding rows dropped): write it without a copy.
      const size_t bytes = static_cast<size_t>(NumElements(mapping.hf[0].shape)) *
                           DTypeSize(metadata.config.params_dtype);
      if (auto s = (*writer)->Write(mapping.hf[0].name, full.bytes().subspan(0, bytes)); !s.ok()) {
        return s;
      }
      continue;
    }
    MegatronToHf(mapping, metadata.config, full, &hf);
    for (size_t i = 0; i < hf.size(); ++i) {
      if (auto s = (*writer)->Write(mapping.hf[i].name, hf[i].bytes()); !s.ok()) return s;
    }
  }
  if (auto s = (*writer)->Finish(); !s.ok()) return s;
  HfModelInfo info;
  info.config = metadata.config;
  info.config.hf_architecture = *architecture;
  simdjson::dom::parser parser;
  simdjson::dom::object args;
  if (parser.parse(metadata.args_json).get(args) == simdjson::SUCCESS) {
    simdjson::dom::element e;
    if (args["hf_bos_token_id"].get(e) == simdjson::SUCCESS)
      info.bos_token_id_json = simdjson::minify(e);
    if (args["hf_eos_token_id"].get(e) == simdjson::SUCCESS)
      info.eos_token_id_json = simdjson::minify(e);
  }
  // A checkpoint that did not come from HF (trained here) has no ids to carry over. For GPT-2
  // the end-of-document token is the last id (50256 of 50257; NullTokenizer's EOD likewise);
  // without this, transformers would assume 50256 whatever the vocabulary.
  if (*architecture == HfArchitecture::kGpt2 && info.config.vocab_size > 0) {
    const std::string eod = Cat(info.config.vocab_size - 1);
    if (info.bos_token_id_json.empty()) info.bos_token_id_json = eod;
    if (info.eos_token_id_json.empty()) info.eos_token_id_json = eod;
  }
  if (auto s = leantron::fs::WriteFileAtomically((fs::path(out_dir) / "config.json").string(),
                                                 HfConfigJson(info));
      !s.ok()) {
    return s;
  }
  if (options.copy_tokenizer_files) {
    const fs::path from = options.tokenizer_dir.empty() ? fs::path(load_dir) / "tokenizer"
                                                        : fs::path(options.tokenizer_dir);
    if (auto s = CopyTokenizerFiles(from, out_dir); !s.ok()) return s;
  }
  return leantron::fs::ReplaceDirectory(out_dir, final_dir);
}

}  // namespace leantron::ckpt
