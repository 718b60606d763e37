#include "libdata/gpt_dataset.h"

#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <new>
#include <regex>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libdata/gpt_index_cache.h"
#include "libdata/numpy_random.h"

namespace leantron::data {
namespace {

// numpy's pairwise summation for float64 (what numpy.sum does on a contiguous vector).
double PairwiseSum(const double* a, size_t n) {
  if (n < 8) {
    double res = 0.;
    for (size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    size_t i;
    for (i = 8; i < n - (n % 8); i += 8) {
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return PairwiseSum(a, n2) + PairwiseSum(a + n2, n - n2);
}

// Python's // for the non-negative operands used here (C++ / truncates toward zero).
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// Megatron's helpers.build_sample_idx, statement for statement.
std::vector<int64_t> BuildSampleIndex(const IndexedDataset& ds, const std::vector<int32_t>& doc_idx,
                                      int32_t seq_length, int64_t num_epochs,
                                      int64_t tokens_per_epoch, bool drop_last, int32_t extra) {
  int64_t num_samples;
  if (drop_last) {
    num_samples = (num_epochs * tokens_per_epoch - extra) / seq_length;
  } else {
    num_samples = static_cast<int64_t>(
        std::ceil(static_cast<float>(num_epochs * tokens_per_epoch - extra) / seq_length));
  }
  std::vector<int64_t> sample_idx(2 * static_cast<size_t>(num_samples + 1));
  int64_t sample_idx_index = 0;
  int64_t document_idx_index = 0;
  int64_t doc_offset = 0;
  sample_idx[0] = document_idx_index;
  sample_idx[1] = doc_offset;
  ++sample_idx_index;
  const int64_t last = static_cast<int64_t>(doc_idx.size()) - 1;
  while (sample_idx_index <= num_samples) {
    int64_t remaining_seq_length = seq_length + extra;
    while (remaining_seq_length != 0) {
      const int32_t document_index = doc_idx[static_cast<size_t>(document_idx_index)];
      const int64_t document_length = ds.sequence_length(document_index) - doc_offset;
      remaining_seq_length -= document_length;
      if (remaining_seq_length <= 0) {
        doc_offset += (remaining_seq_length + document_length - extra);
        remaining_seq_length = 0;
      } else {
        if (document_idx_index == last) {
          doc_offset = ds.sequence_length(doc_idx[static_cast<size_t>(document_idx_index)]) - extra;
          break;
        }
        ++document_idx_index;
        doc_offset = 0;
      }
    }
    sample_idx[2 * static_cast<size_t>(sample_idx_index)] = document_idx_index;
    sample_idx[2 * static_cast<size_t>(sample_idx_index) + 1] = doc_offset;
    ++sample_idx_index;
  }
  return sample_idx;
}

// _build_document_index without the separate-final-epoch recursion: tile, then shuffle.
std::vector<int32_t> TiledShuffled(int64_t begin, int64_t end, int64_t epochs,
                                   NumpyRandomState* rng) {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>((end - begin) * epochs));
  for (int64_t e = 0; e < epochs; ++e) {
    for (int64_t i = begin; i < end; ++i) out.push_back(static_cast<int32_t>(i));
  }
  rng->Shuffle(absl::MakeSpan(out));
  return out;
}

std::vector<int64_t> ArangeShuffled(int64_t begin, int64_t end, NumpyRandomState* rng) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i) out.push_back(i);
  rng->Shuffle(absl::MakeSpan(out));
  return out;
}

// Every index a sample lookup follows stays inside its array and the dataset, so that even a
// cache that passed its checksum by chance cannot make GetSample read out of bounds.
bool IndicesInRange(const IndexedDataset& ds, const GptIndexParams& p, const MappedGptIndices& m) {
  for (const int32_t d : m.document_index) {
    if (d < p.begin || d >= p.end) return false;
  }
  const size_t rows = m.sample_index.size() / 2;
  if (m.sample_index.size() % 2 != 0 || rows == 0) return false;
  const int64_t docs = static_cast<int64_t>(m.document_index.size());
  for (size_t r = 0; r < rows; ++r) {
    const int64_t pos = m.sample_index[2 * r], offset = m.sample_index[2 * r + 1];
    if (pos < 0 || pos >= docs) return false;
    if (offset < -1 || offset > ds.sequence_length(m.document_index[pos])) return false;
  }
  for (const int64_t j : m.shuffle_index) {
    if (j < 0 || static_cast<size_t>(j) + 1 >= rows) return false;
  }
  return true;
}

absl::StatusOr<std::string> DatasetIdentity(const IndexedDataset& ds) {
  // Content, not path or mtime: a copied dataset still hits, a rewritten one misses.
  const MappedFile& idx = ds.idx_file();
  uLong crc = crc32_z(0L, Z_NULL, 0);
  crc = crc32_z(crc, idx.data(), idx.size());
  return absl::StrCat("idx_bytes=", idx.size(), " idx_crc32=", crc,
                      " bin_bytes=", ds.bin_file().size());
}

}  // namespace

std::vector<double> NormalizeWeights(const std::vector<double>& weights) {
  const double sum = 0.0 + PairwiseSum(weights.data(), weights.size());
  std::vector<double> out(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) out[i] = weights[i] / sum;
  return out;
}

absl::StatusOr<std::array<double, 3>> ParseSplit(const std::string& split) {
  static const std::regex kNumber("[.0-9]+");
  std::vector<double> values;
  for (auto it = std::sregex_iterator(split.begin(), split.end(), kNumber);
       it != std::sregex_iterator(); ++it) {
    double v;
    if (!absl::SimpleAtod(it->str(), &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--split \"", split, "\": cannot parse \"", it->str(), "\" as a number"));
    }
    values.push_back(v);
  }
  if (values.size() > 3) {
    return absl::InvalidArgumentError(absl::StrCat("--split \"", split, "\": more than 3 numbers"));
  }
  values.resize(3, 0.0);
  if (values[0] + values[1] + values[2] <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--split \"", split, "\": sums to zero"));
  }
  const std::vector<double> w = NormalizeWeights(values);
  return std::array<double, 3>{w[0], w[1], w[2]};
}

std::array<std::optional<std::pair<double, double>>, 3> SplitMatrix(
    const std::array<double, 3>& w) {
  std::array<std::optional<std::pair<double, double>>, 3> out;
  double lo = 0;
  for (int i = 0; i < 3; ++i) {
    const double hi = lo + w[i];
    if (hi > lo) out[i] = std::make_pair(lo, hi);  // Megatron: min(hi) <= max(lo) -> None
    lo = hi;
  }
  return out;
}

std::pair<int64_t, int64_t> SplitRange(const std::pair<double, double>& b, int64_t n) {
  return {static_cast<int64_t>(std::nearbyint(b.first * static_cast<double>(n))),
          static_cast<int64_t>(std::nearbyint(b.second * static_cast<double>(n)))};
}

std::array<int64_t, 3> RequestedSamples(int64_t train_iters, int64_t eval_interval,
                                        int64_t eval_iters, int64_t global_batch_size) {
  return {train_iters * global_batch_size,
          (train_iters / eval_interval + 1) * eval_iters * global_batch_size,
          eval_iters * global_batch_size};
}

absl::StatusOr<GptIndices> BuildGptIndices(const IndexedDataset& ds, const GptIndexParams& p) {
  if (p.begin < 0 || p.end > ds.num_sequences() || p.begin >= p.end) {
    return absl::InvalidArgumentError(absl::StrCat(ds.prefix(), ": split range [", p.begin, ", ",
                                                   p.end, ") is empty or outside [0, ",
                                                   ds.num_sequences(), ")"));
  }
  if (p.seq_length <= 1) return absl::InvalidArgumentError("seq_length must be > 1");
  if (p.add_extra_token != 0 && p.add_extra_token != 1) {
    return absl::InvalidArgumentError("add_extra_token must be 0 or 1");
  }
  const int64_t S = p.seq_length, X = p.add_extra_token;
  int64_t T = 0;
  for (int64_t i = p.begin; i < p.end; ++i) T += ds.sequence_length(i);
  if (T <= 1) {
    return absl::InvalidArgumentError(absl::StrCat(ds.prefix(), ": split [", p.begin, ", ", p.end,
                                                   ") has ", T, " tokens; cannot make samples"));
  }
  GptIndices out;
  // _get_num_epochs: the fewest epochs whose tokens cover the request.
  int64_t epochs = 1;
  if (p.num_samples) {
    if (*p.num_samples < 0) return absl::InvalidArgumentError("negative num_samples");
    int64_t requested;
    if (__builtin_mul_overflow(*p.num_samples, S, &requested) ||
        __builtin_add_overflow(requested, X, &requested)) {
      return absl::InvalidArgumentError(absl::StrCat(
          ds.prefix(), ": ", *p.num_samples, " samples of ", S, " tokens overflow a 64-bit count"));
    }
    if (requested > T) epochs = requested / T + (requested % T != 0);
  }
  out.num_epochs = epochs;
  // The arrays are built in memory: refuse a request this machine cannot hold, with the numbers,
  // rather than die of bad_alloc (or be killed) part way.
  {
    const double rows = static_cast<double>(p.end - p.begin) * static_cast<double>(epochs);
    const double samples = p.num_samples ? static_cast<double>(*p.num_samples) : rows;
    const double bytes = 4.0 * rows + 24.0 * samples;
    const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                          static_cast<double>(::sysconf(_SC_PAGESIZE));
    if (bytes > memory) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s: %d samples of %d tokens (%d epochs of the split's %d tokens) need %.1f GiB of "
          "sample index, more than this machine's %.1f GiB of memory; ask for fewer samples "
          "(--train-iters, --global-batch-size, --num-samples)",
          ds.prefix(), p.num_samples.value_or(0), S, epochs, T, bytes / (1 << 30),
          memory / (1 << 30)));
    }
  }
  int64_t n_sans = 0;
  if (epochs > 1) {
    n_sans = FloorDiv((epochs - 1) * T - X, S);
    const int64_t n_final = *p.num_samples - n_sans;
    const int64_t n_per_epoch = FloorDiv(T - X, S);
    out.separate_final_epoch =
        n_final < static_cast<int64_t>(0.80 * static_cast<double>(n_per_epoch));
  }
  NumpyRandomState rng(p.seed);
  if (!out.separate_final_epoch) {
    out.document_index = TiledShuffled(p.begin, p.end, epochs, &rng);
  } else {
    out.document_index = TiledShuffled(p.begin, p.end, epochs - 1, &rng);
    const std::vector<int32_t> last = TiledShuffled(p.begin, p.end, 1, &rng);
    out.document_index.insert(out.document_index.end(), last.begin(), last.end());
  }
  const bool drop_last = p.drop_last_partial_sequence;
  out.sample_index = BuildSampleIndex(ds, out.document_index, p.seq_length, epochs, T, drop_last,
                                      p.add_extra_token);
  const int64_t total = static_cast<int64_t>(out.sample_index.size() / 2) - 1;
  const int64_t first = out.separate_final_epoch ? n_sans : total;
  out.shuffle_index = ArangeShuffled(0, first, &rng);
  if (first != total) {
    const std::vector<int64_t> rest = ArangeShuffled(first, total, &rng);
    out.shuffle_index.insert(out.shuffle_index.end(), rest.begin(), rest.end());
  }
  return out;
}

absl::StatusOr<std::unique_ptr<GptDataset>> GptDataset::Build(
    std::shared_ptr<const IndexedDataset> dataset, const GptIndexParams& params,
    const std::string& cache_dir) {
  std::unique_ptr<GptDataset> gpt(new GptDataset());
  gpt->dataset_ = std::move(dataset);
  gpt->params_ = params;
  const IndexedDataset& ds = *gpt->dataset_;
  std::string key;
  if (!cache_dir.empty()) {
    absl::StatusOr<std::string> identity = DatasetIdentity(ds);
    if (!identity.ok()) return identity.status();
    key = absl::StrCat("leantron GPTDataset indices v1\n", *identity, "\nbegin=", params.begin,
                       "\nend=", params.end, "\nnum_samples=",
                       params.num_samples ? absl::StrCat(*params.num_samples) : "none",
                       "\nseq_length=", params.seq_length, "\nseed=", params.seed,
                       "\nadd_extra_token=", params.add_extra_token,
                       "\ndrop_last_partial_sequence=", params.drop_last_partial_sequence, "\n");
    const std::string base = std::filesystem::path(ds.prefix()).filename().string();
    gpt->cache_path_ =
        absl::StrFormat("%s/%s.gpt-%016x.idxcache", cache_dir, base, StableHash64(key));
    std::optional<MappedGptIndices> cached = LoadGptIndexCache(gpt->cache_path_, key);
    if (cached && !IndicesInRange(ds, params, *cached)) cached.reset();  // rebuilt below
    if (cached) {
      gpt->mapped_ = std::move(cached->file);
      gpt->document_index_ = cached->document_index;
      gpt->sample_index_ = cached->sample_index;
      gpt->shuffle_index_ = cached->shuffle_index;
      gpt->num_epochs_ = cached->num_epochs;
      gpt->separate_final_epoch_ = cached->separate_final_epoch;
      gpt->loaded_from_cache_ = true;
      return gpt;
    }
  }
  absl::StatusOr<GptIndices> built;
  try {
    built = BuildGptIndices(ds, params);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(ds.prefix(),
                     ": out of memory building the sample index; ask for fewer "
                     "samples (--train-iters, --global-batch-size, --num-samples)"));
  }
  if (!built.ok()) return built.status();
  gpt->owned_ = *std::move(built);
  gpt->num_epochs_ = gpt->owned_.num_epochs;
  gpt->separate_final_epoch_ = gpt->owned_.separate_final_epoch;
  if (!cache_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cache_dir, ec);
    // A read-only data directory is not an error: the arrays stay in memory.
    if (SaveGptIndexCache(gpt->cache_path_, key, gpt->owned_).ok()) {
      if (std::optional<MappedGptIndices> cached = LoadGptIndexCache(gpt->cache_path_, key)) {
        gpt->mapped_ = std::move(cached->file);
        gpt->document_index_ = cached->document_index;
        gpt->sample_index_ = cached->sample_index;
        gpt->shuffle_index_ = cached->shuffle_index;
        gpt->owned_ = GptIndices();
        return gpt;
      }
    }
    gpt->cache_path_.clear();
  }
  gpt->document_index_ = gpt->owned_.document_index;
  gpt->sample_index_ = gpt->owned_.sample_index;
  gpt->shuffle_index_ = gpt->owned_.shuffle_index;
  return gpt;
}

absl::Status GptDataset::GetSample(int64_t i, std::vector<int64_t>* text) const {
  if (i < 0 || i >= size()) {
    return absl::OutOfRangeError(absl::StrCat("sample ", i, " out of range [0, ", size(), ")"));
  }
  const int64_t X = params_.add_extra_token;
  const size_t j = static_cast<size_t>(shuffle_index_[static_cast<size_t>(i)]);
  const int64_t beg = sample_index_[2 * j], beg_offset = sample_index_[2 * j + 1];
  const int64_t end = sample_index_[2 * j + 2], end_offset = sample_index_[2 * j + 3];
  text->clear();
  const IndexedDataset& ds = *dataset_;
  if (beg == end) {
    if (absl::Status s =
            ds.ReadTokens(document_index_[beg], beg_offset, end_offset - beg_offset + X, text);
        !s.ok()) {
      return s;
    }
  } else {
    for (int64_t k = beg; k <= end; ++k) {
      const int32_t seq = document_index_[static_cast<size_t>(k)];
      const int64_t offset = k > beg ? 0 : beg_offset;
      const int64_t length = k < end ? ds.sequence_length(seq) - offset : end_offset + X;
      if (absl::Status s = ds.ReadTokens(seq, offset, length, text); !s.ok()) return s;
    }
  }
  const size_t want = static_cast<size_t>(params_.seq_length + X);
  if (text->size() < want) text->resize(want, -1);  // Megatron's _PAD_TOKEN_ID
  return absl::OkStatus();
}

void BuildBlendingIndices(const std::vector<double>& weights, int64_t size,
                          std::vector<int16_t>* dataset_index,
                          std::vector<int64_t>* dataset_sample_index) {
  const size_t n = weights.size();
  std::vector<int64_t> current(n, 0);
  dataset_index->assign(static_cast<size_t>(size), 0);
  dataset_sample_index->assign(static_cast<size_t>(size), 0);
  for (int64_t sample = 0; sample < size; ++sample) {
    const double x = std::max(static_cast<double>(sample), 1.0);
    size_t best = 0;
    double max_error = weights[0] * x - static_cast<double>(current[0]);
    for (size_t d = 1; d < n; ++d) {
      const double error = weights[d] * x - static_cast<double>(current[d]);
      if (error > max_error) {
        max_error = error;
        best = d;
      }
    }
    (*dataset_index)[static_cast<size_t>(sample)] = static_cast<int16_t>(best);
    (*dataset_sample_index)[static_cast<size_t>(sample)] = current[best];
    ++current[best];
  }
}

absl::StatusOr<std::unique_ptr<BlendedGptDataset>> BlendedGptDataset::Build(
    std::vector<std::unique_ptr<GptDataset>> datasets, const std::vector<double>& weights,
    int64_t size) {
  if (datasets.empty() || datasets.size() != weights.size() || datasets.size() >= 32767) {
    return absl::InvalidArgumentError("a blend needs one positive weight per dataset");
  }
  for (const double w : weights) {
    if (!(w > 0)) return absl::InvalidArgumentError("blend weights must be positive");
  }
  auto blended = std::make_unique<BlendedGptDataset>();
  BuildBlendingIndices(NormalizeWeights(weights), size, &blended->dataset_index_,
                       &blended->dataset_sample_index_);
  std::vector<int64_t> counts(datasets.size(), 0);
  for (const int16_t d : blended->dataset_index_) ++counts[static_cast<size_t>(d)];
  for (size_t d = 0; d < datasets.size(); ++d) {
    if (counts[d] > datasets[d]->size()) {
      return absl::FailedPreconditionError(absl::StrCat("the blend requests ", counts[d],
                                                        " samples from dataset ", d,
                                                        " which has only ", datasets[d]->size()));
    }
  }
  blended->datasets_ = std::move(datasets);
  return blended;
}

absl::Status BlendedGptDataset::GetSample(int64_t i, std::vector<int64_t>* text) const {
  if (i < 0 || i >= size()) {
    return absl::OutOfRangeError(absl::StrCat("sample ", i, " out of range [0, ", size(), ")"));
  }
  const size_t k = static_cast<size_t>(i);
  return datasets_[static_cast<size_t>(dataset_index_[k])]->GetSample(dataset_sample_index_[k],
                                                                      text);
}

}  // namespace leantron::data
