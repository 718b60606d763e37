"""Parallel equivalence (data, tensor, sequence, pipeline 1F1B, interleaved and uneven, distributed
optimizer, sharded gradients), as real separate processes over Gloo: training losses, validation losses
and final weights of (TP, PP, DP) = (1, 1, 1) equal those of every implemented layout to float32
tolerance, over 20 iterations with gradient accumulation and dropout on, on a real small dataset."""
import re

import numpy as np
import pytest

from ckpt_testlib import read_ours
from train_testlib import TINY, licence_dataset, parse_log, run_train

ITERS = 20


def common(data, save):
    return TINY + ["--data-path", data, "--split", "90,10,0", "--micro-batch-size", "2",
                   "--global-batch-size", "8", "--train-iters", ITERS, "--lr", "2e-3",
                   "--lr-warmup-iters", "3", "--lr-decay-style", "cosine", "--min-lr", "1e-4",
                   "--log-interval", "1", "--eval-interval", "10", "--eval-iters", "2",
                   "--save", save]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return licence_dataset(tmp_path_factory.mktemp("data") / "licences")


@pytest.fixture(scope="module")
def baseline(dataset, tmp_path_factory):
    save = tmp_path_factory.mktemp("base") / "ck"
    proc = run_train(common(dataset, save))
    train, valid = parse_log(proc.stdout)
    assert sorted(train) == list(range(1, ITERS + 1))
    assert sorted(valid) == [10, 20]
    assert train[ITERS][1] < train[1][1]
    return train, valid, read_ours(save)[1]


LAYOUTS = {
    "dp2": (2, []),
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "tp2_sp": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "dp2_distopt": (2, ["--use-distributed-optimizer"]),
    "pp2_interleaved": (2, ["--pipeline-model-parallel-size", "2",
                            "--num-layers-per-virtual-pipeline-stage", "1"]),
    "pp4": (4, ["--pipeline-model-parallel-size", "4"]),
    # Megatron-Core's uneven split of the 4 layers: 3 + 1, and 1 + 2 + 1.
    "pp2_uneven": (2, ["--pipeline-model-parallel-size", "2",
                       "--decoder-last-pipeline-num-layers", "1"]),
    "pp3_uneven": (3, ["--pipeline-model-parallel-size", "3",
                       "--decoder-first-pipeline-num-layers", "1",
                       "--decoder-last-pipeline-num-layers", "1"]),
    "dp2_pp2_interleaved": (4, ["--pipeline-model-parallel-size", "2",
                                "--num-layers-per-virtual-pipeline-stage", "1"]),
    "tp2_pp2_sp": (4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                       "--sequence-parallel"]),
    "tp2_pp2_dp2_distopt": (8, ["--tensor-model-parallel-size", "2",
                                "--pipeline-model-parallel-size", "2", "--sequence-parallel",
                                "--use-distributed-optimizer"]),
}


def sharded(strategy, bucket_size=20000):
    """The distributed optimizer with --data-parallel-sharding-strategy `strategy`."""
    return ["--use-distributed-optimizer", "--data-parallel-sharding-strategy", strategy,
            "--ddp-bucket-size", str(bucket_size)]


# ZeRO-2: the gradients sharded too, in buckets of layers [3, 2], [1] and [0] taking turns in two
# slots (a chunk of one layer, interleaved: one slot), with the tied embedding summed over the
# stages and SP's norms over TP. ZeRO-3: the weights the model computes with sharded too, each
# layer bucket gathered into its slot before the forward and the backward use it.
ZERO2, ZERO3 = sharded("optim_grads"), sharded("optim_grads_params")
for name, flags in (("zero2", ZERO2), ("zero3", ZERO3)):
    LAYOUTS[f"dp2_{name}"] = (2, flags)
    LAYOUTS[f"dp2_pp2_interleaved_{name}"] = (4, LAYOUTS["dp2_pp2_interleaved"][1] + flags)
    LAYOUTS[f"tp2_pp2_dp2_sp_{name}"] = (8, ["--tensor-model-parallel-size", "2",
                                             "--pipeline-model-parallel-size", "2",
                                             "--sequence-parallel"] + flags)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_single_process(layout, dataset, baseline, tmp_path):
    nproc, extra = LAYOUTS[layout]
    save = tmp_path / "ck"
    proc = run_train(common(dataset, save) + extra, nproc=nproc)
    train, valid = parse_log(proc.stdout)
    base_train, base_valid, base_weights = baseline
    assert sorted(train) == sorted(base_train)
    for it, (lr, loss, norm, skipped) in base_train.items():
        assert train[it][0] == lr
        assert train[it][1] == pytest.approx(loss, rel=2e-5), f"iteration {it}"
        assert train[it][2] == pytest.approx(norm, rel=1e-3, abs=2e-3), f"grad norm {it}"
    for it, loss in base_valid.items():
        assert valid[it] == pytest.approx(loss, rel=2e-5)
    meta, weights = read_ours(save)
    if "--decoder-last-pipeline-num-layers" in extra or "--decoder-first-pipeline-num-layers" in extra:
        # Each rank holds the layers of the uneven split, and the checkpoint says so.
        stages = {"pp2_uneven": ["[0, 3) +embedding", "[3, 4) +output"],
                  "pp3_uneven": ["[0, 1) +embedding", "[1, 3)", "[3, 4) +output"]}[layout]
        for rank, layers in enumerate(stages):
            assert f"[Rank {rank}] tp 0 pp {rank} dp 0 | layers {layers} |" in proc.stdout
        first = meta["parallel"].get("decoder_first_pipeline_num_layers")
        last = meta["parallel"].get("decoder_last_pipeline_num_layers")
        assert (first, last) == {"pp2_uneven": (None, 1), "pp3_uneven": (1, 1)}[layout]
    for kind in ("", "main_param.", "exp_avg.", "exp_avg_sq."):
        tied = weights[kind].pop("output_layer.weight", None)
        if tied is not None:  # PP > 1: the last stage's copy of the tied embedding stays equal
            np.testing.assert_array_equal(tied, weights[kind]["embedding.word_embeddings.weight"])
        assert base_weights[kind].keys() == weights[kind].keys()
        for name, want in base_weights[kind].items():
            np.testing.assert_allclose(weights[kind][name], want, rtol=1e-3, atol=2e-5,
                                       err_msg=f"{kind}{name}")


@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("strategy", ["optim_grads", "optim_grads_params"])
def test_sharded_gradients_match_plain_data_parallel(strategy, micro_batches, dataset, tmp_path):
    """DP2 with --data-parallel-sharding-strategy optim_grads (every micro-batch's layer buckets
    summed as the backward finishes them) and optim_grads_params (the weights too, gathered per
    layer bucket before use) against plain DP2: with one micro-batch per step the same sums, so
    the same losses and the same checkpoint bytes; with two, the same sums in another order,
    losses within 1e-5. The report names what the sharded gradients and weights hold."""
    gbs = ["--global-batch-size", str(4 * micro_batches)]
    sharded = {"optim_grads": ZERO2, "optim_grads_params": ZERO3}[strategy]
    runs = {}
    for name, extra in {"plain": [], "sharded": sharded}.items():
        save = tmp_path / name
        proc = run_train(common(dataset, save) + gbs + extra, nproc=2)
        runs[name] = (parse_log(proc.stdout), save, proc.stdout)
    (plain_train, plain_valid), plain_save, _ = runs["plain"]
    (train, valid), save, out = runs["sharded"]
    assert "gradients" in out and "(sharded: layer buckets taking turns in slots, their parts' sums" in out
    if strategy == "optim_grads_params":
        assert "fp32 weights" in out and "(sharded: layer buckets taking turns in slots, their parts," in out
        assert "+distributed optimizer, sharded gradients and weights" in out
    assert sorted(train) == sorted(plain_train)
    for it, row in plain_train.items():
        if micro_batches == 1:
            assert train[it][1] == row[1], f"iteration {it}"
        else:
            assert train[it][1] == pytest.approx(row[1], rel=1e-5), f"iteration {it}"
    for it, loss in plain_valid.items():
        assert valid[it] == pytest.approx(loss, rel=0 if micro_batches == 1 else 1e-5)
    if micro_batches == 1:
        shards = sorted(p.relative_to(plain_save) for p in plain_save.rglob("*.safetensors"))
        assert shards
        assert shards == sorted(p.relative_to(save) for p in save.rglob("*.safetensors"))
        for rel in shards:
            assert (save / rel).read_bytes() == (plain_save / rel).read_bytes(), rel


def test_sharded_weights_take_turns_in_a_deep_pipeline(dataset, tmp_path):
    """ZeRO-3 where each pipeline stage has four one-layer buckets taking turns in two slots, under
    1F1B with four micro-batches (a stage's forwards and backwards of different micro-batches
    interleave, so a slot's bucket is gathered again whenever the schedule returns to it): the
    same losses and weights as plain PP2 x DP2, to the order of the sums."""
    deep = ["--num-layers", "8", "--pipeline-model-parallel-size", "2",
            "--global-batch-size", "16"]
    runs = {}
    one_layer_buckets = sharded("optim_grads_params", bucket_size=1000)
    for name, extra in {"plain": [], "zero3": one_layer_buckets}.items():
        save = tmp_path / name
        proc = run_train(common(dataset, save) + deep + extra, nproc=4)
        runs[name] = (parse_log(proc.stdout), read_ours(save)[1], proc.stdout)
    (plain_train, plain_valid), plain_weights, _ = runs["plain"]
    (train, valid), weights, out = runs["zero3"]
    # Every rank: its stage's 4 layers in 4 buckets and 2 slots, each bucket gathered again as the
    # schedule comes back to it (more than twice per bucket per step).
    for rank in range(4):
        m = re.search(rf"\[Rank {rank}\] sharded weights \(optim_grads_params\): 4 layer buckets' "
                      r"fp32 weights gathered into 2 slots before use, ([\d.]+) gathers per step",
                      out)
        assert m, out[-3000:]
        assert float(m[1]) > 8
    assert sorted(train) == sorted(plain_train)
    for it, row in plain_train.items():
        assert train[it][1] == pytest.approx(row[1], rel=1e-5), f"iteration {it}"
    for it, loss in plain_valid.items():
        assert valid[it] == pytest.approx(loss, rel=1e-5)
    for kind in ("", "main_param.", "exp_avg.", "exp_avg_sq."):
        for name, want in plain_weights[kind].items():
            np.testing.assert_allclose(weights[kind][name], want, rtol=1e-4, atol=1e-6,
                                       err_msg=f"{kind}{name}")


@pytest.mark.parametrize("style", ["torchrun", "slurm"])
def test_cluster_launchers_rendezvous_over_tcp(style, dataset, baseline, tmp_path):
    """The same binary started once per rank by a launcher (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
    or SLURM_*), meeting through rank 0's TCP store; rank 1 starts first."""
    import os
    import socket
    import subprocess

    from train_testlib import TRAIN
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (1, 0):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.pop("LEANTRON_RENDEZVOUS_DIR", None)
        if style == "torchrun":
            env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
        else:
            env.update(SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank))
        args = common(dataset, tmp_path / "ck") + ["--tensor-model-parallel-size", "2"]
        procs.append(subprocess.Popen([str(TRAIN), *map(str, args)], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    train, _ = parse_log(outs[0][0] + outs[1][0])
    for it, row in baseline[0].items():
        assert train[it][1] == pytest.approx(row[1], rel=2e-5)


LLAMA = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
         "--group-query-attention", "--num-query-groups", "2",
         "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--ffn-hidden-size", "48"]


@pytest.fixture(scope="module")
def llama_baseline(dataset, tmp_path_factory):
    save = tmp_path_factory.mktemp("llama") / "ck"
    train, valid = parse_log(run_train(common(dataset, save) + LLAMA).stdout)
    assert train[ITERS][1] < train[1][1]
    return train, valid, read_ours(save)[1]


@pytest.mark.parametrize("layout", ["tp2_sp", "pp2_interleaved", "pp2_uneven", "tp2_pp2_dp2_distopt"])
def test_llama_style_layout_matches_single_process(layout, dataset, llama_baseline, tmp_path):
    """RMSNorm, SwiGLU ([gate; up] TP shards), RoPE, grouped-query attention (whole groups per TP
    rank), untied output layer, no biases: the same equivalence."""
    nproc, extra = LAYOUTS[layout]
    save = tmp_path / "ck"
    train, valid = parse_log(run_train(common(dataset, save) + LLAMA + extra, nproc=nproc).stdout)
    base_train, base_valid, base_weights = llama_baseline
    for it, row in base_train.items():
        assert train[it][1] == pytest.approx(row[1], rel=2e-5), f"iteration {it}"
    for it, loss in base_valid.items():
        assert valid[it] == pytest.approx(loss, rel=2e-5)
    _, weights = read_ours(save)
    for name, want in base_weights[""].items():
        np.testing.assert_allclose(weights[""][name], want, rtol=1e-3, atol=2e-5, err_msg=name)
