"""What the checkpoint tools do with a destination that holds data, with configs that ask for what
is not implemented or claim absurd counts, and with checkpoints whose contents were damaged after
they were saved: refuse with one line naming the file and tensor, never overwrite or load
silently. The checksums are checked against Python's xxhash (an independent XXH3 implementation)."""
import json
import resource
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash

from ckpt_testlib import make_gpt2, make_llama, raw_read, run
from failure_testlib import run_bin, snapshot
from test_ckpt_reshard import GPT2_MODEL, random_state
from ckpt_testlib import write_ours


def header(path):
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), 8 + n


def checkpoint(tmp_path, name="ck", tp=2, pp=1, optimizer=False):
    """A checkpoint written by the C++ tools (so with checksums)."""
    if optimizer:
        params, opt = random_state(GPT2_MODEL, tp, seed=5)
        write_ours(tmp_path / "py", GPT2_MODEL, tp, pp, 1, params, opt, iteration=3, step=3)
        run("reshard_checkpoint", "--load", tmp_path / "py", "--save", tmp_path / name,
            "--target-tp", tp, "--target-pp", pp)
    else:
        make_gpt2(tmp_path / "hf")
        run("convert_hf", "--from-hf", tmp_path / "hf", "--save", tmp_path / name, "--target-tp",
            tp, "--target-pp", pp)
    return tmp_path / name


def shard(ck, tp=0, name="model.safetensors"):
    it = int((ck / "latest_checkpointed_iteration.txt").read_text())
    return ck / f"iter_{it:07d}" / f"mp_rank_{tp:02d}" / name


def patch_tensor(path, tensor, update, fix_checksum):
    """Applies update(np.float32 array) to a tensor in place; with fix_checksum the stored
    checksum is rewritten to match, as a writer that stored the damage would have."""
    h, start = header(path)
    begin, end = h[tensor]["data_offsets"]
    data = bytearray(Path(path).read_bytes())
    values = np.frombuffer(bytes(data[start + begin:start + end]), np.float32).copy()
    update(values)
    data[start + begin:start + end] = values.tobytes()
    if fix_checksum:
        old = h["__metadata__"][f"xxh3_64:{tensor}"].encode()
        new = f"{xxhash.xxh3_64_intdigest(values.tobytes()):016x}".encode()
        key = f'"xxh3_64:{tensor}":"'.encode()
        at = data.index(key + old)
        data[at + len(key):at + len(key) + 16] = new
    Path(path).write_bytes(bytes(data))


# ------------------------------------------------------------------------------- D3: destinations
def test_a_saved_iteration_is_not_replaced_without_overwrite(tmp_path):
    src = checkpoint(tmp_path, "src")
    run("reshard_checkpoint", "--load", src, "--save", tmp_path / "dst", "--target-tp", 1,
        "--target-pp", 1)
    before = snapshot(tmp_path / "dst")
    for tool, args in [("reshard_checkpoint", ["--load", src, "--target-tp", 2, "--target-pp", 1]),
                       ("convert_hf", ["--from-hf", tmp_path / "hf"])]:
        proc = run(tool, *args, "--save", tmp_path / "dst", ok=False)
        assert proc.returncode == 1 and "--overwrite" in proc.stderr, proc.stderr
        assert str(tmp_path / "dst") in proc.stderr
        assert snapshot(tmp_path / "dst") == before
    # An older iteration would move the tracker back; a newer one is added.
    run("convert_hf", "--from-hf", tmp_path / "hf", "--save", tmp_path / "dst", "--iteration", 5)
    assert (tmp_path / "dst" / "latest_checkpointed_iteration.txt").read_text() == "5"
    proc = run("convert_hf", "--from-hf", tmp_path / "hf", "--save", tmp_path / "dst",
               "--iteration", 3, ok=False)
    assert "move its tracker back" in proc.stderr, proc.stderr
    assert (tmp_path / "dst" / "latest_checkpointed_iteration.txt").read_text() == "5"
    # --overwrite replaces it.
    run("reshard_checkpoint", "--load", src, "--save", tmp_path / "dst", "--target-tp", 2,
        "--target-pp", 1, "--overwrite")
    assert (tmp_path / "dst" / "latest_checkpointed_iteration.txt").read_text() == "0"


def test_a_folder_that_is_not_a_checkpoint_is_not_written_into(tmp_path):
    src = checkpoint(tmp_path, "src")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    proc = run("reshard_checkpoint", "--load", src, "--save", mine, "--target-tp", 1,
               "--target-pp", 1, ok=False)
    assert "not a checkpoint directory" in proc.stderr, proc.stderr
    assert snapshot(mine) == {"notes.txt": b"keep"}


# ------------------------------------------------------------------------------- S2: HF export
def test_an_export_replaces_the_folder_as_a_whole(tmp_path):
    ck = checkpoint(tmp_path, tp=1)
    run("convert_hf", "--to-hf", "--load", ck, "--save", tmp_path / "fresh", "--max-shard-size",
        20000)
    fresh = snapshot(tmp_path / "fresh")
    assert "model.safetensors.index.json" in fresh and "model.safetensors" not in fresh
    out = tmp_path / "out"
    run("convert_hf", "--to-hf", "--load", ck, "--save", out)  # one model.safetensors
    old = snapshot(out)
    proc = run("convert_hf", "--to-hf", "--load", ck, "--save", out, "--max-shard-size", 20000,
               ok=False)
    assert "--overwrite" in proc.stderr and str(out) in proc.stderr, proc.stderr
    assert snapshot(out) == old
    run("convert_hf", "--to-hf", "--load", ck, "--save", out, "--max-shard-size", 20000,
        "--overwrite")
    assert snapshot(out) == fresh  # no stale model.safetensors beside the new index
    assert not any(p.name.startswith("out.") for p in tmp_path.iterdir())


# ------------------------------------------------------------------------------- S4: HF configs
@pytest.mark.parametrize("edit,message", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                       "original_max_position_embeddings": 64}}, "rope_scaling of type 'yarn'"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling of type 'linear'"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 8.0}},
     "rope_parameters of type 'dynamic'"),
    # llama3 is applied, but only with all four of its numbers.
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}},
     "missing or mistyped 'rope_parameters.low_freq_factor'"),
    ({"rope_theta": "ten thousand"}, "'rope_theta'"),
    ({"rms_norm_eps": [1e-5]}, "'rms_norm_eps'"),
])
def test_hf_configs_asking_for_what_is_not_applied_are_refused(tmp_path, edit, message):
    make_llama(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.update(edit)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    proc = run("convert_hf", "--from-hf", tmp_path / "hf", "--save", tmp_path / "ck", ok=False)
    assert message in proc.stderr and "config.json" in proc.stderr, proc.stderr
    assert not (tmp_path / "ck").exists()


def test_unscaled_rope_configs_still_convert(tmp_path):
    make_llama(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.update({"rope_scaling": None, "rope_theta": 500000})
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    run("convert_hf", "--from-hf", tmp_path / "hf", "--save", tmp_path / "ck")
    meta = json.loads((tmp_path / "ck" / "iter_0000000" / "metadata.json").read_text())
    assert meta["model"]["rotary_base"] == 500000


# ------------------------------------------------------------------------------- S5: contents
def test_shards_store_each_tensors_checksum_and_their_rank(tmp_path):
    ck = checkpoint(tmp_path, tp=2, optimizer=True)
    meta = json.loads((ck / "iter_0000003" / "metadata.json").read_text())
    assert meta["checksums"] == "xxh3_64"
    for tp in range(2):
        for name in ("model.safetensors", "optimizer.safetensors"):
            path = shard(ck, tp, name)
            h, _ = header(path)
            assert h["__metadata__"]["tp_rank"] == str(tp)
            assert h["__metadata__"]["pp_rank"] == "0"
            tensors = raw_read(path)
            assert tensors
            for tensor, (_, _, data) in tensors.items():
                assert h["__metadata__"][f"xxh3_64:{tensor}"] == f"{xxhash.xxh3_64_intdigest(data):016x}"


LOADERS = [
    ("reshard_checkpoint", lambda ck, out: ["--load", ck, "--save", out, "--target-tp", 1,
                                            "--target-pp", 1]),
    ("convert_hf", lambda ck, out: ["--to-hf", "--load", ck, "--save", out]),
    ("inspect", lambda ck, out: ["checkpoint", ck]),
]


def expect_refused(ck, tmp_path, *words):
    for tool, args in LOADERS:
        out = tmp_path / f"out_{tool}"
        proc = run(tool, *args(ck, out), ok=False)
        assert proc.returncode == 1, proc.stderr
        for word in words:
            assert word in proc.stderr, (tool, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not out.exists()


def test_a_flipped_byte_is_found_and_the_check_can_be_skipped(tmp_path):
    ck = checkpoint(tmp_path)
    path = shard(ck, 1)
    tensor = "decoder.layers.2.mlp.linear_fc1.weight"
    patch_tensor(path, tensor, lambda v: v.view(np.uint32).__setitem__(7, v.view(np.uint32)[7] ^ 1),
                 fix_checksum=False)
    expect_refused(ck, tmp_path, str(path), tensor, "checksum")
    for tool, args in LOADERS:
        run(tool, *args(ck, tmp_path / f"skip_{tool}"), "--no-verify-checkpoint")


def test_nan_is_refused_even_with_a_matching_checksum(tmp_path):
    ck = checkpoint(tmp_path)
    tensor = "decoder.layers.0.self_attention.linear_proj.weight"
    patch_tensor(shard(ck, 0), tensor, lambda v: v.__setitem__(3, np.nan), fix_checksum=True)
    expect_refused(ck, tmp_path, tensor, "NaN at element 3")


def test_swapped_tensor_parallel_directories_are_refused(tmp_path):
    ck = checkpoint(tmp_path)
    a, b = shard(ck, 0).parent, shard(ck, 1).parent
    a.rename(a.with_name("tmp"))
    b.rename(a)
    a.with_name("tmp").rename(b)
    expect_refused(ck, tmp_path, "swapped", "tp_rank")


def test_replicated_copies_that_differ_are_refused(tmp_path):
    ck = checkpoint(tmp_path)
    tensor = "decoder.layers.1.input_layernorm.weight"
    patch_tensor(shard(ck, 1), tensor, lambda v: v.__setitem__(0, v[0] + 0.5), fix_checksum=True)
    expect_refused(ck, tmp_path, tensor, "replicated")


def test_weights_that_disagree_with_their_main_params_are_refused(tmp_path):
    ck = checkpoint(tmp_path, optimizer=True)
    tensor = "decoder.layers.3.self_attention.linear_qkv.weight"
    patch_tensor(shard(ck, 0), tensor, lambda v: v.__setitem__(5, v[5] * 1.5 + 1), fix_checksum=True)
    expect_refused(ck, tmp_path, tensor, "main_param", "bf16 rounding")


# ------------------------------------------------------------------------------- H1: counts
def limited_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_a_metadata_claiming_a_billion_layers_is_refused_before_allocating(tmp_path):
    ck = checkpoint(tmp_path, tp=1)
    meta_path = ck / "iter_0000000" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["model"]["num_layers"] = 10**9
    meta_path.write_text(json.dumps(meta))
    for tool, args in LOADERS:
        proc = run_bin(tool, args(ck, tmp_path / f"out_{tool}"), preexec=limited_memory)
        assert proc.returncode == 1, (tool, proc.returncode, proc.stderr[-2000:])
        assert "1000000000 layers" in proc.stderr and "metadata.json" in proc.stderr, proc.stderr


def test_a_hf_config_claiming_a_billion_layers_is_refused_before_allocating(tmp_path):
    make_gpt2(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["n_layer"] = 10**9
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    proc = run_bin("convert_hf", ["--from-hf", tmp_path / "hf", "--save", tmp_path / "ck"],
                   preexec=limited_memory)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "1000000000 layers" in proc.stderr and "hold 4" in proc.stderr, proc.stderr
