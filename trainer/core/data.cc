#include "trainer/core/data.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer {

absl::StatusOr<std::unique_ptr<BatchSource>> BatchSource::Create(const DataOptions& options) {
  auto source = std::unique_ptr<BatchSource>(new BatchSource());
  source->opt_ = options;
  if (options.mock) return source;
  data::GptDataConfig config;
  config.data_path = options.data_path;
  config.split = options.split;
  config.seq_length = static_cast<int32_t>(options.seq_length);
  config.seed = options.seed;
  config.num_samples = data::RequestedSamples(options.train_iters, options.eval_interval,
                                              options.eval_iters, options.global_batch);
  config.cache_dir = options.cache_dir;
  absl::StatusOr<data::GptDataSplits> splits = data::BuildGptDatasets(config);
  if (!splits.ok()) return splits.status();
  source->splits_ = std::move(*splits);
  if (!source->splits_.split[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("--split '", options.split, "' leaves no training data"));
  }
  return source;
}

bool BatchSource::has_split(data::SplitKind kind) const {
  return opt_.mock || splits_.split[static_cast<int>(kind)] != nullptr;
}

absl::Status BatchSource::Get(data::SplitKind kind, int64_t first, int64_t count,
                              MicroBatch* mb) const {
  const int64_t s = opt_.seq_length;
  mb->tokens.assign(count * s, 0);
  mb->labels.assign(count * s, -1);
  mb->first_sample = first;
  std::vector<int64_t> text;
  for (int64_t i = 0; i < count; ++i) {
    if (opt_.mock) {
      // Learnable toy sequences: an arithmetic progression per sample, modulo the vocabulary.
      const int64_t sample = first + i + static_cast<int64_t>(kind) * 1000003;
      const uint64_t h = SplitMix64(opt_.seed ^ SplitMix64(static_cast<uint64_t>(sample)));
      const int64_t start = static_cast<int64_t>(h % opt_.vocab_size);
      const int64_t stride = 1 + static_cast<int64_t>((h >> 32) % 3);
      text.resize(s + 1);
      for (int64_t t = 0; t <= s; ++t) text[t] = (start + stride * t) % opt_.vocab_size;
    } else {
      const data::GptSampleSource* split = splits_.split[static_cast<int>(kind)].get();
      if (split == nullptr) return absl::FailedPreconditionError("requested split is empty");
      if (first + i >= split->size()) {
        return absl::OutOfRangeError(absl::StrCat("sample ", first + i, " beyond the ",
                                                  split->size(), " samples built for the split"));
      }
      if (absl::Status st = split->GetSample(first + i, &text); !st.ok()) return st;
    }
    for (int64_t t = 0; t < s; ++t) {
      const int64_t tok = text[t], lab = text[t + 1];
      if (tok >= opt_.vocab_size || lab >= opt_.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", std::max(tok, lab), " in sample ", first + i,
                         " is outside the vocabulary of ", opt_.vocab_size,
                         " (wrong --tokenizer-type or --vocab-size?)"));
      }
      mb->tokens[i * s + t] = tok < 0 ? 0 : static_cast<int32_t>(tok);
      mb->labels[i * s + t] = lab < 0 ? -1 : static_cast<int32_t>(lab);
    }
  }
  ShapeSamples(opt_, count, mb);
  return absl::OkStatus();
}

void ShapeSamples(const DataOptions& o, int64_t count, MicroBatch* mb) {
  const int64_t s = o.seq_length;
  mb->positions.clear();
  mb->documents.clear();
  if (o.eod >= 0 && (o.reset_position_ids || o.reset_attention_mask || o.eod_mask_loss)) {
    if (o.reset_position_ids) mb->positions.resize(count * s);
    if (o.reset_attention_mask) mb->documents.resize(count * s);
    for (int64_t i = 0; i < count; ++i) {
      int64_t start = 0;  // where the current document began
      int32_t document = 0;
      for (int64_t t = 0; t < s; ++t) {
        const int64_t at = i * s + t;
        if (o.reset_position_ids) mb->positions[at] = static_cast<int32_t>(t - start);
        if (o.reset_attention_mask) mb->documents[at] = document;
        if (mb->tokens[at] != o.eod) continue;
        if (o.eod_mask_loss) mb->labels[at] = -1;
        start = t + 1;
        ++document;
      }
    }
  }
  if (o.cp_size <= 1) return;
  const SequenceChunks chunks{s, o.cp_rank, o.cp_size};
  const int64_t local = chunks.local_length();
  auto keep_chunks = [&](std::vector<int32_t>* v) {
    if (v->empty()) return;
    std::vector<int32_t> mine(count * local);
    for (int64_t i = 0; i < count; ++i)
      for (int64_t t = 0; t < local; ++t) mine[i * local + t] = (*v)[i * s + chunks.Position(t)];
    v->swap(mine);
  };
  keep_chunks(&mb->tokens);
  keep_chunks(&mb->labels);
  keep_chunks(&mb->positions);
}

}  // namespace leantron::trainer
