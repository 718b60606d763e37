// Reading the tensors of a Megatron `torch_dist` checkpoint (megatron_dist_reader.h).
#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_join.h"
#include "libckpt/megatron_dist_reader.h"
#include "libckpt/read_ahead.h"
#include "libckpt/strings.h"

namespace leantron::ckpt {
namespace {

namespace stdfs = std::filesystem;

int64_t Volume(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

// Copies the part of a chunk (row-major `chunk_sizes` at global `chunk_offsets`) that lies in the
// region (row-major `region_sizes` at `region_offsets`) into `dst`; returns the elements copied.
int64_t CopyIntersection(std::span<const std::byte> src, const std::vector<int64_t>& chunk_offsets,
                         const std::vector<int64_t>& chunk_sizes, std::span<std::byte> dst,
                         const std::vector<int64_t>& region_offsets,
                         const std::vector<int64_t>& region_sizes, size_t element) {
  const size_t n = chunk_sizes.size();
  if (n == 0) {
    std::memcpy(dst.data(), src.data(), element);
    return 1;
  }
  std::vector<int64_t> lo(n), hi(n);
  for (size_t d = 0; d < n; ++d) {
    lo[d] = std::max(chunk_offsets[d], region_offsets[d]);
    hi[d] = std::min(chunk_offsets[d] + chunk_sizes[d], region_offsets[d] + region_sizes[d]);
    if (lo[d] >= hi[d]) return 0;
  }
  const int64_t row = hi[n - 1] - lo[n - 1];
  std::vector<int64_t> index(lo.begin(), lo.end() - 1);
  int64_t copied = 0;
  while (true) {
    int64_t s = 0, t = 0;
    for (size_t d = 0; d + 1 < n; ++d) {
      s = s * chunk_sizes[d] + (index[d] - chunk_offsets[d]);
      t = t * region_sizes[d] + (index[d] - region_offsets[d]);
    }
    s = s * chunk_sizes[n - 1] + (lo[n - 1] - chunk_offsets[n - 1]);
    t = t * region_sizes[n - 1] + (lo[n - 1] - region_offsets[n - 1]);
    std::memcpy(dst.data() + t * element, src.data() + s * element, row * element);
    copied += row;
    size_t d = n - 1;
    while (d > 0) {
      --d;
      if (++index[d] < hi[d]) break;
      index[d] = lo[d];
      if (d == 0) return copied;
    }
    if (n == 1) return copied;
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<const MappedFile>> MegatronDistReader::File(
    const std::string& name) {
  auto it = files_.find(name);
  if (it != files_.end()) return it->second;
  auto file = MappedFile::Open((stdfs::path(dir_) / name).string());
  if (!file.ok()) return file.status();
  files_.emplace(name, *file);
  return *file;
}

absl::StatusOr<std::unique_ptr<TorchArchive>> MegatronDistReader::Item(const DcpStorage& storage) {
  auto file = File(storage.file);
  if (!file.ok()) return file.status();
  return TorchArchive::OpenSlice(*file, storage.offset, storage.length);
}

absl::StatusOr<std::vector<MegatronDistReader::OpenChunk>> MegatronDistReader::OpenChunks(
    const DcpTensorInfo& info, const std::string& key, const std::vector<int64_t>& offsets,
    const std::vector<int64_t>& sizes) {
  std::vector<OpenChunk> chunks;
  for (const DcpChunk& chunk : info.chunks) {
    bool touches = true;
    for (size_t d = 0; d < sizes.size(); ++d) {
      touches = touches && chunk.offsets[d] < offsets[d] + sizes[d] &&
                offsets[d] < chunk.offsets[d] + chunk.sizes[d];
    }
    if (!touches || Volume(chunk.sizes) == 0) continue;
    auto archive = Item(chunk.storage);
    if (!archive.ok()) return archive.status();
    auto tensor = (*archive)->Tensor((*archive)->root(),
                                     Cat(key, "@[", absl::StrJoin(chunk.offsets, ","), "]"));
    if (!tensor.ok()) return tensor.status();
    if (tensor->dtype != info.dtype || tensor->shape != chunk.sizes) {
      return absl::DataLossError(
          Cat((*archive)->source(), ": chunk of '", key, "' is ", DTypeName(tensor->dtype), " [",
              absl::StrJoin(tensor->shape, ","), "], .metadata says ", DTypeName(info.dtype), " [",
              absl::StrJoin(chunk.sizes, ","), "]"));
    }
    if (verify_) {
      for (const ZipEntry& entry : (*archive)->zip().entries()) {
        auto release = [&](std::span<const std::byte> done) { (*archive)->Release(done); };
        if (auto s = (*archive)->zip().VerifyCrc(entry, release); !s.ok()) return s;
      }
    }
    chunks.push_back({&chunk, *std::move(archive), tensor->data});
  }
  return chunks;
}

absl::Status MegatronDistReader::CopyRegion(const std::vector<OpenChunk>& chunks,
                                            const DcpTensorInfo& info, const std::string& key,
                                            const std::vector<int64_t>& offsets,
                                            const std::vector<int64_t>& sizes,
                                            std::span<std::byte> dst) const {
  const size_t element = DTypeSize(info.dtype);
  int64_t copied = 0;
  for (const OpenChunk& c : chunks) {
    copied +=
        CopyIntersection(c.data, c.chunk->offsets, c.chunk->sizes, dst, offsets, sizes, element);
  }
  if (copied != Volume(sizes)) {
    return absl::DataLossError(Cat(dir_, ": the chunks of '", key, "' cover ", copied, " of the ",
                                   Volume(sizes), " elements read (checkpoint is incomplete)"));
  }
  return absl::OkStatus();
}

absl::Status MegatronDistReader::ReadRegion(const DcpTensorInfo& info, const std::string& key,
                                            const std::vector<int64_t>& offsets,
                                            const std::vector<int64_t>& sizes,
                                            std::span<std::byte> dst) {
  auto chunks = OpenChunks(info, key, offsets, sizes);
  if (!chunks.ok()) return chunks.status();
  absl::Status status = CopyRegion(*chunks, info, key, offsets, sizes, dst);
  for (const OpenChunk& c : *chunks) c.archive->Release(c.data);
  return status;
}

absl::StatusOr<MegatronDistReader::Resolved> MegatronDistReader::Resolve(const ParamSpec& target,
                                                                         TensorKind kind) const {
  const bool optimizer = kind != TensorKind::kParam;
  if (optimizer && !metadata_.has_optimizer) {
    return absl::FailedPreconditionError(Cat(dir_, ": checkpoint has no optimizer state"));
  }
  Resolved r;
  r.canonical = target.tied_to.empty() ? target.name : target.tied_to;
  r.source = layout_.Find(r.canonical);
  if (r.source == nullptr || !r.source->tied_to.empty()) {
    return absl::NotFoundError(Cat(dir_, ": checkpoint has no parameter '", r.canonical, "'"));
  }
  r.dtype = optimizer ? DType::kF32 : metadata_.config.params_dtype;
  r.same_shape = r.source->shape == target.shape;
  if (!r.same_shape && (r.source->split != TpSplit::kVocabRows || target.shape.size() != 2 ||
                        r.source->shape[1] != target.shape[1])) {
    return absl::InvalidArgumentError(Cat(dir_, ": parameter '", r.canonical, "' has shape [",
                                          absl::StrJoin(r.source->shape, ","), "], requested [",
                                          absl::StrJoin(target.shape, ","), "]"));
  }
  return r;
}

absl::Status MegatronDistReader::ReadFull(const ParamSpec& target, TensorKind kind, Tensor* out) {
  auto resolved = Resolve(target, kind);
  if (!resolved.ok()) return resolved.status();
  const std::string& canonical = resolved->canonical;
  const ParamSpec* source = resolved->source;
  const DType dtype = resolved->dtype;
  const size_t element = DTypeSize(dtype);
  const bool same_shape = resolved->same_shape;
  std::vector<int64_t> shape = source->shape;
  if (!same_shape) shape[0] = std::max(source->shape[0], target.shape[0]);
  out->Reset(dtype, shape);
  const std::span<std::byte> full(out->data.data(),
                                  static_cast<size_t>(NumElements(source->shape)) * element);
  const int k = static_cast<int>(kind);
  if (auto it = entries_[k].find(canonical); it != entries_[k].end()) {
    const DistEntry& e = it->second;
    std::vector<int64_t> offsets(e.info->shape.size(), 0), sizes = e.info->shape;
    if (e.layer >= 0) {
      offsets[0] = e.layer;
      sizes[0] = 1;
    }
    if (auto s = ReadRegion(*e.info, e.key, offsets, sizes, full); !s.ok()) return s;
  } else if (auto b = buckets_[k].find(canonical); b != buckets_[k].end()) {
    const std::vector<int64_t> shard_shape = layout_.ShardShape(*source);
    const int64_t numel = NumElements(shard_shape);
    std::vector<std::byte> shard(static_cast<size_t>(numel) * element);
    for (int tp = 0; tp < metadata_.parallel.tp; ++tp) {
      const BucketSlice& slice = b->second[tp];
      if (auto s = ReadRegion(*slice.info, slice.key, {slice.offset}, {numel}, shard); !s.ok()) {
        return s;
      }
      layout_.InsertShard(*source, tp, element, shard, full);
      if (source->split == TpSplit::kReplicated) break;
    }
  } else {
    return absl::NotFoundError(
        Cat(dir_, ": checkpoint has no ", StoredTensorName(canonical, kind)));
  }
  if (!same_shape) {
    out->shape = target.shape;
    out->data.resize(static_cast<size_t>(NumElements(target.shape)) * element);
  }
  return absl::OkStatus();
}

absl::Status MegatronDistReader::StreamFull(const ParamSpec& target, TensorKind kind,
                                            const FullTensorSink& sink) {
  auto resolved = Resolve(target, kind);
  if (!resolved.ok()) return resolved.status();
  const auto it = entries_[static_cast<int>(kind)].find(resolved->canonical);
  if (it == entries_[static_cast<int>(kind)].end()) {
    return FullTensorSource::StreamFull(target, kind, sink);
  }
  const DistEntry& e = it->second;
  // The region of the DCP tensor that is the source parameter, cut in blocks of rows of its first
  // dimension (the stacked tensor's second for one layer of it).
  std::vector<int64_t> offsets(e.info->shape.size(), 0), sizes = e.info->shape;
  const size_t rows_dim = e.layer >= 0 ? 1 : 0;
  if (e.layer >= 0) {
    offsets[0] = e.layer;
    sizes[0] = 1;
  }
  if (sizes.size() <= rows_dim) return FullTensorSource::StreamFull(target, kind, sink);
  const size_t element = DTypeSize(resolved->dtype);  // e.info->dtype's (MapTensors checked)
  size_t row_bytes = element;
  for (size_t d = rows_dim + 1; d < sizes.size(); ++d) row_bytes *= static_cast<size_t>(sizes[d]);
  const int64_t source_rows = sizes[rows_dim];
  // A larger vocabulary padding of the target gets zero rows; a smaller one drops the source's
  // last.
  const int64_t target_rows = resolved->same_shape ? source_rows : target.shape[0];
  if (row_bytes == 0 || target_rows == 0) return FullTensorSource::StreamFull(target, kind, sink);
  const int64_t block_rows = std::max<int64_t>(1, static_cast<int64_t>(kStreamPiece / row_bytes));
  const size_t blocks = static_cast<size_t>((target_rows + block_rows - 1) / block_rows);

  auto chunks = OpenChunks(*e.info, e.key, offsets, sizes);
  if (!chunks.ok()) return chunks.status();
  // A chunk's bytes are consumed front to back when its dimensions before the rows' are 1 (a
  // whole tensor's chunks, one layer's chunk of a stacked tensor): those pages are dropped as the
  // blocks pass them, in steps of 2 MiB (each madvise interrupts the other thread's CPU).
  struct Progress {
    bool in_order = true;
    size_t row_bytes = 0;
    const std::byte* released = nullptr;
  };
  std::vector<Progress> progress(chunks->size());
  for (size_t c = 0; c < chunks->size(); ++c) {
    const DcpChunk& chunk = *(*chunks)[c].chunk;
    Progress& p = progress[c];
    p.released = (*chunks)[c].data.data();
    p.row_bytes = element;
    for (size_t d = 0; d < chunk.sizes.size(); ++d) {
      if (d < rows_dim) p.in_order = p.in_order && chunk.sizes[d] == 1;
      if (d > rows_dim) p.row_bytes *= static_cast<size_t>(chunk.sizes[d]);
    }
  }

  std::vector<PageAlignedBuffer> buffers(kPiecesInFlight);
  std::vector<std::span<const std::byte>> pieces(kPiecesInFlight);
  auto make_block = [&](size_t index, size_t slot) -> absl::Status {
    const int64_t first = static_cast<int64_t>(index) * block_rows;
    const int64_t end = std::min(target_rows, first + block_rows);
    const int64_t copy_end = std::min(end, source_rows);
    PageAlignedBuffer& buffer = buffers[slot];
    buffer.Reserve(static_cast<size_t>(block_rows) * row_bytes);
    const size_t bytes = static_cast<size_t>(end - first) * row_bytes;
    size_t copied = 0;
    if (first < copy_end) {
      std::vector<int64_t> block_offsets = offsets, block_sizes = sizes;
      block_offsets[rows_dim] += first;
      block_sizes[rows_dim] = copy_end - first;
      copied = static_cast<size_t>(copy_end - first) * row_bytes;
      if (auto s = CopyRegion(*chunks, *e.info, e.key, block_offsets, block_sizes,
                              {buffer.data(), copied});
          !s.ok()) {
        return s;
      }
      const int64_t done_row = offsets[rows_dim] + copy_end;
      for (size_t c = 0; c < chunks->size(); ++c) {
        const OpenChunk& chunk = (*chunks)[c];
        Progress& p = progress[c];
        if (!p.in_order) continue;
        const int64_t rows = std::clamp<int64_t>(done_row - chunk.chunk->offsets[rows_dim], 0,
                                                 chunk.chunk->sizes[rows_dim]);
        const std::byte* done = chunk.data.data() + static_cast<size_t>(rows) * p.row_bytes;
        if (done - p.released < (std::ptrdiff_t{2} << 20)) continue;
        chunk.archive->ReleaseBehind({p.released, done});
        p.released = done;
      }
    }
    std::memset(buffer.data() + copied, 0, bytes - copied);
    pieces[slot] = {buffer.data(), bytes};
    return absl::OkStatus();
  };
  if (auto s = sink.begin(resolved->dtype); !s.ok()) return s;
  absl::Status status = RunReadAhead(blocks, kPiecesInFlight, make_block, [&](size_t, size_t slot) {
    return sink.append(pieces[slot]);
  });
  for (const OpenChunk& c : *chunks) c.archive->Release(c.data);
  return status;
}

}  // namespace leantron::ckpt
