#include "libckpt/tp_shard_source.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_join.h"
#include "libckpt/strings.h"
#include "libckpt/zip_archive.h"

namespace leantron::ckpt {

void TpShardSource::AddShard(TensorKind kind, const std::string& name, int tp_rank,
                             ShardRef shard) {
  std::vector<ShardRef>& ranks = shards_[static_cast<int>(kind)][name];
  if (ranks.size() < static_cast<size_t>(metadata_.parallel.tp))
    ranks.resize(metadata_.parallel.tp);
  ranks[tp_rank] = shard;
}

std::optional<std::pair<std::string, int>> TpShardSource::FirstMissing(TensorKind kind) const {
  const auto& by_name = shards_[static_cast<int>(kind)];
  for (const ParamSpec& spec : layout_.params()) {
    if (!spec.tied_to.empty()) continue;
    auto it = by_name.find(spec.name);
    for (int tp = 0; tp < metadata_.parallel.tp; ++tp) {
      if (it == by_name.end() || static_cast<size_t>(tp) >= it->second.size() ||
          it->second[tp].archive == nullptr) {
        return std::make_pair(spec.name, tp);
      }
    }
  }
  return std::nullopt;
}

absl::Status TpShardSource::ReadFull(const ParamSpec& target, TensorKind kind, Tensor* out) {
  size_t at = 0;
  auto begin = [&](DType dtype) {
    out->Reset(dtype, target.shape);
    return absl::OkStatus();
  };
  auto append = [&](std::span<const std::byte> piece) {
    std::memcpy(out->data.data() + at, piece.data(), piece.size());
    at += piece.size();
    return absl::OkStatus();
  };
  return StreamFull(target, kind, {begin, append});
}

absl::Status TpShardSource::StreamFull(const ParamSpec& target, TensorKind kind,
                                       const FullTensorSink& sink) {
  const bool optimizer = kind != TensorKind::kParam;
  if (optimizer && !metadata_.has_optimizer) {
    return absl::FailedPreconditionError(
        Cat(iteration_dir_, ": checkpoint has no optimizer state"));
  }
  const std::string& canonical = target.tied_to.empty() ? target.name : target.tied_to;
  const ParamSpec* source = layout_.Find(canonical);
  const auto& by_name = shards_[static_cast<int>(kind)];
  auto it = by_name.find(canonical);
  if (source == nullptr || !source->tied_to.empty() || it == by_name.end()) {
    return absl::NotFoundError(
        Cat(iteration_dir_, ": checkpoint has no parameter '", canonical, "'"));
  }
  const DType dtype = optimizer ? DType::kF32 : metadata_.config.params_dtype;
  const size_t element_size = DTypeSize(dtype);
  if (source->shape != target.shape &&
      (source->split != TpSplit::kVocabRows || target.shape.size() != 2 ||
       source->shape[1] != target.shape[1])) {
    return absl::InvalidArgumentError(Cat(iteration_dir_, ": parameter '", canonical,
                                          "' has shape [", absl::StrJoin(source->shape, ","),
                                          "], requested [", absl::StrJoin(target.shape, ","),
                                          "]: the checkpoint's model config differs"));
  }
  // Rows of the target beyond the source's (a larger vocabulary padding) are zero; the source's
  // rows beyond the target's are not copied.
  const size_t source_bytes = static_cast<size_t>(NumElements(source->shape)) * element_size;
  const size_t target_bytes = static_cast<size_t>(NumElements(target.shape)) * element_size;
  const std::vector<ShardRef>& shards = it->second;
  const int ranks = source->split == TpSplit::kReplicated ? 1 : metadata_.parallel.tp;

  // Records the copy reads whole, front to back, are checked on the way (`crc` over the bytes
  // read so far); every other record of the parameter (replicated copies included) up front.
  struct Check {
    bool streamed = false;
    uint32_t crc = 0;
    size_t done = 0;  // Bytes of the record read (the copy reads them in order).
  };
  std::vector<Check> checks(shards.size());
  if (verify_storages_) {
    for (size_t tp = 0; tp < shards.size(); ++tp) {
      const ShardRef& shard = shards[tp];
      if (shard.archive == nullptr || shard.archive->StorageVerified(shard.storage_key)) continue;
      auto record = shard.archive->StorageRecord(shard.storage_key);
      if (!record.ok()) return record.status();
      if (static_cast<int>(tp) < ranks && record->first.data() == shard.data.data() &&
          record->first.size() == shard.data.size()) {
        checks[tp].streamed = true;
      } else if (auto s = shard.archive->VerifyStorage(shard.storage_key); !s.ok()) {
        return s;
      }
    }
  }

  if (auto s = sink.begin(dtype); !s.ok()) return s;
  // Where each shard's pages are dropped up to, by the sink for the pieces it gets as views and by
  // the helper thread for the bytes it gathers: behind each, so that no page about to be used is
  // dropped (a pwrite from a dropped page of a view takes the kernel's slow path of short copies;
  // only the piece that straddles two ranks of a dim-0 split, gathered, can drop views of the
  // first still in flight), and only where 2 MiB are passed (each madvise stops the other
  // thread's CPU to flush its TLB). The rest goes when the tensor is done.
  std::vector<const std::byte*> released(ranks), gathered(ranks);
  for (int tp = 0; tp < ranks; ++tp) released[tp] = gathered[tp] = shards[tp].data.data();
  // Piece i is bytes [i * kStreamPiece, ...) of the full tensor, made in the helper thread, which
  // alone touches `checks` and `gathered` until RunReadAhead returns.
  auto make_piece = [&](size_t index, Piece& slot) -> absl::Status {
    struct Run {
      size_t full_at, shard_at, n;
    };
    struct Part {
      const ShardRef* shard;
      int tp;
      std::vector<Run> runs;
    };
    const size_t at = index * kStreamPiece;
    const size_t end = std::min(target_bytes, at + kStreamPiece);
    const size_t copy_end = std::min(end, source_bytes);
    std::vector<Part> parts;
    for (int tp = 0; tp < ranks && at < copy_end; ++tp) {
      Part part{&shards[tp], tp, {}};
      layout_.ForEachRunIn(*source, tp, element_size, at, copy_end,
                           [&](size_t full_at, size_t shard_at, size_t n) {
                             part.runs.push_back({full_at, shard_at, n});
                           });
      if (!part.runs.empty()) parts.push_back(std::move(part));
    }
    // A part's runs are one contiguous range of its shard (ModelLayout::ForEachRunIn).
    auto range = [](const Part& part) {
      const size_t first = part.runs.front().shard_at;
      return part.shard->data.subspan(first,
                                      part.runs.back().shard_at + part.runs.back().n - first);
    };
    auto check = [&](const Part& part, std::span<const std::byte> bytes) -> absl::Status {
      Check& c = checks[part.tp];
      if (!c.streamed) return absl::OkStatus();
      if (bytes.data() != part.shard->data.data() + c.done) {
        return absl::InternalError(
            Cat(part.shard->archive->source(), ": '", canonical, "' was not read in order"));
      }
      c.crc = Crc32(c.crc, bytes);
      c.done += bytes.size();
      return absl::OkStatus();
    };
    // Most pieces are one run of one shard (dim-0 splits, replicated tensors): handed on as a view
    // of the mapping, whose pages go once the sink is done with them.
    if (parts.size() == 1 && parts[0].runs.size() == 1 && copy_end == end) {
      slot.view = range(parts[0]);
      slot.mapped = parts[0].shard->archive;
      slot.tp = parts[0].tp;
      return check(parts[0], slot.view);
    }
    slot.buffer.Reserve(kStreamPiece);
    std::byte* piece = slot.buffer.data();
    for (const Part& part : parts) {
      const std::span<const std::byte> bytes = range(part);
      if (auto s = check(part, bytes); !s.ok()) return s;
      const size_t first = part.runs.front().shard_at;
      for (const Run& run : part.runs) {
        std::memcpy(piece + (run.full_at - at), bytes.data() + (run.shard_at - first), run.n);
      }
      const std::byte* done = bytes.data() + bytes.size();
      part.shard->archive->ReleaseBehind({gathered[part.tp], done});
      gathered[part.tp] = done;
    }
    if (copy_end < end) {
      const size_t zero_from = std::max(at, copy_end);
      std::memset(piece + (zero_from - at), 0, end - zero_from);
    }
    slot.view = {piece, end - at};
    slot.mapped = nullptr;
    return absl::OkStatus();
  };
  pieces_.resize(kPiecesInFlight);
  absl::Status status =
      RunReadAhead((target_bytes + kStreamPiece - 1) / kStreamPiece, pieces_.size(),
                   [&](size_t index, size_t slot) { return make_piece(index, pieces_[slot]); },
                   [&](size_t, size_t slot) {
                     const Piece& piece = pieces_[slot];
                     if (auto s = sink.append(piece.view); !s.ok()) return s;
                     if (piece.mapped != nullptr) {
                       const std::byte* end = piece.view.data() + piece.view.size();
                       piece.mapped->ReleaseBehind({released[piece.tp], end});
                       released[piece.tp] = end;
                     }
                     return absl::OkStatus();
                   });
  // A record's bytes the copy did not need (padding rows beyond the target's) still count.
  for (size_t tp = 0; tp < shards.size() && status.ok(); ++tp) {
    Check& check = checks[tp];
    if (!check.streamed) continue;
    const ShardRef& shard = shards[tp];
    for (size_t n; check.done < shard.data.size(); check.done += n) {
      n = std::min(kStreamPiece, shard.data.size() - check.done);
      check.crc = Crc32(check.crc, shard.data.subspan(check.done, n));
      shard.archive->ReleaseBehind(shard.data.subspan(0, check.done + n));
    }
    status = shard.archive->CheckStorageCrc(shard.storage_key, check.crc);
  }
  for (int tp = 0; tp < ranks; ++tp) shards[tp].archive->Release(shards[tp].data);
  if (!status.ok()) return status;
  return absl::OkStatus();
}

}  // namespace leantron::ckpt
