"""The main job's chain on real text, end to end through the tools: preprocess_data (GPT-2
tokenizer) -> train with TP 2 x PP 2 -> reshard_checkpoint to TP 1 x PP 2 -> train resumes from
it -> convert_hf exports to HuggingFace. The resumed losses continue the uninterrupted run's (to
the vocabulary padding that TP changes) and the export has GPT-2's true vocabulary."""
import json
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from tiktoken_ref import run_tool, vocab_args
from train_testlib import parse_log, run_train

ITERS, HALF = 16, 8


def gpt(data):
    return ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
            "--seq-length", "32", "--tokenizer-type", "GPT2BPETokenizer", *vocab_args(),
            "--data-path", data, "--split", "95,5,0", "--micro-batch-size", "2",
            "--global-batch-size", "8", "--train-iters", ITERS, "--lr", "3e-3",
            "--lr-warmup-iters", "2", "--lr-decay-style", "cosine", "--log-interval", "1",
            "--eval-interval", HALF, "--eval-iters", "1"]


def test_preprocess_train_reshard_resume_export(tmp_path):
    docs = []
    for path in sorted(Path("/usr/share/common-licenses").glob("*")):
        if path.is_file():
            docs += [p for p in path.read_text(errors="replace").split("\n\n") if len(p) > 40]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    run_tool("preprocess_data", ["--input", str(tmp_path / "corpus.jsonl"), "--output-prefix",
                                 str(tmp_path / "real"), "--append-eod", *vocab_args()])
    data = str(tmp_path / "real_text_document")
    layout = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
              "--sequence-parallel"]

    straight = parse_log(run_train(gpt(data) + layout, nproc=4).stdout)[0]
    run_train(gpt(data) + layout + ["--save", tmp_path / "a", "--exit-interval", HALF], nproc=4)
    run_tool("reshard_checkpoint", ["--load", str(tmp_path / "a"), "--save", str(tmp_path / "b"),
                                    "--target-tp", "1", "--target-pp", "2"])
    resumed = parse_log(run_train(gpt(data) + ["--pipeline-model-parallel-size", "2", "--load",
                                               tmp_path / "b", "--save", tmp_path / "c"],
                                  nproc=2).stdout)[0]
    assert sorted(resumed) == list(range(HALF + 1, ITERS + 1))
    for it, row in resumed.items():
        # TP 2 pads the vocabulary to 50432 rows, TP 1 to 50304: the dropped padding rows took
        # part in the softmax, so the numbers move a little.
        assert row[1] == pytest.approx(straight[it][1], rel=3e-3), it
    assert straight[ITERS][1] < straight[1][1] - 0.5

    run_tool("convert_hf", ["--to-hf", "--load", str(tmp_path / "c"), "--save",
                            str(tmp_path / "hf")])
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["vocab_size"] == 50257 and cfg["n_layer"] == 4 and cfg["n_embd"] == 32
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    wte = tensors.get("transformer.wte.weight", tensors.get("wte.weight"))
    assert wte.shape == (50257, 32)
