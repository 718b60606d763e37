#include "libdata/preprocess.h"

#include <simdjson.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libdata/indexed_dataset_builder.h"
#include "libdata/jsonl_reader.h"
#include "libdata/sentence_splitter.h"

namespace leantron::data {
namespace {

// A batch is about this much JSONL, or this many lines, from one file.
constexpr size_t kBatchBytes = 1 << 20;
constexpr size_t kBatchLines = 4096;

enum class LineKind : uint8_t { kDocument, kInvalid, kBlank };

struct KeyOutput {
  std::vector<int32_t> tokens;         // all documents of the batch, back to back
  std::vector<int32_t> lengths;        // one per sequence
  std::vector<int32_t> doc_sequences;  // per document line: how many sequences it has
};

struct Batch {
  uint64_t index = 0;
  size_t file = 0;
  // Lines back to back, each followed by '\n', then simdjson's padding: every line can be
  // parsed in place because readable bytes always follow it.
  std::string data;
  std::vector<std::pair<size_t, size_t>> lines;  // offset, length
  std::vector<int64_t> line_numbers;
  // Filled by a worker.
  std::vector<LineKind> kinds;
  std::vector<std::string> errors;  // one per kInvalid line, in order
  std::vector<KeyOutput> keys;
  absl::Status status;
};

// Per-thread parsing, splitting and tokenizing.
class DocumentEncoder {
 public:
  DocumentEncoder(const PreprocessOptions& options, const Tokenizer& tokenizer,
                  const EncodeOptions& encode, std::unique_ptr<SentenceSplitter> splitter)
      : options_(options),
        encoder_(tokenizer.NewEncoder(encode)),
        eod_(tokenizer.eod_id().value_or(-1)),
        splitter_(std::move(splitter)) {}

  void Process(Batch* batch) {
    batch->kinds.assign(batch->lines.size(), LineKind::kDocument);
    batch->keys.assign(options_.json_keys.size(), KeyOutput());
    for (size_t k = 0; k < batch->lines.size(); ++k) {
      const auto [offset, length] = batch->lines[k];
      std::string_view line(batch->data.data() + offset, length);
      if (absl::StripAsciiWhitespace(absl::string_view(line.data(), line.size())).empty()) {
        batch->kinds[k] = LineKind::kBlank;
        continue;
      }
      std::string error;
      if (!ParseLine(batch->data.data() + offset, length, &error)) {
        batch->kinds[k] = LineKind::kInvalid;
        batch->errors.push_back(std::move(error));
        continue;
      }
      if (absl::Status s = EncodeDocument(batch); !s.ok()) {
        batch->status = s;
        return;
      }
    }
  }

 private:
  // Finds every key's value; on success values_[i] holds the strings of key i.
  bool ParseLine(const char* data, size_t length, std::string* error) {
    simdjson::dom::element doc;
    if (const simdjson::error_code err = parser_.parse(data, length, false).get(doc); err) {
      *error = err == simdjson::UTF8_ERROR
                   ? "invalid UTF-8"
                   : absl::StrCat("malformed JSON: ", simdjson::error_message(err));
      return false;
    }
    simdjson::dom::object object;
    if (doc.get(object)) {
      *error = "not a JSON object";
      return false;
    }
    values_.resize(options_.json_keys.size());
    for (size_t i = 0; i < options_.json_keys.size(); ++i) {
      const std::string& key = options_.json_keys[i];
      values_[i].clear();
      // Python's json.loads keeps the last of duplicate keys, so scan them all.
      simdjson::dom::element value;
      bool found = false;
      for (const simdjson::dom::key_value_pair field : object) {
        if (field.key == key) {
          value = field.value;
          found = true;
        }
      }
      if (!found) {
        *error = absl::StrCat("missing key \"", key, "\"");
        return false;
      }
      std::string_view text;
      simdjson::dom::array array;
      if (!value.get(text)) {
        values_[i].push_back(text);
      } else if (!value.get(array)) {
        for (const simdjson::dom::element item : array) {
          if (item.get(text)) {
            *error = absl::StrCat("key \"", key, "\": list holds a non-string element");
            return false;
          }
          values_[i].push_back(text);
        }
      } else {
        *error = absl::StrCat("key \"", key, "\": value is not a string or a list of strings");
        return false;
      }
    }
    return true;
  }

  absl::Status EncodeDocument(Batch* batch) {
    for (size_t i = 0; i < values_.size(); ++i) {
      KeyOutput& out = batch->keys[i];
      sentences_.clear();
      if (options_.split_sentences) {
        for (const std::string_view text : values_[i]) {
          if (absl::Status s = splitter_->Split(text, &sentences_); !s.ok()) return s;
        }
      } else {
        sentences_ = values_[i];
      }
      int32_t sequences = 0;
      size_t doc_start = out.tokens.size();
      for (const std::string_view sentence : sentences_) {
        const size_t before = out.tokens.size();
        if (absl::Status s = encoder_->Encode(sentence, &out.tokens); !s.ok()) return s;
        const size_t n = out.tokens.size() - before;
        if (n == 0) continue;  // Megatron drops sentences without tokens.
        out.lengths.push_back(static_cast<int32_t>(n));
        ++sequences;
      }
      if (options_.append_eod && out.tokens.size() > doc_start) {
        out.tokens.push_back(eod_);
        ++out.lengths.back();
      }
      out.doc_sequences.push_back(sequences);
    }
    return absl::OkStatus();
  }

  const PreprocessOptions& options_;
  std::unique_ptr<TextEncoder> encoder_;
  const int32_t eod_;
  std::unique_ptr<SentenceSplitter> splitter_;
  simdjson::dom::parser parser_;
  std::vector<std::vector<std::string_view>> values_;
  std::vector<std::string_view> sentences_;
};

// The queues between the reader, the workers and the writer.
struct Pipeline {
  std::mutex mu;
  std::condition_variable work_ready, result_ready, space_free;
  std::deque<std::unique_ptr<Batch>> work;
  std::map<uint64_t, std::unique_ptr<Batch>> results;
  uint64_t produced = 0;
  uint64_t consumed = 0;
  uint64_t max_in_flight = 4;
  bool reader_done = false;
  absl::Status reader_status;
  bool stop = false;
};

void ReadInputs(const std::vector<std::string>& files, Pipeline* p) {
  const auto push = [p](std::unique_ptr<Batch> batch) {
    batch->data.append(simdjson::SIMDJSON_PADDING, '\0');
    std::unique_lock lock(p->mu);
    p->space_free.wait(lock,
                       [p] { return p->stop || p->produced - p->consumed < p->max_in_flight; });
    if (p->stop) return false;
    batch->index = p->produced++;
    p->work.push_back(std::move(batch));
    p->work_ready.notify_one();
    return true;
  };
  absl::Status status;
  for (size_t f = 0; f < files.size() && status.ok(); ++f) {
    absl::StatusOr<std::unique_ptr<LineReader>> reader = LineReader::Open(files[f]);
    if (!reader.ok()) {
      status = reader.status();
      break;
    }
    auto batch = std::make_unique<Batch>();
    batch->file = f;
    for (;;) {
      std::string_view line;
      absl::StatusOr<bool> more = (*reader)->Next(&line);
      if (!more.ok()) {
        status = more.status();
        break;
      }
      if (!*more) break;
      batch->lines.emplace_back(batch->data.size(), line.size());
      batch->line_numbers.push_back((*reader)->line_number());
      batch->data.append(line);
      batch->data.push_back('\n');
      if (batch->data.size() >= kBatchBytes || batch->lines.size() >= kBatchLines) {
        if (!push(std::move(batch))) return;
        batch = std::make_unique<Batch>();
        batch->file = f;
      }
    }
    // Lines read before a decompression error still go through the workers, so that an error
    // earlier in the input is the one reported; nothing is written either way.
    if (!batch->lines.empty() && !push(std::move(batch))) return;
  }
  std::lock_guard lock(p->mu);
  p->reader_done = true;
  p->reader_status = status;
  p->result_ready.notify_all();
  p->work_ready.notify_all();
}

void Work(DocumentEncoder* encoder, Pipeline* p) {
  for (;;) {
    std::unique_ptr<Batch> batch;
    {
      std::unique_lock lock(p->mu);
      p->work_ready.wait(lock, [p] { return p->stop || !p->work.empty() || p->reader_done; });
      if (p->stop || p->work.empty()) return;
      batch = std::move(p->work.front());
      p->work.pop_front();
    }
    encoder->Process(batch.get());
    std::lock_guard lock(p->mu);
    p->results.emplace(batch->index, std::move(batch));
    p->result_ready.notify_all();
  }
}

}  // namespace

std::string PreprocessOutputPrefix(const std::string& output_prefix, const std::string& key,
                                   bool split_sentences) {
  return absl::StrCat(output_prefix, "_", key, "_", split_sentences ? "sentence" : "document");
}

absl::StatusOr<PreprocessStats> PreprocessData(const PreprocessOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.json_keys.empty()) return absl::InvalidArgumentError("no --json-keys");
  if (options.output_prefix.empty()) return absl::InvalidArgumentError("no --output-prefix");
  if (options.workers < 1) return absl::InvalidArgumentError("--workers must be at least 1");
  absl::StatusOr<std::vector<std::string>> files = ExpandInputs(options.inputs);
  if (!files.ok()) return files.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(options.tokenizer);
  if (!tokenizer.ok()) return tokenizer.status();
  if (options.append_eod && !(*tokenizer)->eod_id()) {
    return absl::InvalidArgumentError(absl::StrCat("--append-eod: the tokenizer has no EOD token (",
                                                   (*tokenizer)->Describe(), ")"));
  }
  EncodeOptions encode = (*tokenizer)->megatron_defaults();
  if (options.eod_in_text_is_special) encode.allow_special = *options.eod_in_text_is_special;
  if (!options.include_special_tokens) encode.add_special = false;
  const DType dtype = TokenDTypeForVocabSize((*tokenizer)->vocab_size());

  PreprocessStats stats;
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const std::string& key : options.json_keys) {
    stats.output_prefixes.push_back(
        PreprocessOutputPrefix(options.output_prefix, key, options.split_sentences));
    absl::StatusOr<std::unique_ptr<IndexedDatasetBuilder>> builder =
        IndexedDatasetBuilder::Create(stats.output_prefixes.back(), dtype);
    if (!builder.ok()) return builder.status();
    builders.push_back(*std::move(builder));
  }
  std::vector<std::unique_ptr<DocumentEncoder>> encoders;
  Pipeline p;
  p.max_in_flight = 2 * static_cast<uint64_t>(options.workers) + 2;
  std::vector<std::thread> threads;
  const auto shutdown = [&] {
    {
      std::lock_guard lock(p.mu);
      p.stop = true;
    }
    p.work_ready.notify_all();
    p.space_free.notify_all();
    for (std::thread& t : threads) t.join();
    threads.clear();
  };

  // Each worker gets its encoder as it starts. The system may refuse a thread, or the memory for
  // an encoder (a huge --workers): a clean error, nothing left behind.
  absl::Status setup;
  try {
    threads.emplace_back(ReadInputs, std::cref(*files), &p);
    for (int w = 0; w < options.workers && setup.ok(); ++w) {
      std::unique_ptr<SentenceSplitter> splitter;
      if (options.split_sentences) {
        absl::StatusOr<std::unique_ptr<SentenceSplitter>> s =
            SentenceSplitter::Create(options.keep_newlines);
        if (!s.ok()) {
          setup = s.status();
          break;
        }
        splitter = *std::move(s);
      }
      encoders.push_back(
          std::make_unique<DocumentEncoder>(options, **tokenizer, encode, std::move(splitter)));
      threads.emplace_back(Work, encoders.back().get(), &p);
    }
  } catch (const std::exception& e) {  // std::system_error, std::bad_alloc
    setup = absl::ResourceExhaustedError(absl::StrCat("cannot start thread ", threads.size() + 1,
                                                      " of ", options.workers + 1, " (--workers ",
                                                      options.workers, "): ", e.what()));
  }
  if (!setup.ok()) {
    shutdown();
    return setup;
  }
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  absl::Status status;
  bool bar_drawn = false;
  double next_bar = 0.25;
  for (;;) {
    std::unique_ptr<Batch> batch;
    {
      std::unique_lock lock(p.mu);
      p.result_ready.wait(lock, [&] {
        return p.results.count(p.consumed) > 0 || (p.reader_done && p.consumed == p.produced);
      });
      auto it = p.results.find(p.consumed);
      if (it == p.results.end()) {
        status = p.reader_status;
        break;
      }
      batch = std::move(it->second);
      p.results.erase(it);
      ++p.consumed;
      p.space_free.notify_one();
    }
    if (!batch->status.ok()) {
      status = batch->status;
      break;
    }
    std::vector<size_t> token_pos(builders.size(), 0), length_pos(builders.size(), 0);
    size_t doc = 0, error = 0;
    for (size_t k = 0; k < batch->lines.size() && status.ok(); ++k) {
      stats.input_bytes += static_cast<int64_t>(batch->lines[k].second + 1);
      if (batch->kinds[k] == LineKind::kBlank) continue;
      if (batch->kinds[k] == LineKind::kInvalid) {
        const std::string& file = (*files)[batch->file];
        const std::string where =
            absl::StrCat(file == "-" ? "(stdin)" : file, ":", batch->line_numbers[k], ": ");
        if (!options.skip_invalid) {
          status = absl::InvalidArgumentError(absl::StrCat(
              where, batch->errors[error], " (use --skip-invalid to skip such lines)"));
          break;
        }
        if (stats.invalid_skipped++ == 0) stats.first_invalid = where + batch->errors[error];
        ++error;
        continue;
      }
      for (size_t i = 0; i < builders.size() && status.ok(); ++i) {
        const KeyOutput& out = batch->keys[i];
        const int32_t sequences = out.doc_sequences[doc];
        int64_t n = 0;
        for (int32_t s = 0; s < sequences; ++s) n += out.lengths[length_pos[i] + s];
        status = builders[i]->AddDocument(
            absl::MakeConstSpan(out.tokens.data() + token_pos[i], static_cast<size_t>(n)),
            absl::MakeConstSpan(out.lengths.data() + length_pos[i],
                                static_cast<size_t>(sequences)));
        token_pos[i] += static_cast<size_t>(n);
        length_pos[i] += static_cast<size_t>(sequences);
        stats.tokens += n;
      }
      ++doc;
      ++stats.documents;
      if (options.log != nullptr && options.log_interval > 0 &&
          stats.documents % options.log_interval == 0) {
        const double s = elapsed();
        *options.log << (bar_drawn ? "\r\033[K" : "")
                     << absl::StrFormat("Processed %d documents (%.2f docs/s, %.2f MB/s).\n",
                                        stats.documents, stats.documents / s,
                                        stats.input_bytes / s / 1024 / 1024)
                     << std::flush;
        bar_drawn = false;
      }
    }
    if (!status.ok()) break;
    if (options.progress_bar && options.log != nullptr && elapsed() >= next_bar) {
      const double s = elapsed();
      next_bar = s + 0.25;
      *options.log << absl::StrFormat("\r\033[K%d documents, %.1f MB, %.1f MB/s, %d tokens",
                                      stats.documents, stats.input_bytes / 1048576.0,
                                      stats.input_bytes / s / 1048576.0, stats.tokens)
                   << std::flush;
      bar_drawn = true;
    }
  }
  if (bar_drawn) *options.log << "\n";
  shutdown();
  if (!status.ok()) return status;  // Builders are abandoned: no output file appears.
  for (auto& builder : builders) {
    if (absl::Status s = builder->Finalize(); !s.ok()) return s;
  }
  stats.seconds = elapsed();
  return stats;
}

}  // namespace leantron::data
