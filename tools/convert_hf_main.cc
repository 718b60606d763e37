// convert_hf: HuggingFace GPT2LMHeadModel / LlamaForCausalLM / MistralForCausalLM /
// Qwen2ForCausalLM folders to and from checkpoints.
//   convert_hf --from-hf HF_DIR --save DIR [--target-tp N --target-pp M --target-vpp V]
//              [--target-decoder-first-pipeline-num-layers F]
//              [--target-decoder-last-pipeline-num-layers L]
//   convert_hf --to-hf --load DIR --save HF_DIR [--iteration K] [--max-shard-size BYTES]
//   [--overwrite] [--no-verify-checkpoint]
#include <cstdint>
#include <iostream>
#include <optional>

#include "CLI/CLI.hpp"
#include "libckpt/hf_convert.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Convert between HuggingFace safetensors folders (GPT-2, Llama, Mistral, Qwen2) and "
      "Leantron checkpoints"};
  std::string from_hf, load, save, tokenizer_dir;
  bool to_hf = false, copy_tokenizer = false, overwrite = false, no_verify = false;
  leantron::ckpt::HfImportOptions import_options;
  leantron::ckpt::HfExportOptions export_options;
  std::optional<int64_t> iteration;
  auto* from_opt = app.add_option("--from-hf", from_hf, "HF model folder to import");
  auto* to_opt = app.add_flag("--to-hf", to_hf, "Export --load to a HF folder at --save");
  from_opt->excludes(to_opt);
  app.add_option("--load", load, "Checkpoint directory to export (with --to-hf)");
  app.add_option("--save", save, "Output: checkpoint directory, or HF folder with --to-hf")
      ->required();
  app.add_option("--target-tp", import_options.target.tp, "Tensor-parallel size of the import");
  app.add_option("--target-pp", import_options.target.pp, "Pipeline-parallel size of the import");
  app.add_option("--target-vpp", import_options.target.vpp, "Virtual pipeline chunks per stage");
  app.add_option("--target-decoder-first-pipeline-num-layers",
                 import_options.target.first_stage_layers,
                 "Layers on the first pipeline stage (uneven split; default 0: even)");
  app.add_option("--target-decoder-last-pipeline-num-layers",
                 import_options.target.last_stage_layers,
                 "Layers on the last pipeline stage (uneven split; default 0: even)");
  app.add_option("--make-vocab-size-divisible-by", import_options.make_vocab_size_divisible_by,
                 "Vocabulary padding divisor (times TP)");
  app.add_option("--iteration", iteration, "Iteration: saved as (import), read (export)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-shard-size", export_options.max_shard_bytes,
                 "Largest HF shard in bytes (export)");
  app.add_flag("--copy-tokenizer-files", copy_tokenizer,
               "Copy vocab.json, merges.txt, tokenizer.json, ... along (import: into "
               "<save>/tokenizer; export: from <load>/tokenizer or --tokenizer-dir)");
  app.add_option("--tokenizer-dir", tokenizer_dir, "Tokenizer files to copy on export");
  app.add_flag("--overwrite", overwrite,
               "Write into a --save that already holds data: import replaces the iteration and "
               "moves the tracker to it, export replaces the folder as a whole");
  app.add_flag("--no-verify-checkpoint", no_verify,
               "Export: skip the content checks of --load (checksums, NaN, replicated copies)");
  CLI11_PARSE(app, argc, argv);

  absl::Status status;
  if (to_hf) {
    if (load.empty()) {
      std::cerr << "convert_hf: --to-hf needs --load DIR\n";
      return 1;
    }
    export_options.iteration = iteration;
    export_options.overwrite = overwrite;
    export_options.verify = !no_verify;
    export_options.copy_tokenizer_files = copy_tokenizer;
    export_options.tokenizer_dir = tokenizer_dir;
    status = leantron::ckpt::ExportHfCheckpoint(load, save, export_options);
  } else if (!from_hf.empty()) {
    if (iteration) import_options.iteration = *iteration;
    import_options.overwrite = overwrite;
    import_options.copy_tokenizer_files = copy_tokenizer;
    status = leantron::ckpt::ImportHfCheckpoint(from_hf, save, import_options);
  } else {
    std::cerr << "convert_hf: give --from-hf HF_DIR or --to-hf --load DIR\n";
    return 1;
  }
  if (!status.ok()) {
    std::cerr << "convert_hf: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
