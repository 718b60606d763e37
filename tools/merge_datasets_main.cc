// merge_datasets: Megatron's tools/merge_datasets.py — every .bin/.idx pair in a directory,
// in sorted prefix order, into one dataset.
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "libdata/indexed_dataset_builder.h"
#include "libfs/atomic_file.h"

int main(int argc, char** argv) {
  CLI::App app{"Merge the indexed datasets of a directory (Megatron's merge_datasets.py)"};
  std::string input, output_prefix;
  app.add_option("--input", input, "Directory holding <prefix>.bin/.idx pairs")->required();
  app.add_option("--output-prefix", output_prefix, "Output: <prefix>.bin and <prefix>.idx")
      ->required();
  CLI11_PARSE(app, argc, argv);
  leantron::fs::InstallTempFileCleanupOnSignals();
  absl::StatusOr<std::vector<std::string>> merged =
      leantron::data::MergeDatasetDirectory(input, output_prefix);
  if (!merged.ok()) {
    std::cerr << "merge_datasets: " << merged.status().message() << "\n";
    return 1;
  }
  std::cerr << "Merged " << merged->size() << " datasets into " << output_prefix << "\n";
  return 0;
}
