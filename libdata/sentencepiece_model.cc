#include "libdata/sentencepiece_model.h"

#include <cstring>

#include "libdata/string_compat.h"

namespace leantron::data {
namespace {

// Reads protobuf wire format: a key (field << 3 | wire type), then the value.
class WireReader {
 public:
  WireReader(std::string_view data, std::string path) : data_(data), path_(std::move(path)) {}

  bool done() const { return pos_ >= data_.size(); }

  absl::Status Next(uint32_t* field, int* wire) {
    uint64_t key;
    if (absl::Status st = Varint(&key); !st.ok()) return st;
    *field = static_cast<uint32_t>(key >> 3);
    *wire = static_cast<int>(key & 7);
    if (*field == 0) return Error("field number 0");
    return absl::OkStatus();
  }
  absl::Status Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) return Error("truncated varint");
      const auto b = static_cast<uint8_t>(data_[pos_++]);
      *v |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return absl::OkStatus();
    }
    return Error("varint longer than 10 bytes");
  }
  absl::Status Bytes(std::string_view* v) {
    uint64_t n;
    if (absl::Status st = Varint(&n); !st.ok()) return st;
    if (n > data_.size() - pos_) return Error("length past the end of the message");
    *v = data_.substr(pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  absl::Status Fixed32(uint32_t* v) {
    if (data_.size() - pos_ < 4) return Error("truncated fixed32");
    std::memcpy(v, data_.data() + pos_, 4);
    pos_ += 4;
    return absl::OkStatus();
  }
  absl::Status Skip(int wire) {
    uint64_t v;
    std::string_view s;
    switch (wire) {
      case 0:
        return Varint(&v);
      case 1:
        if (data_.size() - pos_ < 8) return Error("truncated fixed64");
        pos_ += 8;
        return absl::OkStatus();
      case 2:
        return Bytes(&s);
      case 5:
        if (data_.size() - pos_ < 4) return Error("truncated fixed32");
        pos_ += 4;
        return absl::OkStatus();
      default:
        return Error(Cat("unsupported wire type ", wire));
    }
  }
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        Cat(path_, ": not a SentencePiece model (", what, " at byte ", pos_, ")"));
  }
  absl::Status Expect(int wire, int want) const {
    return wire == want ? absl::OkStatus()
                        : Error(Cat("wire type ", wire, " for a field of type ", want));
  }
  const std::string& path() const { return path_; }

 private:
  std::string_view data_;
  std::string path_;
  size_t pos_ = 0;
};

absl::Status ReadBool(WireReader& r, int wire, bool* out) {
  if (absl::Status st = r.Expect(wire, 0); !st.ok()) return st;
  uint64_t v;
  if (absl::Status st = r.Varint(&v); !st.ok()) return st;
  *out = v != 0;
  return absl::OkStatus();
}

absl::Status ReadString(WireReader& r, int wire, std::string* out) {
  if (absl::Status st = r.Expect(wire, 2); !st.ok()) return st;
  std::string_view s;
  if (absl::Status st = r.Bytes(&s); !st.ok()) return st;
  out->assign(s.data(), s.size());
  return absl::OkStatus();
}

absl::Status ReadPiece(std::string_view bytes, const std::string& path,
                       SentencePieceModel::Piece* p) {
  WireReader r(bytes, path);
  while (!r.done()) {
    uint32_t field;
    int wire;
    if (absl::Status st = r.Next(&field, &wire); !st.ok()) return st;
    absl::Status st;
    if (field == 1) {
      st = ReadString(r, wire, &p->piece);
    } else if (field == 2) {
      uint32_t bits = 0;
      st = r.Expect(wire, 5);
      if (st.ok()) st = r.Fixed32(&bits);
      std::memcpy(&p->score, &bits, 4);
    } else if (field == 3) {
      uint64_t v = 0;
      st = r.Expect(wire, 0);
      if (st.ok()) st = r.Varint(&v);
      if (st.ok() && (v < 1 || v > 6)) st = r.Error(Cat("piece type ", v));
      p->type = static_cast<SentencePieceModel::PieceType>(v);
    } else {
      st = r.Skip(wire);
    }
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status ReadNormalizer(std::string_view bytes, const std::string& path,
                            SentencePieceModel::Normalizer* n) {
  WireReader r(bytes, path);
  while (!r.done()) {
    uint32_t field;
    int wire;
    if (absl::Status st = r.Next(&field, &wire); !st.ok()) return st;
    absl::Status st;
    switch (field) {
      case 1:
        st = ReadString(r, wire, &n->name);
        break;
      case 2:
        st = ReadString(r, wire, &n->precompiled_charsmap);
        break;
      case 3:
        st = ReadBool(r, wire, &n->add_dummy_prefix);
        break;
      case 4:
        st = ReadBool(r, wire, &n->remove_extra_whitespaces);
        break;
      case 5:
        st = ReadBool(r, wire, &n->escape_whitespaces);
        break;
      default:
        st = r.Skip(wire);
    }
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status ReadTrainerSpec(std::string_view bytes, const std::string& path,
                             SentencePieceModel* m) {
  WireReader r(bytes, path);
  while (!r.done()) {
    uint32_t field;
    int wire;
    if (absl::Status st = r.Next(&field, &wire); !st.ok()) return st;
    absl::Status st;
    std::string s;
    switch (field) {
      case 3: {
        uint64_t v = 0;
        st = r.Expect(wire, 0);
        if (st.ok()) st = r.Varint(&v);
        if (st.ok() && (v < 1 || v > 4)) st = r.Error(Cat("model type ", v));
        m->model_type = static_cast<SentencePieceModel::ModelType>(v);
        break;
      }
      case 24:
        st = ReadBool(r, wire, &m->treat_whitespace_as_suffix);
        break;
      case 35:
        st = ReadBool(r, wire, &m->byte_fallback);
        break;
      case 44:
        st = ReadString(r, wire, &m->unk_surface);
        break;
      case 45:
      case 46:
      case 47:
      case 48:
        st = ReadString(r, wire, &s);
        if (st.ok() && !s.empty()) {
          (field == 45   ? m->unk_piece
           : field == 46 ? m->bos_piece
           : field == 47 ? m->eos_piece
                         : m->pad_piece) = s;
        }
        break;
      default:
        st = r.Skip(wire);
    }
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SentencePieceModel> ParseSentencePieceModel(std::string_view bytes,
                                                           std::string_view name) {
  const std::string path(name);
  SentencePieceModel m;
  WireReader r(bytes, path);
  while (!r.done()) {
    uint32_t field;
    int wire;
    if (absl::Status st = r.Next(&field, &wire); !st.ok()) return st;
    absl::Status st;
    std::string_view sub;
    if (field >= 1 && field <= 5 && field != 4) {
      st = r.Expect(wire, 2);
      if (st.ok()) st = r.Bytes(&sub);
      if (!st.ok()) return st;
    }
    switch (field) {
      case 1:
        m.pieces.emplace_back();
        st = ReadPiece(sub, path, &m.pieces.back());
        break;
      case 2:
        st = ReadTrainerSpec(sub, path, &m);
        break;
      case 3:
        st = ReadNormalizer(sub, path, &m.normalizer);
        break;
      case 5:
        m.has_denormalizer = true;
        st = ReadNormalizer(sub, path, &m.denormalizer);
        break;
      default:
        st = r.Skip(wire);
    }
    if (!st.ok()) return st;
  }
  if (m.pieces.empty()) return absl::InvalidArgumentError(Cat(path, ": the model has no pieces"));
  return m;
}

}  // namespace leantron::data
