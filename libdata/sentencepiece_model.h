// SentencePiece's tokenizer.model: a protobuf ModelProto (sentencepiece_model.proto), read by a
// small protobuf wire-format reader of the fields encoding and decoding need. Hand-written rather
// than generated with Debian's libprotobuf: three messages and a dozen fields do not justify a
// code generator in the build, and a reader that checks every length is easy to fuzz.
//
// Proto2 defaults apply to absent fields (model_type UNIGRAM, add_dummy_prefix true, ...).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace leantron::data {

struct SentencePieceModel {
  enum class PieceType : int {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6
  };
  struct Piece {
    std::string piece;
    float score = 0;
    PieceType type = PieceType::kNormal;
  };
  struct Normalizer {
    std::string name;
    std::string precompiled_charsmap;
    bool add_dummy_prefix = true;
    bool remove_extra_whitespaces = true;
    bool escape_whitespaces = true;
  };
  enum class ModelType : int { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };

  std::vector<Piece> pieces;
  // TrainerSpec.
  ModelType model_type = ModelType::kUnigram;
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  std::string unk_piece = "<unk>", bos_piece = "<s>", eos_piece = "</s>", pad_piece = "<pad>";
  std::string unk_surface = " \xE2\x81\x87 ";
  Normalizer normalizer;
  bool has_denormalizer = false;
  Normalizer denormalizer;
};

// Parses the serialized ModelProto; `name` labels errors.
absl::StatusOr<SentencePieceModel> ParseSentencePieceModel(std::string_view bytes,
                                                           std::string_view name);

}  // namespace leantron::data
