#include "trainer/core/params.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "libckpt/dtype.h"
#include "trainer/core/grad_buffers.h"
#include "trainer/core/weight_buffers.h"

namespace leantron::trainer {

void FillNormal(uint64_t seed, const std::string& name, double std, std::vector<float>* out) {
  uint64_t key = SplitMix64(seed);
  for (char ch : name) key = SplitMix64(key ^ static_cast<unsigned char>(ch));
  // Element i comes from counter i alone, so the leading rows of a padded vocabulary do not
  // depend on how much padding there is (TP changes the padding), and pieces of the tensor can
  // be drawn on several threads with the same result: a billion-element tensor (8B models) takes
  // tens of seconds on one core.
  const size_t n = out->size();
  float* o = out->data();
  auto fill = [&](size_t begin, size_t end) {  // begin even
    for (size_t i = begin; i < end; i += 2) {
      const uint64_t a = SplitMix64(key + i), b = SplitMix64(key + i + 1);
      const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
      const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
      const double r = std::sqrt(-2.0 * std::log(u1));
      o[i] = static_cast<float>(std * r * std::cos(2.0 * M_PI * u2));
      if (i + 1 < n) o[i + 1] = static_cast<float>(std * r * std::sin(2.0 * M_PI * u2));
    }
  };
  constexpr size_t kPiece = size_t{1} << 20;  // even
  const size_t threads = std::min<size_t>(
      {std::max(1u, std::thread::hardware_concurrency()), 16, (n + kPiece - 1) / kPiece});
  if (threads <= 1) {
    fill(0, n);
    return;
  }
  const size_t each = (n / threads + 1) & ~size_t{1};  // even, so pairs stay whole
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    const size_t begin = std::min(n, t * each);
    const size_t end = t + 1 == threads ? n : std::min(n, begin + each);
    if (begin < end) pool.emplace_back(fill, begin, end);
  }
  for (std::thread& th : pool) th.join();
}

bool Bf16ModelReadsFp32(const std::string& name) {
  return absl::StartsWith(name, "embedding.") || absl::StrContains(name, "layernorm.");
}

ParamStore::ParamStore(Ops* ops, const ckpt::ModelLayout& layout, int tp_rank, int pp_rank,
                       bool sequence_parallel, MasterWeights master, double host_fraction)
    : ops_(ops), layout_(layout), tp_rank_(tp_rank), master_place_(master) {
  for (const ckpt::ParamSpec* spec : layout.StageParams(pp_rank)) {
    ParamView v;
    v.name = spec->name;
    v.spec = spec;
    v.shard_shape = layout.ShardShape(*spec);
    v.numel = static_cast<size_t>(ckpt::NumElements(v.shard_shape));
    v.offset = size_;
    v.decay = spec->shape.size() > 1;
    const bool replicated = spec->split == ckpt::TpSplit::kReplicated;
    v.count_in_norm = spec->tied_to.empty() && (!replicated || tp_rank == 0);
    v.tp_partial_grad = sequence_parallel && replicated && layout.parallel().tp > 1;
    size_ += v.numel;
    views_.push_back(std::move(v));
  }
  if (master_place_ == MasterWeights::kHost) {
    // The last tensors, at least the fraction of the elements.
    const double want = std::clamp(host_fraction, 0.0, 1.0) * static_cast<double>(size_);
    host_begin_ = size_;
    for (auto it = views_.rbegin(); it != views_.rend() && size_ - host_begin_ < want; ++it)
      host_begin_ = it->offset;
  }
  for (ParamView& v : views_) {
    if (master_place_ != MasterWeights::kWhole && master_place_ != MasterWeights::kShardedCompute &&
        v.offset >= host_begin_ && Bf16ModelReadsFp32(v.name)) {
      v.mirror = mirror_size_;
      mirror_size_ += v.numel;
    }
  }
  switch (master_place_) {
    case MasterWeights::kWhole:
      master_ = ops_->Alloc(size_);
      break;
    case MasterWeights::kHost:
      master_ = static_cast<float*>(ops_->AllocPinned((size_ - host_begin_) * sizeof(float)));
      if (host_begin_ > 0) device_master_ = ops_->Alloc(host_begin_);
      mirror_ = ops_->Alloc(mirror_size_);
      break;
    case MasterWeights::kSharded:  // the shard itself once SetShard says which it is
    case MasterWeights::kHostSharded:
      mirror_ = ops_->Alloc(mirror_size_);
      own_bf16_ = ops_->Alloc((size_ + 1) / 2);
      bf16_copy_ = reinterpret_cast<uint16_t*>(own_bf16_);
      break;
    case MasterWeights::kShardedCompute:  // the weight buffers (ShardWeights)
      break;
  }
  grads_ = std::make_unique<GradBuffers>(ops_, size_);
}

ParamStore::~ParamStore() {
  if (offloaded()) {
    if (master_ != nullptr) ops_->FreePinned(master_);
  } else if (master_ != nullptr) {  // never set with kShardedCompute (the weight buffers)
    ops_->Free(master_);
  }
  if (device_master_ != nullptr) ops_->Free(device_master_);
  if (mirror_ != nullptr) ops_->Free(mirror_);
  if (own_bf16_ != nullptr) ops_->Free(own_bf16_);
}

float* ParamStore::grad() { return grads_->whole(); }

void ParamStore::ShardGrads(const std::vector<std::vector<DpBucket>>& chunks, int rank, int ranks) {
  if (grads_->sharded()) {
    std::fprintf(stderr, "ParamStore: the gradients are sharded already\n");
    std::abort();
  }
  grads_.reset();  // the whole buffer goes first: never both at once
  grads_ = std::make_unique<GradBuffers>(ops_, size_, chunks, rank, ranks);
}

void ParamStore::ShardWeights(const std::vector<std::vector<DpBucket>>& chunks, int rank,
                              int ranks) {
  const bool fp32 = master_place_ == MasterWeights::kShardedCompute;
  if (weights_ != nullptr || shard_set_ || (!fp32 && master_place_ != MasterWeights::kSharded)) {
    std::fprintf(stderr,
                 "ParamStore: ShardWeights needs kSharded or kShardedCompute, once, before "
                 "SetShard\n");
    std::abort();
  }
  if (own_bf16_ != nullptr) {  // the whole copy goes first: never both at once
    ops_->Free(own_bf16_);
    own_bf16_ = nullptr;
    bf16_copy_ = nullptr;
  }
  weights_ = std::make_unique<WeightBuffers>(ops_, fp32 ? 4 : 2, size_, chunks, rank, ranks);
}

uint16_t* ParamStore::Bf16At(size_t flat) const {
  if (weights_ != nullptr && weights_->element_bytes() == 2) return weights_->At<uint16_t>(flat);
  return bf16_copy_ != nullptr ? bf16_copy_ + flat : nullptr;
}

uint16_t* ParamStore::Bf16Owned(size_t flat) const {
  if (weights_ != nullptr && weights_->element_bytes() == 2) return weights_->Owned<uint16_t>(flat);
  return bf16_copy_ != nullptr ? bf16_copy_ + flat : nullptr;
}

size_t ParamStore::bf16_backend_bytes() const {
  if (weights_ != nullptr && weights_->element_bytes() == 2) return weights_->backend_bytes();
  return own_bf16_ != nullptr ? (size_ + 1) / 2 * sizeof(float) : 0;
}

void ParamStore::SetShard(std::vector<std::pair<size_t, size_t>> ranges) {
  size_t at = 0;
  bool ok = sharded() && !shard_set_;
  for (const auto& [b, e] : ranges) {
    ok = ok && at <= b && b < e && e <= size_;
    at = e;
  }
  if (!ok) {
    std::fprintf(stderr,
                 "ParamStore: SetShard needs kSharded, kHostSharded or kShardedCompute, once, "
                 "with sorted ranges\n");
    std::abort();
  }
  shard_set_ = true;
  if (master_place_ == MasterWeights::kShardedCompute) {
    if (weights_ == nullptr) {
      std::fprintf(stderr, "ParamStore: kShardedCompute needs ShardWeights before SetShard\n");
      std::abort();
    }
    // Each range is one part of one bucket: one run in the weight buffers.
    shard_ = std::move(ranges);
    for (const auto& [b, e] : shard_) {
      if (weights_->layout().OwnedRunEnd(b) < e) {
        std::fprintf(stderr, "ParamStore: a shard range is not one bucket's part\n");
        std::abort();
      }
      runs_.push_back({b, e, weights_->Owned<float>(b)});
    }
    return;
  }
  shard_ = std::move(ranges);
  // Cut at the mirrored tensors' edges: what falls in one is stepped there, the rest in master_.
  struct Piece {
    size_t begin, end, mirror;  // mirror: where `begin` is in the mirror, or kNoMirror
  };
  constexpr size_t kNone = ParamView::kNoMirror;
  std::vector<Piece> pieces;
  for (const auto& [sb, se] : shard_) {
    for (const ParamView& v : views_) {
      const size_t b = std::max(sb, v.offset), e = std::min(se, v.offset + v.numel);
      if (b >= e) continue;
      // On the host every piece is stepped in the shard (the mirror is refreshed from it).
      const size_t m = v.mirror == kNone || master_place_ == MasterWeights::kHostSharded
                           ? kNone
                           : v.mirror + (b - v.offset);
      Piece* last = pieces.empty() ? nullptr : &pieces.back();
      if (last != nullptr && last->end == b && (last->mirror == kNone) == (m == kNone) &&
          (m == kNone || last->mirror + (last->end - last->begin) == m)) {
        last->end = e;
      } else {
        pieces.push_back({b, e, m});
      }
    }
  }
  for (const Piece& p : pieces)
    if (p.mirror == kNone) shard_size_ += p.end - p.begin;
  master_ = master_place_ == MasterWeights::kHostSharded
                ? static_cast<float*>(ops_->AllocPinned(std::max<size_t>(shard_size_, 1) * 4))
                : ops_->Alloc(std::max<size_t>(shard_size_, 1));
  size_t packed = 0;
  for (const Piece& p : pieces) {
    if (p.mirror != kNone) {
      runs_.push_back({p.begin, p.end, mirror_ + p.mirror});
    } else {
      runs_.push_back({p.begin, p.end, master_ + packed});
      packed += p.end - p.begin;
    }
  }
}

size_t ParamStore::backend_elements() const {
  switch (master_place_) {
    case MasterWeights::kWhole:
      return size_;
    case MasterWeights::kHost:
      return host_begin_ + mirror_size_;
    case MasterWeights::kSharded:
      return shard_size_ + mirror_size_;
    case MasterWeights::kHostSharded:
      return mirror_size_;
    case MasterWeights::kShardedCompute:
      return weights_ != nullptr ? weights_->layout().elements() : 0;
  }
  return size_;
}

size_t ParamStore::host_elements() const {
  switch (master_place_) {
    case MasterWeights::kHost:
      return size_ - host_begin_;
    case MasterWeights::kHostSharded:
      return shard_size_;
    default:
      return 0;
  }
}

const ParamView* ParamStore::Find(const std::string& name) const {
  for (const ParamView& v : views_)
    if (v.name == name) return &v;
  return nullptr;
}

const ParamStore::Run* ParamStore::RunOf(size_t flat) const {
  auto it = std::upper_bound(runs_.begin(), runs_.end(), flat,
                             [](size_t f, const Run& r) { return f < r.begin; });
  return it == runs_.begin() || flat >= (it - 1)->end ? nullptr : &*(it - 1);
}

float* ParamStore::Master(size_t flat) {
  if (master_place_ == MasterWeights::kHost)
    return flat < host_begin_ ? device_master_ + flat : master_ + (flat - host_begin_);
  if (!sharded()) return master_ + flat;
  const Run* r = RunOf(flat);
  if (r == nullptr) {
    std::fprintf(stderr, "ParamStore: fp32 weight %zu is not in this rank's shard\n", flat);
    std::abort();
  }
  return r->at + (flat - r->begin);
}

size_t ParamStore::MasterRunEnd(size_t flat) const {
  if (master_place_ == MasterWeights::kHost && flat < host_begin_) return host_begin_;
  if (!sharded()) return size_;
  const Run* r = RunOf(flat);
  return r == nullptr ? flat : r->end;
}

float* ParamStore::Param(const std::string& name) {
  const ParamView* v = Find(name);
  if (v == nullptr) return nullptr;
  if (master_place_ == MasterWeights::kWhole) return master_ + v->offset;
  if (master_place_ == MasterWeights::kShardedCompute) return weights_->At<float>(v->offset);
  if (offloaded() && v->offset < host_begin_) return device_master_ + v->offset;
  if (v->mirror == ParamView::kNoMirror) {
    std::fprintf(stderr,
                 "ParamStore: %s has no fp32 copy on the backend with the weights on the host or "
                 "sharded\n",
                 name.c_str());
    std::abort();
  }
  return mirror_ + v->mirror;
}

float* ParamStore::MirrorAt(size_t flat) const {
  if (mirror_ == nullptr) return nullptr;
  // The views tile the flat order (offsets ascending): the last one starting at or before it.
  auto it = std::upper_bound(views_.begin(), views_.end(), flat,
                             [](size_t f, const ParamView& v) { return f < v.offset; });
  if (it == views_.begin()) return nullptr;
  const ParamView& v = *(it - 1);
  if (v.mirror == ParamView::kNoMirror || flat >= v.offset + v.numel) return nullptr;
  return mirror_ + v.mirror + (flat - v.offset);
}

uint64_t ParamStore::RefreshMirror(size_t begin, size_t end) {
  uint64_t ticket = 0;
  if (!offloaded()) return ticket;
  for (const ParamView& v : views_) {
    if (v.mirror == ParamView::kNoMirror) continue;  // every mirrored tensor is on the host
    const size_t b = std::max(begin, v.offset), e = std::min(end, v.offset + v.numel);
    if (b < e)
      ticket = ops_->CopyFromHostAsync(mirror_ + v.mirror + (b - v.offset), Master(b),
                                       (e - b) * sizeof(float));
  }
  return ticket;
}

std::vector<float> ParamStore::HostData() const {
  if (sharded()) {
    std::fprintf(stderr, "ParamStore: no rank holds the sharded fp32 weights whole\n");
    std::abort();
  }
  std::vector<float> host(size_);
  if (offloaded()) {
    ops_->CopyToHost(host.data(), device_master_, host_begin_ * sizeof(float));
    std::memcpy(host.data() + host_begin_, master_, (size_ - host_begin_) * sizeof(float));
  } else {
    ops_->CopyToHost(host.data(), master_, size_ * sizeof(float));
  }
  return host;
}

void ParamStore::Write(const ParamView& view, const float* host) {
  const size_t bytes = view.numel * sizeof(float);
  switch (master_place_) {
    case MasterWeights::kWhole:
      return ops_->CopyFromHost(master_ + view.offset, host, bytes);
    case MasterWeights::kHost:
      // The split between the two places falls between tensors.
      if (view.offset < host_begin_) {
        ops_->CopyFromHost(device_master_ + view.offset, host, bytes);
      } else if (host != Master(view.offset)) {
        std::memcpy(Master(view.offset), host, bytes);
      }
      break;
    case MasterWeights::kShardedCompute: {
      if (!shard_set_) {
        std::fprintf(stderr, "ParamStore: %s written before ShardWeights and SetShard\n",
                     view.name.c_str());
        std::abort();
      }
      // A whole buffer whole (every rank keeps it), of a layer bucket this rank's part.
      if (weights_->layout().Containing(view.offset).slot < 0) {
        ops_->CopyFromHost(weights_->At<float>(view.offset), host, bytes);
        break;
      }
      for (const Run& r : runs_) {
        const size_t b = std::max(r.begin, view.offset);
        const size_t e = std::min(r.end, view.offset + view.numel);
        if (b < e) ops_->CopyFromHost(r.at + (b - r.begin), host + (b - view.offset), (e - b) * 4);
      }
      break;
    }
    case MasterWeights::kSharded:
    case MasterWeights::kHostSharded: {
      if (!shard_set_) {
        std::fprintf(stderr, "ParamStore: %s written before SetShard\n", view.name.c_str());
        std::abort();
      }
      // This rank's part: on the host all of it; on the backend outside the mirror (a mirrored
      // view goes to the mirror whole, below).
      const bool on_host = master_place_ == MasterWeights::kHostSharded;
      if (on_host || view.mirror == ParamView::kNoMirror) {
        for (const Run& r : runs_) {
          const size_t b = std::max(r.begin, view.offset);
          const size_t e = std::min(r.end, view.offset + view.numel);
          if (b >= e) continue;
          if (on_host) {
            std::memcpy(r.at + (b - r.begin), host + (b - view.offset), (e - b) * 4);
          } else {
            ops_->CopyFromHost(r.at + (b - r.begin), host + (b - view.offset), (e - b) * 4);
          }
        }
      }
      // The bf16 copy, rounded here as the model's conversion rounds (to nearest even): whole,
      // or kept as WeightBuffers a whole buffer whole and of a layer bucket this rank's part.
      std::vector<uint16_t> low(view.numel);
      for (size_t i = 0; i < view.numel; ++i) low[i] = ckpt::FloatToBFloat16(host[i]);
      if (weights_ == nullptr || weights_->layout().Containing(view.offset).slot < 0) {
        ops_->CopyFromHost(Bf16At(view.offset), low.data(), view.numel * sizeof(uint16_t));
        break;
      }
      for (const auto& [sb, se] : shard_) {
        const size_t b = std::max(sb, view.offset), e = std::min(se, view.offset + view.numel);
        if (b < e)
          ops_->CopyFromHost(Bf16Owned(b), low.data() + (b - view.offset),
                             (e - b) * sizeof(uint16_t));
      }
      break;
    }
  }
  if (view.mirror != ParamView::kNoMirror) ops_->CopyFromHost(mirror_ + view.mirror, host, bytes);
}

void ParamStore::SetFromHost(const ParamView& view, const float* host) {
  Write(view, host);
  WeightsRewritten();
}

float* ParamStore::Grad(const std::string& name) {
  const ParamView* v = Find(name);
  return v ? grads_->At(v->offset) : nullptr;
}

void ParamStore::Initialize(uint64_t seed, double init_std) {
  WeightsRewritten();
  const int64_t num_layers = layout_.config().num_layers;
  const double output_std = init_std / std::sqrt(2.0 * static_cast<double>(num_layers));
  std::vector<float> full, shard;
  for (const ParamView& v : views_) {
    const ckpt::ParamSpec& spec = *v.spec;
    full.assign(static_cast<size_t>(ckpt::NumElements(spec.shape)), 0.0f);
    const std::string& source = spec.tied_to.empty() ? spec.name : spec.tied_to;
    if (absl::EndsWith(source, "layernorm.weight")) {
      std::fill(full.begin(), full.end(), 1.0f);
    } else if (absl::EndsWith(source, ".bias")) {
      // zeros
    } else if (absl::EndsWith(source, "linear_proj.weight") ||
               absl::EndsWith(source, "linear_fc2.weight")) {
      FillNormal(seed, source, output_std, &full);
    } else {
      FillNormal(seed, source, init_std, &full);
    }
    shard.assign(v.numel, 0.0f);
    layout_.ExtractShard(spec, tp_rank_, sizeof(float), std::as_bytes(std::span<const float>(full)),
                         std::as_writable_bytes(std::span<float>(shard)));
    Write(v, shard.data());
  }
}

std::pair<size_t, size_t> DpBucket::Part(int rank, int size) const {
  const size_t each = (numel + size - 1) / size;
  const size_t begin = std::min(numel, each * rank), end = std::min(numel, begin + each);
  return {offset + begin, offset + end};
}

std::vector<std::pair<size_t, size_t>> DpOwnedParts(const std::vector<DpBucket>& buckets, int rank,
                                                    int size) {
  std::vector<std::pair<size_t, size_t>> parts;
  for (const DpBucket& b : buckets) {
    const auto [first, last] = b.Part(rank, size);
    if (first < last) parts.push_back({first, last});
  }
  std::sort(parts.begin(), parts.end());
  return parts;
}

int DpReduceStartLayer(const std::vector<double>& left_ms, double reduce_ms) {
  if (!(reduce_ms > 0.0)) return -1;
  for (size_t l = 0; l < left_ms.size(); ++l)
    if (left_ms[l] >= kDpReduceMargin * reduce_ms) return static_cast<int>(l);
  return -1;
}

std::vector<DpBucket> PlanDpBuckets(const ParamStore& params, int first_layer, int last_layer,
                                    bool first_chunk, bool last_chunk, size_t bucket_elements) {
  // Each layer's span of the flat buffer, and the chunk's other tensors.
  const int layers = std::max(0, last_layer - first_layer);
  std::vector<std::pair<size_t, size_t>> span(layers, {SIZE_MAX, 0}), rest;
  for (const ParamView& v : params.views()) {
    int layer = -1;
    if (std::sscanf(v.name.c_str(), "decoder.layers.%d.", &layer) == 1) {
      if (layer < first_layer || layer >= last_layer) continue;
      auto& r = span[layer - first_layer];
      r.first = std::min(r.first, v.offset);
      r.second = std::max(r.second, v.offset + v.numel);
    } else if ((first_chunk && v.name.rfind("embedding.", 0) == 0) ||
               (last_chunk && v.name.rfind("embedding.", 0) != 0)) {
      rest.push_back({v.offset, v.offset + v.numel});
    }
  }
  std::vector<DpBucket> out;
  // From the last layer down (the backward's order), merging neighbours up to the bucket size.
  DpBucket cur;
  for (int l = layers - 1; l >= 0; --l) {
    const auto [first, last] = span[l];
    if (first >= last) continue;
    // Not adjacent, or the chunk's lowest layer: close the open bucket. The lowest layer's bucket
    // is reduced when the backward is all but done, with nothing left to hide it behind, so it
    // holds that layer alone; the layers above it are reduced during its backward.
    if (cur.numel > 0 && (cur.offset != last || l == 0)) {
      out.push_back(cur);
      cur = DpBucket{};
    }
    if (cur.numel == 0) cur.last_layer = l;
    cur.numel = cur.numel == 0 ? last - first : cur.numel + (cur.offset - first);
    cur.offset = first;
    cur.first_layer = l;
    if (cur.numel >= bucket_elements) {
      out.push_back(cur);
      cur = DpBucket{};
    }
  }
  if (cur.numel > 0) out.push_back(cur);
  // The word embedding and the output layer get a bucket each: tied across the first and last
  // stage, their two copies' gradients are summed element by element after the data-parallel
  // reduction, so both copies must be cut into the same parts.
  std::sort(rest.begin(), rest.end());
  bool alone = false;
  for (const auto& [first, last] : rest) {
    const ParamView* v = nullptr;
    for (const ParamView& w : params.views())
      if (w.offset == first) v = &w;
    const bool tied = v != nullptr && (v->name == "embedding.word_embeddings.weight" ||
                                       v->name == "output_layer.weight");
    if (!tied && !alone && !out.empty() && out.back().first_layer < 0 &&
        out.back().offset + out.back().numel == first) {
      out.back().numel += last - first;
    } else {
      out.push_back({first, last - first, -1, -1});
    }
    alone = tied;
  }
  return out;
}

}  // namespace leantron::trainer
