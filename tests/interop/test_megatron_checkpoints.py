"""Megatron-LM's own checkpoints (`--ckpt-format torch` and `torch_dist`), made from Python by an
independent implementation of what Megatron saves (megatron_testlib.py, over torch_format_writer.py:
no torch here), read by the C++ tools: imported, resharded, exported to HF and inspected with
every tensor (weights, fp32 main weights, Adam moments, step) compared bitwise; written back in
Megatron's format (--save-format megatron) and read again bitwise, by our reader and by a Python
reader of torch.save archives; hostile and broken files refused with a clear error."""
import json
import os
import pty
import select
import subprocess
import zipfile

import numpy as np
import pytest

from ckpt_testlib import padded_vocab, run, tool, write_ours
from failure_testlib import run_bin, small_disk, snapshot
from megatron_testlib import (assert_same_state, local_name, megatron_order, read_hf_f32, read_ours_f32,
                              stage_names, write_megatron_dist, write_megatron_torch)
from test_ckpt_reshard import GPT2_MODEL, LLAMA_MODEL, random_state
from torch_format_writer import torch_load

GPT2_BF16 = dict(GPT2_MODEL, params_dtype="BF16")
LLAMA_BF16 = dict(LLAMA_MODEL, params_dtype="BF16")


def state(model, tp, seed, bf16=True):
    """Weights, fp32 main weights and Adam moments; an fp32 run's main weights are its weights."""
    params, opt = random_state(model, tp, seed)
    if not bf16:
        opt = dict(opt, main_param=params)
    return params, opt


def reshard(src, dst, tp, pp, *extra, ok=True):
    return run("reshard_checkpoint", "--load", src, "--save", dst, "--target-tp", tp, "--target-pp", pp,
               *extra, ok=ok)


def check_import(tmp_path, src, model, params, opt, with_optimizer=True):
    """Reshard the Megatron checkpoint into our format at two layouts: every tensor bitwise."""
    for tp, pp in [(1, 1), (2, 2)]:
        out = tmp_path / f"ours_tp{tp}pp{pp}"
        reshard(src, out, tp, pp)
        meta, ours = read_ours_f32(out)
        assert meta["iteration"] == 20 and meta["consumed_samples"] == 160
        assert (meta["optimizer"] is not None) == with_optimizer
        if with_optimizer:
            assert meta["optimizer"]["step"] == 20
        assert meta["args"]["lr"] == 3e-4 and meta["args"]["global_batch_size"] == 8
        assert_same_state(ours, params, opt, with_optimizer)


LEGACY_CASES = {
    # id: (model, tp, pp, vpp, distributed optimizer, bf16, names)
    "gpt2_tp2pp2_distopt": (GPT2_MODEL, 2, 2, 1, True, True, "mcore"),
    "llama_tp2_adam": (LLAMA_MODEL, 2, 1, 1, False, True, "mcore"),
    "gpt2_pp2vpp2_fp32_adam": (GPT2_MODEL, 1, 2, 2, False, False, "mcore"),
    "gpt2_pp2vpp2_fp32_distopt": (GPT2_MODEL, 1, 2, 2, True, False, "mcore"),
    "llama_pp2_distopt_te_names": (LLAMA_MODEL, 1, 2, 1, True, True, "te"),
}


@pytest.mark.parametrize("case", LEGACY_CASES, ids=list(LEGACY_CASES))
def test_legacy_torch_import(tmp_path, case):
    model, tp, pp, vpp, dist, bf16, style = LEGACY_CASES[case]
    params, opt = state(model, tp, seed=11, bf16=bf16)
    src = tmp_path / "megatron"
    write_megatron_torch(src, model, tp, pp, vpp, params, opt, iteration=20, step=20, dist_opt=dist,
                         bf16=bf16, style=style)
    check_import(tmp_path, src, model, params, opt)


def test_legacy_language_model_names_without_optimizer(tmp_path):
    params, opt = state(GPT2_MODEL, 2, seed=12)
    src = tmp_path / "megatron"
    write_megatron_torch(src, GPT2_MODEL, 2, 1, 1, params, opt, iteration=20, step=20, dist_opt=False,
                         style="legacy", with_optimizer=False)
    check_import(tmp_path, src, GPT2_MODEL, params, opt, with_optimizer=False)


# Tensors of several of the reader's 256 KiB pieces (TpShardSource::kStreamPiece, read ahead in a
# second thread): an fp32 embedding of 3328 x 256 (13 pieces, 6.5 per TP2 shard), a SwiGLU
# linear_fc1 of 2048 x 256, a row-parallel linear_fc2 of 256 x 1024 (gathered from every rank,
# piece by piece). The vocabulary (3100) pads to 3328 rows at TP2, 3200 at TP1 (the source's last
# rows are skipped, still CRC-checked) and 3584 at TP4 (zero rows added).
BIG = {"num_layers": 2, "hidden_size": 256, "ffn_hidden_size": 1024, "num_attention_heads": 8,
       "num_query_groups": 8, "kv_channels": 32, "vocab_size": 3100, "max_position_embeddings": 512}
BIG_CASES = {
    "gpt2_tp2_adam": (dict(GPT2_MODEL, **BIG), False),
    "llama_tp2_adam": (dict(LLAMA_MODEL, **dict(BIG, num_query_groups=4)), False),
    "gpt2_tp2_distopt": (dict(GPT2_MODEL, **BIG), True),
}


@pytest.mark.parametrize("case", BIG_CASES, ids=list(BIG_CASES))
def test_legacy_torch_import_streams_large_tensors(tmp_path, case):
    model, dist = BIG_CASES[case]
    params, opt = state(model, 2, seed=19)
    src = tmp_path / "megatron"
    write_megatron_torch(src, model, 2, 1, 1, params, opt, iteration=20, step=20, dist_opt=dist)
    for tp in (1, 4):
        out = tmp_path / f"ours_tp{tp}"
        reshard(src, out, tp, 1)
        _, ours = read_ours_f32(out)
        assert_same_state(ours, params, opt)
    # A byte flipped in the last piece of the largest record, after the reader has written the
    # pieces before it: the CRC check names the record and nothing is left behind.
    model_file = src / "iter_0000020" / "mp_rank_01" / ("distrib_optim.pt" if dist else "model_optim_rng.pt")
    blob = bytearray(model_file.read_bytes())
    with zipfile.ZipFile(model_file) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    assert info.file_size > 4 * (256 << 10)  # several pieces
    local = blob[info.header_offset:info.header_offset + 30]
    start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
    blob[start + info.file_size - 100] ^= 0x40
    model_file.write_bytes(bytes(blob))
    err = reshard(src, tmp_path / "bad", 1, 1, ok=False).stderr
    assert f"{info.filename}' does not match its CRC-32" in err, err
    assert not (tmp_path / "bad").exists()


DIST_CASES = {
    "gpt2_tp2pp2_adam": (GPT2_MODEL, 2, 2, False, True),
    "llama_tp2_distopt_bucket_space": (LLAMA_MODEL, 2, 1, True, True),
    "gpt2_tp2pp2_distopt_bucket_space": (GPT2_MODEL, 2, 2, True, True),
    "llama_tp1_fp32_adam": (LLAMA_MODEL, 1, 1, False, False),
}


@pytest.mark.parametrize("case", DIST_CASES, ids=list(DIST_CASES))
def test_torch_dist_import(tmp_path, case):
    model, tp, pp, dist, bf16 = DIST_CASES[case]
    params, opt = state(model, tp, seed=13, bf16=bf16)
    src = tmp_path / "megatron"
    write_megatron_dist(src, model, tp, pp, params, opt, iteration=20, step=20, dist_opt=dist, bf16=bf16)
    check_import(tmp_path, src, model, params, opt)


# torch_dist: a parameter stored whole (or as one layer of a stacked tensor) streams in blocks of
# rows (MegatronDistReader::StreamFull), copied out of every rank's chunk piece by piece; the
# distributed optimizer's buckets are read whole. Same model sizes as the legacy case above.
@pytest.mark.parametrize("dist", [False, True], ids=["adam", "distopt"])
def test_torch_dist_import_streams_large_tensors(tmp_path, dist):
    model = dict(GPT2_MODEL, **BIG)
    params, opt = state(model, 2, seed=21)
    src = tmp_path / "megatron"
    write_megatron_dist(src, model, 2, 1, params, opt, iteration=20, step=20, dist_opt=dist)
    for tp in (1, 4):
        out = tmp_path / f"ours_tp{tp}"
        reshard(src, out, tp, 1)
        _, ours = read_ours_f32(out)
        assert_same_state(ours, params, opt)
    # A byte flipped in the middle of the largest file (tensor bytes): refused, nothing left behind.
    shard = max((src / "iter_0000020").glob("*.distcp"), key=lambda f: f.stat().st_size)
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0x40
    shard.write_bytes(bytes(blob))
    err = reshard(src, tmp_path / "bad", 1, 1, ok=False).stderr
    assert "does not match its CRC-32" in err, err
    assert not (tmp_path / "bad").exists()


# A disk that fills up in the middle of a streamed tensor (either format, 2 MB; the import writes
# ~14 MB): one error naming the file it could not write, and no iteration or temporary left behind
# in the destination, whose existing contents stay as they were.
@pytest.mark.parametrize("fmt", ["torch", "torch_dist"])
def test_a_full_disk_during_a_streamed_import_leaves_nothing(tmp_path, fmt):
    model = dict(GPT2_MODEL, **BIG)
    params, opt = state(model, 2, seed=23)
    src = tmp_path / "megatron"
    if fmt == "torch":
        write_megatron_torch(src, model, 2, 1, 1, params, opt, iteration=20, step=20, dist_opt=False)
    else:
        write_megatron_dist(src, model, 2, 1, params, opt, iteration=20, step=20)
    with small_disk(tmp_path) as (disk, preexec):
        (disk / "keep.txt").write_text("a user's file\n")
        before = snapshot(disk)
        proc = run_bin("reshard_checkpoint", ["--load", src, "--save", disk / "ck", "--target-tp", 1,
                                              "--target-pp", 1], preexec=preexec)
        assert proc.returncode != 0
        err = proc.stderr.strip()
        assert err.startswith("reshard_checkpoint: cannot write ") and len(err.splitlines()) == 1, err
        assert str(disk / "ck") in err, err
        assert "No space left on device" in err or "File too large" in err, err
        assert snapshot(disk) == before and sorted(p.name for p in disk.iterdir()) == ["keep.txt"]


def expected_keys(model, tp, pp, vpp, p, v):
    """The model state-dict names Megatron-Core (local implementation) saves for a chunk, in order,
    with each linear module's _extra_state after its parameters."""
    layers = model["num_layers"]
    names = stage_names(model, pp)
    order = megatron_order(names, layers, pp, vpp, p, v)
    keys = []
    for k, n in enumerate(order):
        keys.append(local_name(n, layers, pp, vpp))
        module = n.rsplit(".", 1)[0]
        following = order[k + 1].rsplit(".", 1)[0] if k + 1 < len(order) else None
        if following != module and (module.endswith(("linear_proj", "linear_qkv", "linear_fc1", "linear_fc2"))
                                    or module == "output_layer"):
            keys.append(local_name(n, layers, pp, vpp).rsplit(".", 1)[0] + "._extra_state")
    if p == pp - 1 and v == vpp - 1 and "output_layer.weight" not in order:
        keys.append("output_layer._extra_state")
    return keys


@pytest.mark.parametrize("target", [(1, 1, 1, False), (2, 2, 1, True), (2, 1, 1, False), (1, 2, 2, True)],
                         ids=["tp1", "tp2pp2_distopt", "tp2_adam", "pp2vpp2_distopt"])
@pytest.mark.parametrize("source", ["ours_fp32", "megatron_bf16"])
@pytest.mark.parametrize("model", [GPT2_MODEL, LLAMA_MODEL], ids=["gpt2", "llama"])
def test_save_format_megatron_round_trip(tmp_path, model, source, target):
    """Ours (fp32) or Megatron's (bf16, distributed optimizer) -> Megatron's torch format at any
    layout, either optimizer -> ours again: bitwise; and the files are what Megatron writes, read
    by Python's zipfile (CRCs) and pickle."""
    tp, pp, vpp, dist = target
    src = tmp_path / "source"
    bf16 = source == "megatron_bf16"
    params, opt = state(model, 2, seed=14, bf16=bf16)
    if bf16:
        write_megatron_torch(src, model, 2, 2, 1, params, opt, iteration=20, step=20, dist_opt=True)
    else:
        write_ours(src, dict(model, params_dtype="F32"), 2, 2, 1, params, opt, iteration=20, step=20)
    meg = tmp_path / "megatron"
    reshard(src, meg, tp, pp, "--target-vpp", vpp, "--save-format", "megatron",
            "--use-distributed-optimizer" if dist else "--no-use-distributed-optimizer")
    back = tmp_path / "back"
    reshard(meg, back, 2, 2)
    meta, ours = read_ours_f32(back)
    assert meta["optimizer"]["step"] == 20 and meta["iteration"] == 20
    assert_same_state(ours, params, opt)
    dtype = "torch.bfloat16" if bf16 else "torch.float32"
    samples = 160 if bf16 else 12345
    # The files as Megatron writes them.
    it = meg / "iter_0000020"
    layers = model["num_layers"]
    for p in range(pp):
        for t in range(tp):
            d = it / (f"mp_rank_{t:02d}" if pp == 1 else f"mp_rank_{t:02d}_{p:03d}")
            sd = torch_load(d / "model_optim_rng.pt")  # zipfile checks every CRC
            assert sd["checkpoint_version"] == 3.0 and sd["iteration"] == 20
            args = sd["args"]
            assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (tp, pp)
            assert args.padded_vocab_size == padded_vocab(model["vocab_size"], tp)
            assert args.num_layers == layers and args.use_distributed_optimizer == dist
            for v in range(vpp):
                chunk = sd["model" if vpp == 1 else f"model{v}"]
                assert list(chunk) == expected_keys(model, tp, pp, vpp, p, v)
            if "lr" in vars(args):
                assert sd["opt_param_scheduler"]["num_steps"] == samples
            # Mixed precision and the distributed optimizer nest torch's state under "optimizer";
            # an fp32 run's FP32Optimizer saves it as is.
            inner = sd["optimizer"].get("optimizer", sd["optimizer"])
            groups = inner["param_groups"]
            assert [g["wd_mult"] for g in groups] == [1.0, 0.0]
            if dist:
                assert all(g["step"] == 20 for g in groups)
                flat = torch_load(d / "distrib_optim.pt")
                assert flat["buckets_coalesced"] is True
                for v in range(vpp):
                    (key, buffer), = flat[v].items()
                    assert key == (dtype, "torch.float32")
                    assert buffer["param"].shape == (buffer["numel_unpadded"],)
            else:
                n = sum(len(g["params"]) for g in groups)
                assert sorted(inner["state"]) == list(range(n))
                assert all(float(s["step"].numpy()) == 20.0 for s in inner["state"].values())
                assert ("fp32_from_fp16_params" in sd["optimizer"]) == bf16
            with zipfile.ZipFile(d / "model_optim_rng.pt") as z:
                names = z.namelist()
                assert all(n.startswith("model_optim_rng/") for n in names)
                assert {"model_optim_rng/data.pkl", "model_optim_rng/byteorder",
                        "model_optim_rng/version"} <= set(names)
                raw = (d / "model_optim_rng.pt").read_bytes()
                for info in z.infolist():
                    assert info.compress_type == zipfile.ZIP_STORED
                    local = raw[info.header_offset:info.header_offset + 30]
                    data = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + \
                        int.from_bytes(local[28:30], "little")
                    assert data % 64 == 0  # torch's record alignment


def test_megatron_to_megatron_and_hf(tmp_path):
    """A Megatron TP2 x PP2 run becomes a TP1 Megatron checkpoint and an HF folder in one command
    each; the HF export equals the one made from the same weights in our format."""
    params, opt = state(LLAMA_MODEL, 2, seed=15)
    src = tmp_path / "megatron"
    write_megatron_torch(src, LLAMA_MODEL, 2, 2, 1, params, opt, iteration=20, step=20, dist_opt=True)
    tp1 = tmp_path / "megatron_tp1"
    reshard(src, tp1, 1, 1, "--save-format", "megatron")
    assert (tp1 / "iter_0000020" / "mp_rank_00" / "distrib_optim.pt").exists()  # as the source ran
    run("convert_hf", "--to-hf", "--load", src, "--save", tmp_path / "hf_from_megatron")
    run("convert_hf", "--to-hf", "--load", tp1, "--save", tmp_path / "hf_from_tp1")
    ours = tmp_path / "ours"
    write_ours(ours, dict(LLAMA_MODEL, params_dtype="F32"), 2, 2, 1, params, opt, iteration=20, step=20)
    run("convert_hf", "--to-hf", "--load", ours, "--save", tmp_path / "hf_from_ours")
    want = read_hf_f32(tmp_path / "hf_from_ours")
    for folder in ("hf_from_megatron", "hf_from_tp1"):
        got = read_hf_f32(tmp_path / folder)
        assert set(got) == set(want)
        for name, array in want.items():
            # Ours holds F32 weights equal to the bf16 ones; the Megatron exports are BF16.
            np.testing.assert_array_equal(np.asarray(got[name], np.float32), array, err_msg=name)


def test_inspect_megatron(tmp_path):
    params, opt = state(GPT2_MODEL, 2, seed=16)
    src = tmp_path / "megatron"
    write_megatron_torch(src, GPT2_MODEL, 2, 2, 1, params, opt, iteration=20, step=20, dist_opt=True)
    out = run("inspect", "checkpoint", src).stdout
    assert "format: megatron torch" in out
    assert "layout: TP=2 PP=2 VPP=1" in out and "stage 1: layers [2, 4)" in out
    assert "optimizer: adam, step 20" in out
    assert '"use_distributed_optimizer": true' in out and '"lr": 0.0003' in out
    assert "mp_rank_01_001/distrib_optim.pt" in out
    assert "decoder.layers.3.mlp.linear_fc2.weight" in out
    dist = tmp_path / "dist"
    write_megatron_dist(dist, GPT2_MODEL, 2, 2, params, opt, iteration=20, step=20)
    out = run("inspect", "checkpoint", dist).stdout
    assert "format: megatron torch_dist" in out and "__3_0.distcp" in out


def test_format_flags(tmp_path):
    params, opt = state(GPT2_MODEL, 1, seed=17)
    meg = tmp_path / "megatron"
    write_megatron_torch(meg, GPT2_MODEL, 1, 1, 1, params, opt, iteration=20, step=20, dist_opt=False)
    ours = tmp_path / "ours"
    write_ours(ours, GPT2_MODEL, 1, 1, 1, params, opt, iteration=20, step=20)
    err = reshard(meg, tmp_path / "x", 1, 1, "--load-format", "leantron", ok=False).stderr
    assert "is a Megatron torch checkpoint" in err and "--load-format megatron" in err
    err = reshard(ours, tmp_path / "y", 1, 1, "--load-format", "megatron", ok=False).stderr
    assert "is a Leantron checkpoint, not a Megatron one" in err
    reshard(meg, tmp_path / "z", 1, 1, "--load-format", "megatron")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def evil_pickle(command):
    """pickle.dumps of an object whose __reduce__ calls os.system(command), protocol 2."""
    cmd = command.encode()
    return b"\x80\x02cos\nsystem\nX" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R."


def replace_record(path, record, data):
    """Rewrites a torch.save zip with one record's bytes replaced (Python's zipfile, stored)."""
    with zipfile.ZipFile(path) as z:
        items = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, blob in items:
            z.writestr(name, data if name.endswith(record) else blob)


def test_hostile_and_broken_checkpoints_are_refused(tmp_path):
    params, opt = state(GPT2_MODEL, 2, seed=18)
    src = tmp_path / "megatron"
    write_megatron_torch(src, GPT2_MODEL, 2, 1, 1, params, opt, iteration=20, step=20, dist_opt=False)
    model_file = src / "iter_0000020" / "mp_rank_01" / "model_optim_rng.pt"
    pristine = model_file.read_bytes()
    marker = tmp_path / "pwned"
    cases = [
        (evil_pickle(f"touch {marker}"), "os.system, which can run code"),
        (b"\x80\x02X\xff\xff\xff\x7fabc.", "runs past the end"),
        (b"\x80\x02" + b"]" * 200000 + b".", "malformed stack"),
        (b"\x80\x02}q\x00(X\x04\x00\x00\x00argsq\x01h\x00u.", "not an argparse.Namespace"),
    ]
    for blob, message in cases:
        model_file.write_bytes(pristine)
        replace_record(model_file, "data.pkl", blob)
        for cmd in (["reshard_checkpoint", "--load", src, "--save", tmp_path / "out", "--target-tp", 1,
                     "--target-pp", 1],
                    ["inspect", "checkpoint", src],
                    ["convert_hf", "--to-hf", "--load", src, "--save", tmp_path / "hf"]):
            proc = run(*cmd, ok=False)
            assert message in proc.stderr, (message, proc.stderr)
            assert "mp_rank_01/model_optim_rng.pt" in proc.stderr
            assert proc.stderr.count("\n") == 1  # one line
    assert not marker.exists()
    assert not (tmp_path / "out").exists() and not (tmp_path / "hf").exists()
    # A flipped byte in a tensor: the CRC check names the record.
    model_file.write_bytes(pristine)
    blob = bytearray(pristine)
    with zipfile.ZipFile(model_file) as z:
        info = z.getinfo("model_optim_rng/data/3")
    local = pristine[info.header_offset:info.header_offset + 30]
    start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
    blob[start + 1] ^= 0xFF
    model_file.write_bytes(bytes(blob))
    err = reshard(src, tmp_path / "out", 1, 1, ok=False).stderr
    assert "model_optim_rng/data/3' does not match its CRC-32" in err
    reshard(src, tmp_path / "out", 1, 1, "--no-verify-checkpoint")  # the check is the CRC's alone
    # A missing rank, a truncated file.
    model_file.write_bytes(pristine[: len(pristine) // 2])
    assert "end-of-central-directory" in reshard(src, tmp_path / "o2", 1, 1, ok=False).stderr
    model_file.unlink()
    assert "model_optim_rng.pt missing" in reshard(src, tmp_path / "o3", 1, 1, ok=False).stderr


def test_progress_on_a_terminal_only(tmp_path):
    params, opt = state(GPT2_MODEL, 1, seed=19)
    src = tmp_path / "megatron"
    write_megatron_torch(src, GPT2_MODEL, 1, 1, 1, params, opt, iteration=20, step=20, dist_opt=False)
    quiet = reshard(src, tmp_path / "a", 1, 1)
    assert quiet.stderr == "" and quiet.stdout == ""
    # Under a pseudo-terminal the tool draws its progress line on stderr.
    leader, follower = pty.openpty()
    proc = subprocess.Popen([tool("reshard_checkpoint"), "--load", str(src), "--save", str(tmp_path / "b"),
                             "--target-tp", "2", "--target-pp", "1"], stdout=subprocess.DEVNULL,
                            stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=60) == 0
    os.close(leader)
    text = seen.decode(errors="replace")
    n = len(params) * 4
    assert f"reshard_checkpoint: {n}/{n} tensors" in text, text
    assert " in all" in text


@pytest.mark.parametrize("layout", [["1", "1", "--no-use-distributed-optimizer"],
                                    ["2", "2", "--use-distributed-optimizer"]], ids=["tp1_adam", "tp2pp2_distopt"])
def test_train_resumes_from_a_megatron_checkpoint(tmp_path, layout):
    """train --load takes Megatron's format: a run saved at 4, converted to Megatron's torch format
    (in another layout), resumed to 8, logs the losses of a straight run bitwise."""
    from train_testlib import TINY, licence_dataset, parse_log, run_train
    (tmp_path / "data").mkdir()
    data = licence_dataset(tmp_path / "data" / "licences")
    common = TINY + ["--data-path", data, "--split", "90,10,0", "--micro-batch-size", "2",
                     "--global-batch-size", "8", "--train-iters", "8", "--lr", "2e-3", "--lr-warmup-iters", "2",
                     "--lr-decay-style", "linear", "--log-interval", "1", "--eval-interval", "100",
                     "--eval-iters", "1"]
    straight = run_train(common + ["--save", tmp_path / "a"])
    run_train(common + ["--save", tmp_path / "b", "--exit-interval", "4"])
    tp, pp, dist = layout
    reshard(tmp_path / "b", tmp_path / "megatron", tp, pp, "--save-format", "megatron", dist)
    rest = run_train(common + ["--load", tmp_path / "megatron", "--save", tmp_path / "c"])
    want, _ = parse_log(straight.stdout)
    got, _ = parse_log(rest.stdout)
    assert sorted(got) == [5, 6, 7, 8]
    for it, row in got.items():
        assert row == want[it], it


def test_llama31_rope_scaling_round_trips(tmp_path):
    """Megatron's --use-rope-scaling --rope-scaling-factor 32 (Llama 3.2's) becomes the model's
    llama3 rope scaling, HF's rope_scaling at export, and the same two arguments when written
    back in Megatron's format."""
    model = dict(LLAMA_BF16, rotary_base=500000)
    params, opt = state(model, 2, seed=21)
    src = tmp_path / "megatron"
    write_megatron_torch(src, model, 2, 1, 1, params, opt, iteration=20, step=20, dist_opt=False,
                         extra_args={"use_rope_scaling": True, "rope_scaling_factor": 32.0})
    ours = tmp_path / "ours"
    reshard(src, ours, 1, 1)
    meta, _ = read_ours_f32(ours)
    assert meta["model"]["rope_scaling"] == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    run("convert_hf", "--to-hf", "--load", src, "--save", tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["rope_scaling"]["rope_type"] == "llama3" and cfg["rope_scaling"]["factor"] == 32.0
    back = tmp_path / "back"
    reshard(ours, back, 2, 1, "--save-format", "megatron")
    args = torch_load(back / "iter_0000020" / "mp_rank_00" / "model_optim_rng.pt")["args"]
    assert args.use_rope_scaling is True and args.rope_scaling_factor == 32.0
    # Without the flag the scaling is off, and said so in the arguments.
    plain = tmp_path / "plain"
    params, opt = state(LLAMA_BF16, 1, seed=22)
    write_megatron_torch(plain, LLAMA_BF16, 1, 1, 1, params, opt, iteration=20, step=20, dist_opt=False)
    reshard(plain, tmp_path / "plain_back", 1, 1, "--save-format", "megatron")
    args = torch_load(tmp_path / "plain_back" / "iter_0000020" / "mp_rank_00" / "model_optim_rng.pt")["args"]
    assert args.use_rope_scaling is False
