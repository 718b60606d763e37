"""Exact resume (N straight = N/2, save, load, N/2: bitwise on the CPU for the same layout; to
float32 tolerance into another layout), SIGTERM saving and exiting cleanly, and clear errors for
bad settings and missing or corrupt data and checkpoints."""
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from ckpt_testlib import read_ours
from train_testlib import (TINY, TRAIN, checkpoint_files as files, licence_dataset, parse_log,
                           run_train)

ITERS = 12


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return licence_dataset(tmp_path_factory.mktemp("data") / "licences")


def common(data):
    return TINY + ["--data-path", data, "--split", "90,10,0", "--micro-batch-size", "2",
                   "--global-batch-size", "8", "--train-iters", ITERS, "--lr", "2e-3",
                   "--lr-warmup-iters", "2", "--lr-decay-style", "linear", "--log-interval", "1",
                   "--eval-interval", "4", "--eval-iters", "1"]


@pytest.mark.parametrize("nproc,extra", [(None, []), (2, ["--tensor-model-parallel-size", "2"]),
                                         (2, ["--use-distributed-optimizer"]),
                                         (2, ["--use-distributed-optimizer",
                                              "--data-parallel-sharding-strategy", "optim_grads",
                                              "--ddp-bucket-size", "10000"]),
                                         (2, ["--use-distributed-optimizer",
                                              "--data-parallel-sharding-strategy",
                                              "optim_grads_params", "--ddp-bucket-size", "10000"])],
                         ids=["one", "tp2", "dp2-optim", "dp2-optim-grads",
                              "dp2-optim-grads-params"])
def test_resume_is_bitwise_for_the_same_layout(dataset, tmp_path, nproc, extra):
    straight = run_train(common(dataset) + extra + ["--save", tmp_path / "a"], nproc=nproc)
    half = run_train(common(dataset) + extra + ["--save", tmp_path / "b", "--exit-interval",
                                                ITERS // 2], nproc=nproc)
    assert (tmp_path / "b" / "latest_checkpointed_iteration.txt").read_text().strip() == str(ITERS // 2)
    rest = run_train(common(dataset) + extra + ["--load", tmp_path / "b", "--save", tmp_path / "b"],
                     nproc=nproc)
    a_train, a_valid = parse_log(straight.stdout)
    b_train, b_valid = parse_log(half.stdout + rest.stdout)
    assert a_train == b_train  # every logged number, bitwise
    assert a_valid == b_valid
    assert files(tmp_path / "a", ITERS) == files(tmp_path / "b", ITERS)


def assert_resumed_second_half(straight, rest, straight_dir, rest_dir):
    """The resumed run logs the second half of the straight run's iterations with its losses, and
    saves the same final weights (within the float32 differences of another layout)."""
    a_train, _ = parse_log(straight.stdout)
    c_train, _ = parse_log(rest.stdout)
    assert sorted(c_train) == list(range(ITERS // 2 + 1, ITERS + 1))
    for it, row in c_train.items():
        assert row[1] == pytest.approx(a_train[it][1], rel=2e-5)
    _, want = read_ours(straight_dir)
    _, got = read_ours(rest_dir)
    for name, w in want[""].items():
        np.testing.assert_allclose(got[""][name], w, rtol=1e-3, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("strategy", ["optim_grads", "optim_grads_params"])
def test_sharded_checkpoint_resumes_without_sharding(dataset, tmp_path, strategy):
    """A checkpoint saved with the gradients (--data-parallel-sharding-strategy optim_grads) or
    the weights too (optim_grads_params) sharded over DP2 resumes on one process without
    sharding, and a plain one-process checkpoint resumes sharded over DP2: checkpoints do not
    depend on the strategy."""
    sharded = ["--use-distributed-optimizer", "--data-parallel-sharding-strategy", strategy,
               "--ddp-bucket-size", "10000"]
    straight = run_train(common(dataset) + sharded + ["--save", tmp_path / "a"], nproc=2)
    run_train(common(dataset) + sharded + ["--save", tmp_path / "b", "--exit-interval",
                                           ITERS // 2], nproc=2)
    rest = run_train(common(dataset) + ["--load", tmp_path / "b", "--save", tmp_path / "c"])
    assert_resumed_second_half(straight, rest, tmp_path / "a", tmp_path / "c")
    run_train(common(dataset) + ["--save", tmp_path / "d", "--exit-interval", ITERS // 2])
    rest = run_train(common(dataset) + sharded + ["--load", tmp_path / "d", "--save",
                                                  tmp_path / "e"], nproc=2)
    assert_resumed_second_half(straight, rest, tmp_path / "a", tmp_path / "e")


def test_resume_into_another_layout(dataset, tmp_path):
    straight = run_train(common(dataset) + ["--save", tmp_path / "a"])
    run_train(common(dataset) + ["--save", tmp_path / "b", "--exit-interval", ITERS // 2])
    rest = run_train(common(dataset) + ["--load", tmp_path / "b", "--save", tmp_path / "c",
                                        "--tensor-model-parallel-size", "2",
                                        "--pipeline-model-parallel-size", "2"], nproc=4)
    assert_resumed_second_half(straight, rest, tmp_path / "a", tmp_path / "c")


def test_resume_uneven_pipeline_checkpoint_under_pp1(dataset, tmp_path):
    """Saved with --decoder-first-pipeline-num-layers 3 under PP 2 (3 + 1 layers), resumed by a
    single process: the same numbers as a straight single-process run."""
    uneven = ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "3"]
    straight = run_train(common(dataset) + ["--save", tmp_path / "a"])
    run_train(common(dataset) + uneven + ["--save", tmp_path / "b", "--exit-interval", ITERS // 2],
              nproc=2)
    meta, _ = read_ours(tmp_path / "b")
    assert meta["parallel"]["decoder_first_pipeline_num_layers"] == 3
    assert "decoder_last_pipeline_num_layers" not in meta["parallel"]
    assert meta["args"]["decoder_first_pipeline_num_layers"] == 3
    assert meta["args"]["decoder_last_pipeline_num_layers"] is None
    assert [s["layers"] for s in meta["layout"]["stages"]] == [[[0, 3]], [[3, 4]]]
    rest = run_train(common(dataset) + ["--load", tmp_path / "b", "--save", tmp_path / "c"])
    assert_resumed_second_half(straight, rest, tmp_path / "a", tmp_path / "c")


def test_sigterm_saves_and_exits(dataset, tmp_path):
    args = [str(TRAIN), *map(str, common(dataset)), "--train-iters", "100000",
            "--lr-decay-iters", "100", "--save", str(tmp_path / "ck"), "--nproc-per-node", "2",
            "--tensor-model-parallel-size", "2"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = ""
    while "iteration        3/" not in line:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "exiting on signal" in out
    it = int((tmp_path / "ck" / "latest_checkpointed_iteration.txt").read_text())
    assert it >= 3
    assert (tmp_path / "ck" / f"iter_{it:07d}" / "mp_rank_01" / "optimizer.safetensors").exists()


def one_line_error(proc, text):
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert any(text in line for line in lines), proc.stderr
    return lines


@pytest.mark.parametrize("extra,nproc,text", [
    (["--tensor-model-parallel-size", "3"], 3, "--num-attention-heads 4 is not divisible by TP 3"),
    (["--pipeline-model-parallel-size", "3"], 3, "--num-layers 4 is not divisible by PP 3"),
    (["--pipeline-model-parallel-size", "3", "--decoder-last-pipeline-num-layers", "1"], 3,
     "--num-layers 4 minus --decoder-last-pipeline-num-layers 1 leaves 3 layers, which do not split "
     "evenly over the other 2 pipeline stages of PP 3"),
    (["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "3",
      "--decoder-last-pipeline-num-layers", "2"], 2,
     "--decoder-first-pipeline-num-layers 3 and --decoder-last-pipeline-num-layers 2 must add up to "
     "--num-layers 4 with PP 2"),
    (["--decoder-first-pipeline-num-layers", "2"], None,
     "--decoder-first-pipeline-num-layers 2 needs PP > 1"),
    (["--pipeline-model-parallel-size", "2", "--decoder-last-pipeline-num-layers", "0"], 2,
     "--decoder-last-pipeline-num-layers must be at least 1, not 0"),
    (["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
      "--decoder-first-pipeline-num-layers", "2"], 2,
     "--decoder-first-pipeline-num-layers 2 does not work with --num-layers-per-virtual-pipeline-stage"),
    (["--micro-batch-size", "3"], None, "--global-batch-size 8 is not divisible by micro-batch 3"),
    (["--global-batch-size", "6"], 2, "--global-batch-size 6 is not divisible by micro-batch 2 x DP 2"),
    (["--sequence-parallel", "--tensor-model-parallel-size", "2", "--seq-length", "31"], 2,
     "--sequence-parallel needs --seq-length 31 divisible by TP 2"),
    (["--fp16"], None, "--fp16 is not implemented (loss scaling); use --bf16"),
    (["--grad-reduce-in-bf16"], 2, "--grad-reduce-in-bf16 needs --bf16"),
])
def test_bad_settings_are_refused_up_front(dataset, tmp_path, extra, nproc, text):
    proc = run_train(common(dataset) + extra, nproc=nproc, ok=False)
    assert proc.returncode == 2
    lines = one_line_error(proc, text)
    assert len(lines) == 1


def test_missing_data_and_checkpoints(dataset, tmp_path):
    args = [a for a in common(dataset)]
    args[args.index(dataset)] = str(tmp_path / "nothing")
    one_line_error(run_train(args, ok=False), "nothing")
    one_line_error(run_train(common(dataset) + ["--load", tmp_path / "none"], ok=False), "none")
    # Token ids beyond the vocabulary are refused, not trained on.
    bad = TINY[:]
    bad[bad.index("255")] = "100"
    one_line_error(run_train(bad + common(dataset)[len(TINY):], ok=False), "outside the vocabulary")


def test_corrupt_checkpoint_is_refused(dataset, tmp_path):
    run_train(common(dataset) + ["--save", tmp_path / "ck", "--exit-interval", "2"])
    shard = tmp_path / "ck" / "iter_0000002" / "mp_rank_00" / "model.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    proc = run_train(common(dataset) + ["--load", tmp_path / "ck"], nproc=2, ok=False)
    one_line_error(proc, "model.safetensors")


def test_finetune_and_no_load_optim(dataset, tmp_path):
    run_train(common(dataset) + ["--save", tmp_path / "ck", "--exit-interval", "4"])
    # --no-load-optim: weights and position, fresh Adam state (so a different step 5).
    keep = parse_log(run_train(common(dataset) + ["--load", tmp_path / "ck"]).stdout)[0]
    fresh = parse_log(run_train(common(dataset) + ["--load", tmp_path / "ck",
                                                   "--no-load-optim"]).stdout)[0]
    assert sorted(fresh) == list(range(5, ITERS + 1))
    assert fresh[5][1] == keep[5][1]  # same weights, same samples: same loss before the step
    assert fresh[6][1] != keep[6][1]
    # --finetune: weights only; iteration, samples and schedule start again.
    tuned = parse_log(run_train(common(dataset) + ["--load", tmp_path / "ck", "--finetune"]).stdout)[0]
    scratch = parse_log(run_train(common(dataset)).stdout)[0]
    assert sorted(tuned) == list(range(1, ITERS + 1))
    assert tuned[1][1] < scratch[1][1]
    # A checkpoint of another activation is refused.
    proc = run_train(common(dataset) + ["--load", tmp_path / "ck", "--openai-gelu"], ok=False)
    one_line_error(proc, "gelu_tanh")


def test_blended_data_path(dataset, tmp_path):
    """--data-path W1 P1 W2 P2: libdata's blending; the run trains and its loss falls."""
    args = common(dataset)
    i = args.index("--data-path")
    args[i + 1:i + 2] = ["0.3", dataset, "0.7", licence_dataset(tmp_path / "second")]
    train, valid = parse_log(run_train(args).stdout)
    assert sorted(train) == list(range(1, ITERS + 1)) and sorted(valid) == [4, 8, 12]
    assert train[ITERS][1] < train[1][1]


@pytest.mark.parametrize("nproc,extra", [
    (None, ["--recompute-granularity", "selective"]),
    (None, ["--recompute-granularity", "full", "--recompute-method", "uniform",
            "--recompute-num-layers", "1"]),
    (None, ["--recompute-granularity", "full", "--recompute-method", "block",
            "--recompute-num-layers", "2"]),
    (2, ["--recompute-granularity", "full", "--recompute-method", "uniform",
         "--recompute-num-layers", "1", "--tensor-model-parallel-size", "2", "--sequence-parallel"]),
])
def test_activation_recomputation_changes_no_number(dataset, tmp_path, nproc, extra):
    """Recomputed activations (dropout included) are bitwise the stored ones: the same losses and
    the same final weights, byte for byte; and the recomputation happened, as often as the
    settings ask (each rank reports what its backward redid)."""
    base = [] if nproc is None else ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
    plain = run_train(common(dataset) + base + ["--save", tmp_path / "plain"], nproc=nproc)
    redo = run_train(common(dataset) + extra + ["--save", tmp_path / "redo"], nproc=nproc)
    assert parse_log(redo.stdout) == parse_log(plain.stdout)
    assert files(tmp_path / "redo", ITERS) == files(tmp_path / "plain", ITERS)
    assert "recomputed" not in plain.stdout
    # Per rank: 4 layers, ITERS steps of 4 micro-batches (global batch 8, micro-batch 2, DP 1).
    backwards = ITERS * 4
    layers = 2 if "block" in extra else 0 if "selective" in extra else 4
    softmaxes = 4 if "selective" in extra else 0
    reports = re.findall(r"\[Rank (\d+)\] layers \[0, 4\): recomputed (\d+) layer forwards and "
                         r"(\d+) attention softmaxes", redo.stdout)
    assert sorted(int(r) for r, _, _ in reports) == list(range(nproc or 1)), redo.stdout
    for _, got_layers, got_softmaxes in reports:
        assert (int(got_layers), int(got_softmaxes)) == (layers * backwards, softmaxes * backwards)