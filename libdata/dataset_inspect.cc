#include "libdata/dataset_inspect.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libdata/indexed_dataset.h"

namespace leantron::data {
namespace {

bool HasVocab(const VocabFiles& v) {
  return !v.tiktoken_file.empty() || (!v.vocab_file.empty() && !v.merge_file.empty());
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

}  // namespace

absl::Status InspectDataset(const InspectDatasetOptions& options, std::ostream& out) {
  absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(options.prefix);
  if (!ds.ok()) return ds.status();
  out << "dataset: " << options.prefix << "\n";
  out << "dtype: " << DTypeName(ds->dtype()) << " (code " << int{static_cast<uint8_t>(ds->dtype())}
      << ")\n";
  out << "sequences: " << ds->num_sequences() << "\n";
  out << "documents: " << ds->num_documents() << "\n";
  out << "tokens: " << ds->total_tokens() << "\n";
  out << "bin bytes: " << ds->bin_file().size() << "\n";
  if (ds->multimodal()) out << "multimodal: yes\n";
  PrintHistogram(*ds, options.histogram_buckets, out);

  if (!options.document) return absl::OkStatus();
  const int64_t k = *options.document;
  if (k < 0 || k >= ds->num_documents()) {
    return absl::OutOfRangeError(
        absl::StrCat("document ", k, " out of range [0, ", ds->num_documents(), ")"));
  }
  std::unique_ptr<Gpt2Tokenizer> tokenizer;
  if (HasVocab(options.vocab)) {
    absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> t = Gpt2Tokenizer::Load(options.vocab);
    if (!t.ok()) return t.status();
    tokenizer = *std::move(t);
  }
  const int64_t first = ds->document_index(k), last = ds->document_index(k + 1);
  out << "document " << k << ": sequences [" << first << ", " << last << ")\n";
  for (int64_t i = first; i < last; ++i) {
    std::vector<int64_t> tokens;
    if (absl::Status s = ds->ReadTokens(i, &tokens); !s.ok()) return s;
    out << "sequence " << i << " (" << tokens.size() << " tokens): " << absl::StrJoin(tokens, " ")
        << "\n";
    if (tokenizer) {
      std::vector<int32_t> ids(tokens.begin(), tokens.end());
      std::string text;
      if (absl::Status s = tokenizer->Decode(ids, &text); !s.ok()) return s;
      out << "text: " << text << "\n";
    }
  }
  return absl::OkStatus();
}

}  // namespace leantron::data
