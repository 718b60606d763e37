#include "libdata/dataset_inspect.h"

#include <algorithm>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libdata/indexed_dataset.h"
#include "libdata/npy_writer.h"

namespace leantron::data {
namespace {

bool HasVocab(const TokenizerOptions& v) {
  return !v.tiktoken_file.empty() || (!v.vocab_file.empty() && !v.merge_file.empty()) ||
         !v.model.empty() || (v.type == "NullTokenizer" && v.vocab_size > 0);
}

void PrintHistogram(const IndexedDataset& ds, int buckets, std::ostream& out) {
  // Bucket b holds lengths in [2^(b-1), 2^b) (bucket 0: length 0); the last bucket is open-ended.
  std::vector<int64_t> counts(static_cast<size_t>(std::max(buckets, 2)), 0);
  int32_t min_len = ds.num_sequences() > 0 ? INT32_MAX : 0, max_len = 0;
  for (int64_t i = 0; i < ds.num_sequences(); ++i) {
    const int32_t len = ds.sequence_length(i);
    min_len = std::min(min_len, len);
    max_len = std::max(max_len, len);
    size_t b = 0;
    while (b + 1 < counts.size() && (int64_t{1} << b) <= len) ++b;
    ++counts[b];
  }
  out << absl::StrFormat("sequence length: min %d, max %d, mean %.1f\n", min_len, max_len,
                         ds.num_sequences() ? static_cast<double>(ds.total_tokens()) /
                                                  static_cast<double>(ds.num_sequences())
                                            : 0.0);
  out << "length histogram:\n";
  const int64_t peak = *std::max_element(counts.begin(), counts.end());
  for (size_t b = 0; b < counts.size(); ++b) {
    const std::string range =
        b == 0 ? std::string("0")
               : (b + 1 == counts.size()
                      ? absl::StrCat(">=", int64_t{1} << (b - 1))
                      : absl::StrCat(int64_t{1} << (b - 1), "-", (int64_t{1} << b) - 1));
    const int bar = peak ? static_cast<int>(40 * counts[b] / peak) : 0;
    out << absl::StrFormat("  %12s %12d %s\n", range, counts[b], std::string(bar, '#'));
  }
}

absl::Status PrintText(const std::vector<int64_t>& ids, const Tokenizer* tokenizer,
                       std::ostream& out) {
  if (tokenizer == nullptr) return absl::OkStatus();
  std::vector<int32_t> in_vocab;
  for (const int64_t id : ids) {
    if (id >= 0) in_vocab.push_back(static_cast<int32_t>(id));  // -1 is padding
  }
  std::string text;
  if (absl::Status s = tokenizer->Decode(in_vocab, &text); !s.ok()) return s;
  out << "text: " << text << "\n";
  return absl::OkStatus();
}

absl::Status PrintDocument(const IndexedDataset& ds, int64_t k, const Tokenizer* tokenizer,
                           std::ostream& out) {
  if (k < 0 || k >= ds.num_documents()) {
    return absl::OutOfRangeError(
        absl::StrCat("document ", k, " out of range [0, ", ds.num_documents(), ")"));
  }
  const int64_t first = ds.document_index(k), last = ds.document_index(k + 1);
  out << "document " << k << ": sequences [" << first << ", " << last << ")\n";
  for (int64_t i = first; i < last; ++i) {
    std::vector<int64_t> tokens;
    if (absl::Status s = ds.ReadTokens(i, &tokens); !s.ok()) return s;
    out << "sequence " << i << " (" << tokens.size() << " tokens): " << absl::StrJoin(tokens, " ")
        << "\n";
    if (absl::Status s = PrintText(tokens, tokenizer, out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Export(const std::string& dir, const std::string& name, const char* descr,
                    std::vector<int64_t> shape, absl::Span<const T> values) {
  return WriteNpy(absl::StrCat(dir, "/", name, ".npy"), descr, shape, values.data(),
                  values.size() * sizeof(T));
}

absl::Status ExportGpt(const GptDataset& gpt, const std::string& dir, const std::string& prefix) {
  const int64_t rows = static_cast<int64_t>(gpt.sample_index().size() / 2);
  absl::Status s =
      Export(dir, prefix + "document_index", "<i4",
             {static_cast<int64_t>(gpt.document_index().size())}, gpt.document_index());
  if (s.ok()) s = Export(dir, prefix + "sample_index", "<i8", {rows, 2}, gpt.sample_index());
  if (s.ok()) {
    s = Export(dir, prefix + "shuffle_index", "<i8",
               {static_cast<int64_t>(gpt.shuffle_index().size())}, gpt.shuffle_index());
  }
  return s;
}

absl::Status InspectSamples(const InspectDatasetOptions& options, const Tokenizer* tokenizer,
                            std::ostream& out) {
  GptDataConfig config = options.gpt;
  config.data_path = options.data_path;
  absl::StatusOr<GptDataSplits> splits = BuildGptDatasets(config);
  if (!splits.ok()) return splits.status();
  static constexpr const char* kNames[] = {"train", "valid", "test"};
  for (int j = 0; j < 3; ++j) {
    const GptSampleSource* source = splits->split[j].get();
    out << kNames[j] << " samples: " << (source ? absl::StrCat(source->size()) : "(empty split)");
    const auto describe = [&out](const GptDataset& gpt) {
      out << " (epochs " << gpt.num_epochs() << ", separate final epoch "
          << (gpt.separate_final_epoch() ? "yes" : "no") << ", index cache "
          << (gpt.cache_path().empty()
                  ? std::string("none")
                  : absl::StrCat(gpt.cache_path(), gpt.loaded_from_cache() ? " (hit)" : ""))
          << ")";
    };
    if (const auto* gpt = dynamic_cast<const GptDataset*>(source)) describe(*gpt);
    out << "\n";
    if (const auto* blend = dynamic_cast<const BlendedGptDataset*>(source)) {
      for (size_t d = 0; d < blend->num_datasets(); ++d) {
        out << "  blended dataset " << d << ": " << blend->dataset(d).size() << " samples";
        describe(blend->dataset(d));
        out << "\n";
      }
    }
  }
  const GptSampleSource* source = splits->split[static_cast<int>(options.split_kind)].get();
  if (source == nullptr) return absl::InvalidArgumentError("the requested split is empty");
  std::vector<int64_t> text;
  if (options.sample) {
    if (absl::Status s = source->GetSample(*options.sample, &text); !s.ok()) return s;
    out << "sample " << *options.sample << " (" << text.size()
        << " ids): " << absl::StrJoin(text, " ") << "\n";
    if (absl::Status s = PrintText(text, tokenizer, out); !s.ok()) return s;
  }
  if (options.export_dir.empty()) return absl::OkStatus();
  const std::string& dir = options.export_dir;
  if (const auto* gpt = dynamic_cast<const GptDataset*>(source)) {
    if (absl::Status s = ExportGpt(*gpt, dir, ""); !s.ok()) return s;
  } else if (const auto* blend = dynamic_cast<const BlendedGptDataset*>(source)) {
    absl::Status s = Export(dir, "dataset_index", "<i2", {blend->size()},
                            absl::MakeConstSpan(blend->dataset_index()));
    if (s.ok()) {
      s = Export(dir, "dataset_sample_index", "<i8", {blend->size()},
                 absl::MakeConstSpan(blend->dataset_sample_index()));
    }
    for (size_t d = 0; d < blend->num_datasets() && s.ok(); ++d) {
      s = ExportGpt(blend->dataset(d), dir, absl::StrCat("d", d, "_"));
    }
    if (!s.ok()) return s;
  }
  const int64_t count = std::min(options.export_samples, source->size());
  const int64_t width = config.seq_length + config.add_extra_token;
  std::vector<int64_t> all;
  all.reserve(static_cast<size_t>(count * width));
  for (int64_t i = 0; i < count; ++i) {
    if (absl::Status s = source->GetSample(i, &text); !s.ok()) return s;
    all.insert(all.end(), text.begin(), text.end());
  }
  return Export(dir, "samples", "<i8", {count, width}, absl::MakeConstSpan(all));
}

}  // namespace

absl::Status InspectDataset(const InspectDatasetOptions& options, std::ostream& out) {
  std::unique_ptr<Tokenizer> tokenizer;
  if (HasVocab(options.tokenizer)) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadTokenizer(options.tokenizer);
    if (!t.ok()) return t.status();
    tokenizer = *std::move(t);
  }
  // Weights in a blend are numbers; everything else is a prefix.
  std::vector<std::string> prefixes;
  for (const std::string& item : options.data_path) {
    double unused;
    if (!absl::SimpleAtod(item, &unused)) prefixes.push_back(item);
  }
  if (prefixes.empty()) return absl::InvalidArgumentError("no dataset prefix given");
  for (const std::string& prefix : prefixes) {
    absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(prefix);
    if (!ds.ok()) return ds.status();
    out << "dataset: " << prefix << "\n";
    out << "dtype: " << DTypeName(ds->dtype()) << " (code "
        << int{static_cast<uint8_t>(ds->dtype())} << ")\n";
    out << "sequences: " << ds->num_sequences() << "\n";
    out << "documents: " << ds->num_documents() << "\n";
    out << "tokens: " << ds->total_tokens() << "\n";
    out << "bin bytes: " << ds->bin_file().size() << "\n";
    if (ds->multimodal()) out << "multimodal: yes\n";
    PrintHistogram(*ds, options.histogram_buckets, out);
    if (options.document && prefix == prefixes.front()) {
      if (absl::Status s = PrintDocument(*ds, *options.document, tokenizer.get(), out); !s.ok()) {
        return s;
      }
    }
  }
  if (options.sample || !options.export_dir.empty()) {
    return InspectSamples(options, tokenizer.get(), out);
  }
  return absl::OkStatus();
}

}  // namespace leantron::data
