"""Checkpoints made by real Megatron-LM (testdata/megatron/<name>/, written on a GPU machine by
testdata/megatron/make_fixtures.sh: pretrain_gpt.py, tiny GPT-2- and Llama-style models, mock data,
--ckpt-format torch and torch_dist, TP/PP/DP 2, both optimizers) against what Megatron itself
made of them: dump.safetensors beside each holds every tensor, merged over the ranks by Megatron's
own loader and PyTorch's DCP merge (param/, main_param/, exp_avg/, exp_avg_sq/ + Megatron-Core
name). Each fixture is imported, resharded, written back in Megatron's format and exported to HF,
and every tensor compared bitwise with the dump; the HF export through an independent numpy
mapping (test_ckpt_hf_roundtrip's).

tests/CMakeLists.txt registers this file only when fixtures are committed (it could only skip
without them). LEANTRON_MEGATRON_FIXTURES points it at another folder of fixtures."""
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from ckpt_testlib import ROOT, raw_read, run
from test_ckpt_hf_roundtrip import megatron_from_hf_gpt2, megatron_from_hf_llama
from torch_format_writer import bf16_to_f32

FIXTURES = Path(os.environ.get("LEANTRON_MEGATRON_FIXTURES", Path(ROOT) / "testdata" / "megatron"))
CASES = sorted(p.parent for p in FIXTURES.glob("*/meta.json"))
KINDS = ("main_param", "exp_avg", "exp_avg_sq")
VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight")


def bits(dtype, shape, blob):
    """Raw bits as an integer array (bitwise comparisons, NaN-safe)."""
    kind = {"BF16": np.uint16, "F16": np.uint16, "F32": np.uint32}[dtype]
    return np.frombuffer(blob, kind).reshape(shape)


def load_dump(fixture):
    """{kind: {name: (dtype, bits)}} from dump.safetensors, and meta.json."""
    out = {k: {} for k in ("param",) + KINDS}
    for key, (dtype, shape, blob) in raw_read(fixture / "dump.safetensors").items():
        kind, name = key.split("/", 1)
        out[kind][name] = (dtype, bits(dtype, shape, blob))
    meta = json.loads((fixture / "meta.json").read_text())
    assert out["param"], f"{fixture}: empty dump"
    return out, meta


def assert_same(name, got, want, vocab):
    """Bitwise; vocabulary matrices over the rows both hold (padding depends on the layout), and
    at least the true vocabulary."""
    if name.split("/")[-1] in VOCAB_ROWS:
        rows = min(len(got), len(want))
        assert rows >= vocab, (name, got.shape, want.shape, vocab)
        got, want = got[:rows], want[:rows]
    assert got.shape == want.shape, (name, got.shape, want.shape)
    mismatch = int(np.count_nonzero(got != want))
    assert mismatch == 0, f"{name}: {mismatch} of {got.size} elements differ"


def read_ours_bits(path):
    """Our TP1/PP1 checkpoint (any iteration the tracker names): {kind: {name: (dtype, bits)}}
    and its metadata."""
    it = int((path / "latest_checkpointed_iteration.txt").read_text())
    it_dir = path / f"iter_{it:07d}"
    meta = json.loads((it_dir / "metadata.json").read_text())
    out = {k: {} for k in ("param",) + KINDS}
    for file in ("model.safetensors", "optimizer.safetensors"):
        f = it_dir / "mp_rank_00" / file
        if not f.exists():
            continue
        for key, (dtype, shape, blob) in raw_read(f).items():
            kind = next((k for k in KINDS if key.startswith(k + ".")), "param")
            name = key if kind == "param" else key[len(kind) + 1:]
            out[kind][name] = (dtype, bits(dtype, shape, blob))
    return out, meta


def compare_with_dump(ours, dump, vocab, tied):
    checked = 0
    for kind, tensors in dump.items():
        for name, (dtype, want) in tensors.items():
            if name == "output_layer.weight" and tied:
                continue  # Megatron's tied copy on the last stage: the embedding's values
            assert name in ours[kind], f"{kind}/{name} missing from ours"
            got_dtype, got = ours[kind][name]
            assert got_dtype == dtype, (kind, name, got_dtype, dtype)
            assert_same(f"{kind}/{name}", got, want, vocab)
            checked += 1
    extra = {(k, n) for k in ours for n in ours[k]} - {(k, n) for k in dump for n in dump[k]}
    assert not extra, f"ours holds tensors Megatron's dump lacks: {sorted(extra)[:5]}"
    return checked


def model_of(path):
    it = int((path / "latest_checkpointed_iteration.txt").read_text())
    return json.loads((path / f"iter_{it:07d}" / "metadata.json").read_text())["model"]


@pytest.fixture(params=CASES, ids=[c.name for c in CASES])
def fixture(request):
    return request.param


def test_fixtures_are_complete():
    """Every fixture has its checkpoint, dump, metadata and provenance."""
    assert CASES, f"no fixtures under {FIXTURES}"
    for case in CASES:
        for part in ("ckpt/latest_checkpointed_iteration.txt", "dump.safetensors", "meta.json", "VERSIONS",
                     "command.txt"):
            assert (case / part).exists(), f"{case}: {part} missing"
        assert re.search(r"^megatron-lm [0-9a-f]{40}$", (case / "VERSIONS").read_text(), re.M), case


def test_import_reshard_and_write_back_are_bitwise(tmp_path, fixture):
    """Megatron's checkpoint -> ours at TP1/PP1 -> ours at TP2/PP2 -> Megatron's format at TP1 ->
    ours at TP1/PP1: every weight and optimizer tensor equals Megatron's dump at each TP1 stop."""
    dump, meta = load_dump(fixture)
    src = fixture / "ckpt"
    tp1 = tmp_path / "tp1"
    run("reshard_checkpoint", "--load", src, "--save", tp1, "--target-tp", 1, "--target-pp", 1)
    ours, ours_meta = read_ours_bits(tp1)
    model = ours_meta["model"]
    tied = not model["untie_embeddings_and_output_weights"]
    assert ours_meta["iteration"] == meta["iteration"]
    assert ours_meta["optimizer"]["step"] == meta["step"]
    assert compare_with_dump(ours, dump, model["vocab_size"], tied) == sum(
        len(v) for v in dump.values()) - (tied and "output_layer.weight" in dump["param"]) * (1 + len(KINDS))
    # The vocabulary Megatron trained with (NullTokenizer --vocab-size 128: its EOD included).
    assert model["vocab_size"] == 128

    tp2pp2 = tmp_path / "tp2pp2"
    run("reshard_checkpoint", "--load", tp1, "--save", tp2pp2, "--target-tp", 2, "--target-pp", 2)
    back = tmp_path / "megatron_tp1"
    run("reshard_checkpoint", "--load", tp2pp2, "--save", back, "--target-tp", 1, "--target-pp", 1,
        "--save-format", "megatron")
    again = tmp_path / "again"
    run("reshard_checkpoint", "--load", back, "--save", again, "--target-tp", 1, "--target-pp", 1)
    compare_with_dump(read_ours_bits(again)[0], dump, model["vocab_size"], tied)


def test_hf_export_matches_megatrons_weights(tmp_path, fixture):
    """convert_hf --to-hf straight from Megatron's checkpoint; mapped back to Megatron's layout by
    the independent numpy mapping, every weight equals the dump (true vocabulary rows)."""
    dump, _ = load_dump(fixture)
    hf = tmp_path / "hf"
    run("convert_hf", "--to-hf", "--load", fixture / "ckpt", "--save", hf)
    cfg = json.loads((hf / "config.json").read_text())
    tensors = {}
    for f in sorted(hf.glob("*.safetensors")):
        for name, (dtype, shape, blob) in raw_read(f).items():
            assert dtype == "BF16", (name, dtype)  # as Megatron trained it
            tensors[name] = bf16_to_f32(np.frombuffer(blob, np.uint16)).reshape(shape)
    if cfg["model_type"] == "gpt2":
        assert cfg["activation_function"] == "gelu_new"  # --openai-gelu
        mapped = megatron_from_hf_gpt2(tensors, cfg, 1)
    else:
        mapped = megatron_from_hf_llama(tensors, cfg, 1)
    vocab = cfg["vocab_size"]
    assert vocab == 128
    want_names = {n for n in dump["param"] if not (n == "output_layer.weight" and "lm_head.weight" not in tensors)}
    assert set(mapped) == want_names, sorted(set(mapped) ^ want_names)
    for name, array in mapped.items():
        dtype, want = dump["param"][name]
        want = bf16_to_f32(want).reshape(want.shape)
        if name in VOCAB_ROWS:
            array, want = array[:vocab], want[:vocab]
        np.testing.assert_array_equal(array, want, err_msg=name)


def test_inspect_reads_the_run(fixture):
    _, meta = load_dump(fixture)
    out = run("inspect", "checkpoint", fixture / "ckpt").stdout
    fmt = "torch_dist" if meta["format"] == "torch_dist" else "torch"
    assert re.search(rf"^format: megatron {fmt}\b", out, re.M), out[:400]
    assert f"iteration: {meta['iteration']}" in out
    assert f"layout: TP={meta['tp']} PP={meta['pp']}" in out
    assert f"optimizer: adam, step {meta['step']}" in out
