// inspect: look inside the project's files.
//   inspect dataset PREFIX [--document K] [--vocab-file F --merge-file F | --tiktoken-file F]
// Each subcommand is a thin layer over one library function.
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "libdata/dataset_inspect.h"

namespace {

int Fail(const absl::Status& status) {
  std::cerr << "inspect: " << status.message() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Inspect Leantron / Megatron files"};
  app.require_subcommand(1);

  // ---- inspect dataset ----
  leantron::data::InspectDatasetOptions dataset;
  int64_t document = -1;
  CLI::App* dataset_cmd = app.add_subcommand("dataset", "Summarize an indexed dataset (.bin/.idx)");
  dataset_cmd->add_option("prefix", dataset.prefix, "Dataset prefix (without .bin/.idx)")
      ->required();
  dataset_cmd->add_option("--document", document, "Print (and decode) document K");
  dataset_cmd->add_option("--vocab-file", dataset.vocab.vocab_file, "GPT-2 encoder.json");
  dataset_cmd->add_option("--merge-file", dataset.vocab.merge_file, "GPT-2 vocab.bpe");
  dataset_cmd->add_option("--tiktoken-file", dataset.vocab.tiktoken_file, "gpt2.tiktoken");

  CLI11_PARSE(app, argc, argv);

  if (dataset_cmd->parsed()) {
    if (document >= 0) dataset.document = document;
    if (absl::Status s = leantron::data::InspectDataset(dataset, std::cout); !s.ok())
      return Fail(s);
    return 0;
  }
  return 0;
}
