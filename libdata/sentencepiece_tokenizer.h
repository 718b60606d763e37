// Megatron's SentencePieceTokenizer, Llama2Tokenizer and GPTSentencePieceTokenizer: a
// SentencePiece tokenizer.model with a BPE model, ids exactly as the sentencepiece library's
// encode_as_ids (Megatron's tokenize for all three):
//
//   normalize (sentencepiece_normalizer.h), split into characters (user-defined symbols whole
//   and never merged), merge the adjacent pair whose merged piece has the highest score
//   (leftmost on ties) until none is a piece, split UNUSED pieces back, then unknown pieces
//   become <0xXX> byte pieces (byte_fallback) or the unk id, consecutive unknowns fused.
//
// Megatron's vocab_size is the number of pieces, its EOD the eos piece (</s>). No special tokens
// are read from text and none are added, as in Megatron. Unigram, word and char models are
// refused at load.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "libdata/tokenizer.h"

namespace leantron::data {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& path,
                                                                      const std::string& type);
// From the model file's bytes; `name` labels errors.
absl::StatusOr<std::unique_ptr<Tokenizer>> SentencePieceTokenizerFromBytes(std::string_view bytes,
                                                                           const std::string& name,
                                                                           const std::string& type);

}  // namespace leantron::data
