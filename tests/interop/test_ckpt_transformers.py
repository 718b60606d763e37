"""The exported HF folders against the real reference: where `transformers` and `torch` are
installed (the device machine; not CI), a tiny GPT-2 and Llama made with numpy, taken HF -> ours
TP2/PP2 -> TP1/PP4 -> HF by our tools, load with `from_pretrained` and give the same logits as
transformers on the original folder, and as the float64 numpy forwards the other tests use.

Preparing the folders needs the tools; checking them needs transformers. On a machine with only one
of the two, run the halves separately:
    python3 tests/interop/test_ckpt_transformers.py prepare DIR   (here)
    python3 tests/interop/test_ckpt_transformers.py check DIR     (where transformers is)
"""
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ckpt_testlib import BIN, gpt2_forward_hf, llama_forward_hf, make_gpt2, make_llama, read_hf, run  # noqa: E402

HAVE_TRANSFORMERS = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
HAVE_TOOLS = (BIN / "convert_hf").exists() and (BIN / "reshard_checkpoint").exists()
IDS = [5, 17, 250, 3, 99, 42, 7, 280, 1, 64, 120]


def prepare(root):
    root = Path(root)
    make_gpt2(root / "gpt2_hf")
    make_llama(root / "llama_hf", kv_heads=2)
    for arch in ("gpt2", "llama"):
        run("convert_hf", "--from-hf", root / f"{arch}_hf", "--save", root / f"{arch}_a", "--target-tp", 2,
            "--target-pp", 2)
        run("reshard_checkpoint", "--load", root / f"{arch}_a", "--save", root / f"{arch}_b", "--target-tp", 1,
            "--target-pp", 4)
        run("convert_hf", "--to-hf", "--load", root / f"{arch}_b", "--save", root / f"{arch}_out")


def transformers_logits(path):
    import torch
    from transformers import AutoModelForCausalLM

    # Loaded as saved (float32), then the whole model in float64 like the numpy forward.
    model = AutoModelForCausalLM.from_pretrained(str(path)).double()
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].numpy()


def check(root):
    root = Path(root)
    for arch in ("gpt2", "llama"):
        original = transformers_logits(root / f"{arch}_hf")
        exported = transformers_logits(root / f"{arch}_out")
        assert np.array_equal(original, exported), arch
        cfg = json.loads((root / f"{arch}_hf" / "config.json").read_text())
        tensors = read_hf(root / f"{arch}_hf")
        forward = gpt2_forward_hf if arch == "gpt2" else llama_forward_hf
        # transformers computes Llama's RoPE angles in float32 even in a float64 model (its
        # rotary embedding casts to float), so Llama agrees to ~1e-6; GPT-2 to ~1e-14. A layout
        # error would be off by O(0.1).
        tolerance = 1e-10 if arch == "gpt2" else 1e-5
        np.testing.assert_allclose(forward(tensors, cfg, np.array(IDS)), original, rtol=tolerance,
                                   atol=tolerance)
        print(f"{arch}: exported folder matches transformers on the original; numpy forward agrees "
              f"(max |diff| {np.abs(forward(tensors, cfg, np.array(IDS)) - original).max():.3g})")


@pytest.mark.skipif(not (HAVE_TRANSFORMERS and HAVE_TOOLS), reason="needs transformers, torch and the tools")
def test_exported_folders_match_transformers(tmp_path):
    prepare(tmp_path)
    check(tmp_path)


if __name__ == "__main__":
    {"prepare": prepare, "check": check}[sys.argv[1]](sys.argv[2])
