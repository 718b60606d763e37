"""What `train` does when things go wrong: non-finite flags and checkpoints of another model are
refused, the rendezvous store serves only its job on MASTER_ADDR, a rank stops at once when
signalled at the rendezvous, ranks die with their launcher, and the death of a rank is reported by
the launcher (which rank, which signal) and by its peers (one line, no abort)."""
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from failure_testlib import snapshot
from train_testlib import TINY, TRAIN, licence_dataset, run_train


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return licence_dataset(tmp_path_factory.mktemp("data") / "licences")


def common(data, iters=4):
    return TINY + ["--data-path", data, "--split", "90,10,0", "--micro-batch-size", "2",
                   "--global-batch-size", "4", "--train-iters", iters, "--lr", "1e-3",
                   "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1"]


def mock(iters=4):
    return TINY + ["--mock-data", "--micro-batch-size", "2", "--global-batch-size", "4",
                   "--train-iters", iters, "--lr", "1e-3", "--log-interval", "1"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_line(proc, text, limit=120):
    """Reads `proc`'s stdout (in a thread, so the bound holds) until a line holds `text`."""
    found = threading.Event()

    def read():
        for line in proc.stdout:
            if text in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(limit), f"gave up waiting for {text!r}"


def wait_for(predicate, what, limit=120):
    """Polls until `predicate()` holds; a liveness bound, not a timing assertion."""
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


# ------------------------------------------------------------------------------- S3
@pytest.mark.parametrize("flag,value", [("--lr", "nan"), ("--lr", "inf"), ("--clip-grad", "nan"),
                                        ("--weight-decay", "inf"), ("--min-lr", "nan"),
                                        ("--adam-eps", "nan"), ("--hidden-dropout", "nan"),
                                        ("--init-method-std", "-inf"), ("--adam-beta2", "1")])
def test_non_finite_or_impossible_float_flags_are_refused(tmp_path, flag, value):
    proc = run_train(mock() + [flag, value, "--save", tmp_path / "ck"], ok=False)
    assert proc.returncode == 2, proc.stderr
    assert flag in proc.stderr, proc.stderr
    assert not (tmp_path / "ck").exists()


# ------------------------------------------------------------------------------- S4, S5
ROPE = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
        "--disable-bias-linear", "--untie-embeddings-and-output-weights"]


@pytest.mark.parametrize("saved,loaded,message", [
    ([], ["--norm-epsilon", "1e-6"], "norm_epsilon"),
    (ROPE, ROPE + ["--rotary-base", "500000"], "rotary_base"),
])
def test_load_refuses_a_checkpoint_of_another_function(tmp_path, saved, loaded, message):
    run_train(mock() + saved + ["--save", tmp_path / "ck"])
    proc = run_train(mock(8) + loaded + ["--load", tmp_path / "ck"], ok=False)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr


def test_load_refuses_a_rope_scaling_it_would_not_apply(tmp_path):
    run_train(mock() + ROPE + ["--save", tmp_path / "ck"])
    meta_path = tmp_path / "ck" / "iter_0000004" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["model"]["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    meta_path.write_text(json.dumps(meta))
    proc = run_train(mock(8) + ROPE + ["--load", tmp_path / "ck"], ok=False)
    assert proc.returncode == 1 and "rope_scaling" in proc.stderr, proc.stderr


def test_load_verifies_the_contents_unless_told_not_to(tmp_path):
    run_train(mock() + ["--save", tmp_path / "ck"])
    path = tmp_path / "ck" / "iter_0000004" / "mp_rank_00" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10  # inside the last tensor's bytes
    path.write_bytes(bytes(data))
    proc = run_train(mock(8) + ["--load", tmp_path / "ck"], ok=False)
    assert proc.returncode == 1 and "checksum" in proc.stderr and str(path) in proc.stderr
    run_train(mock(8) + ["--load", tmp_path / "ck", "--no-verify-checkpoint", "--no-load-optim"])


def test_an_empty_dataset_says_so(tmp_path):
    from megatron_data_ref import NumpyIndexedDatasetBuilder
    import numpy as np
    NumpyIndexedDatasetBuilder(str(tmp_path / "empty"), np.uint16).finalize()
    proc = run_train(common(tmp_path / "empty"), ok=False)
    assert proc.returncode == 1 and "the dataset is empty" in proc.stderr, proc.stderr
    assert "leaves no training data" not in proc.stderr


def test_a_sample_index_too_large_for_memory_is_a_clean_error(dataset):
    proc = run_train(common(dataset, iters=10**12), ok=False)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "more than this machine's" in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------- H2, H3
def cluster_rank(rank, port, args, token=None):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
               WORLD_SIZE="2", LOCAL_RANK=str(rank))
    env.pop("LEANTRON_RENDEZVOUS_DIR", None)
    env.pop("LEANTRON_JOB_TOKEN", None)
    if token:
        env["LEANTRON_JOB_TOKEN"] = token
    return subprocess.Popen([str(TRAIN), *map(str, args)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def listening(port, address="127.0.0.1"):
    with socket.socket() as s:
        s.settimeout(5)
        return s.connect_ex((address, port)) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_rank_waiting_at_the_rendezvous_stops_on_a_signal(tmp_path, sig):
    port = free_port()
    rank0 = cluster_rank(0, port, mock() + ["--tensor-model-parallel-size", "2"])
    try:
        wait_for(lambda: listening(port), "rank 0's store")
        # It listens on MASTER_ADDR only: another loopback address of this host does not answer.
        assert not listening(port, "127.0.0.2")
        rank0.send_signal(sig)
        out, err = rank0.communicate(timeout=60)
    finally:
        rank0.kill()
    assert rank0.returncode == -sig, (rank0.returncode, err)
    assert "rank 0: stopped by a signal while waiting for the other ranks" in err, err


def test_a_rank_of_another_job_cannot_join(tmp_path):
    port = free_port()
    args = mock() + ["--tensor-model-parallel-size", "2"]
    rank0 = cluster_rank(0, port, args, token="job-a")
    stranger = cluster_rank(1, port, args, token="job-b")
    try:
        out, err = stranger.communicate(timeout=120)
        assert stranger.returncode == 1 and "another job" in err, err
    finally:
        rank0.kill()
        stranger.kill()
        rank0.communicate()


# ------------------------------------------------------------------------------- H4, U1, H5
def children(pid):
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def gone(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # reaped later by whoever inherited it


def launch(args, tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir(exist_ok=True)
    for name in ("RANK", "WORLD_SIZE", "LEANTRON_RENDEZVOUS_DIR"):
        env.pop(name, None)
    return subprocess.Popen([str(TRAIN), *map(str, args), "--nproc-per-node", "2"], env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_ranks_die_with_their_launcher_and_leave_no_rendezvous_folder(dataset, tmp_path):
    launcher = launch(common(dataset, iters=100000) + ["--tensor-model-parallel-size", "2",
                                                       "--save", tmp_path / "ck",
                                                       "--save-interval", "100000"], tmp_path)
    ranks = []
    try:
        wait_for_line(launcher, "iteration        1/")
        ranks = children(launcher.pid)
        assert len(ranks) == 2
        launcher.kill()
        launcher.wait()
        wait_for(lambda: all(gone(r) for r in ranks), "the ranks to die with their launcher")
    finally:
        launcher.kill()
        for r in ranks:
            if not gone(r):
                os.kill(r, signal.SIGKILL)
    assert snapshot(tmp_path / "tmp") == {} and list((tmp_path / "tmp").iterdir()) == []
    assert not (tmp_path / "ck").exists()  # they did not train on and save


def test_the_launcher_names_the_rank_that_died_and_how(dataset, tmp_path):
    launcher = launch(common(dataset, iters=100000) + ["--tensor-model-parallel-size", "2"],
                      tmp_path)
    try:
        wait_for_line(launcher, "iteration        1/")
        ranks = children(launcher.pid)
        os.kill(ranks[1], signal.SIGKILL)
        _, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + 9
    assert f"train: rank 1 (pid {ranks[1]}) was killed by signal 9 (SIGKILL); stopping the other " \
           "ranks" in err, err


def test_the_survivor_of_a_killed_rank_exits_with_one_line(dataset, tmp_path):
    port = free_port()
    args = common(dataset, iters=100000) + ["--tensor-model-parallel-size", "2"]
    rank0 = cluster_rank(0, port, args)
    rank1 = cluster_rank(1, port, args)
    try:
        wait_for_line(rank1, "iteration        1/")  # the last rank logs
        rank1.kill()
        rank1.wait()
        _, err = rank0.communicate(timeout=300)
    finally:
        rank0.kill()
        rank1.kill()
    assert rank0.returncode == 1, (rank0.returncode, err[-3000:])
    assert "error (rank 0): " in err and "another rank died" in err, err[-3000:]
    assert "terminate called" not in err and "IoException" not in err.split("error (rank 0)")[0]
