"""Device-machine tests of --optimizer-cpu-offload (scripts/device_check.sh runs them; CI has no
GPU): the fp32 weights and Adam moments in host memory and AdamW on the host threads give the GPU
optimizer's run bit for bit (core/adamw.h is one update for both), resume from and into its
checkpoints, and the memory the GPU no longer holds is what the report says."""
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))
from test_gpu_train import LLAMA, common  # noqa: E402
from train_testlib import (checkpoint_files as files, licence_dataset, parse_log,  # noqa: E402
                           run_train)

OFFLOAD = ["--optimizer-cpu-offload"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return licence_dataset(tmp_path_factory.mktemp("data") / "licences")


FP8 = ["--fp8-format", "hybrid", "--fp8-recipe", "delayed"]


def every(args, flag, value):
    """`args` with `flag`'s value replaced."""
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


HALF = ["--optimizer-offload-fraction", "0.5"]


@pytest.mark.parametrize("arch,fraction", [([], []), (LLAMA, []), (FP8, []), ([], HALF),
                                           (LLAMA, HALF)],
                         ids=["gpt2", "llama", "fp8", "gpt2-half", "llama-half"])
def test_offloaded_step_is_bitwise_the_gpu_one(dataset, tmp_path, arch, fraction):
    """Every logged number and every saved tensor (weights and moments) equal to the GPU
    optimizer's, with dropout, clipping and weight decay on. The host steps beside the next
    forward, which waits layer by layer; evaluations (forwards between two steps) and two
    micro-batches a step go through the same waits. FP8 layers cast the uploaded weights. With
    half the parameters offloaded the GPU steps the first layers while the host steps the rest."""
    args = every(common(dataset, 12), "--eval-interval", 4) + [
        "--bf16", "--deterministic-mode", "--hidden-dropout", "0.1", "--weight-decay", "0.1",
        "--clip-grad", "0.5"] + arch
    gpu = run_train(args + ["--save", tmp_path / "gpu"])
    host = run_train(args + OFFLOAD + fraction + ["--save", tmp_path / "host"])
    g, h = parse_log(gpu.stdout), parse_log(host.stdout)
    assert sorted(h[0]) == list(range(1, 13))
    assert sorted(h[1]) == [4, 8, 12]
    assert h == g
    assert files(tmp_path / "gpu", 12) == files(tmp_path / "host", 12)
    assert re.search(r"optimizer on the host \(\d+ threads\).*beside the next forward, whose "
                     r"issuing waited [\d.]+ ms for it", host.stdout), host.stdout[-2000:]


@pytest.mark.parametrize("fraction", [[], HALF], ids=["whole", "half"])
def test_offload_resumes_gpu_checkpoints_and_back(dataset, tmp_path, fraction):
    """GPU optimizer to 10, offloaded from 10 to 15, GPU again to 20: the straight run's numbers
    and final checkpoint, bit for bit (with half offloaded, the moments and weights load into
    and save from both places)."""
    args = common(dataset, 20) + ["--bf16", "--deterministic-mode", "--hidden-dropout", "0.1"]
    straight = parse_log(run_train(args + ["--save", tmp_path / "a"]).stdout)[0]
    run_train(args + ["--save", tmp_path / "b", "--exit-interval", "10"])
    mid = parse_log(run_train(args + OFFLOAD + fraction + [
        "--load", tmp_path / "b", "--save", tmp_path / "b", "--exit-interval", "15"]).stdout)[0]
    end = parse_log(run_train(args + ["--load", tmp_path / "b", "--save", tmp_path / "b"]).stdout)[0]
    for it in range(11, 16):
        assert mid[it] == straight[it]
    for it in range(16, 21):
        assert end[it] == straight[it]
    assert files(tmp_path / "a", 20) == files(tmp_path / "b", 20)


MEMORY = re.compile(r"GPU in use: (\d+) \| of which (parameters|fp32 norms and embeddings) (\d+), "
                    r"gradients (\d+), Adam state (\d+),")
HOST = re.compile(r"host \(--optimizer-cpu-offload\): fp32 weights (\d+), Adam state (\d+) \|")


def test_offload_frees_what_the_report_says(dataset):
    """A wider model (about 13M parameters, 12 bytes each leave the GPU): the drop in the GPU
    memory in use between the two runs is the drop in what the memory line reports, within 5%."""
    wide = common(dataset, 2) + ["--bf16", "--hidden-size", "512", "--num-attention-heads", "8"]
    plain, host = run_train(wide).stdout, run_train(wide + OFFLOAD).stdout
    p, h = MEMORY.search(plain), MEMORY.search(host)
    assert p and h, (plain[-2000:], host[-2000:])
    assert p[2] == "parameters" and h[2] == "fp32 norms and embeddings"
    assert h[4] == p[4]  # gradients stay on the GPU
    assert int(h[5]) == 0
    on_host = HOST.search(host)
    assert on_host and on_host[1] == p[3] and on_host[2] == p[5], host[-2000:]
    reported = (int(p[3]) - int(h[3])) + int(p[5])
    measured = int(p[1]) - int(h[1])
    print("GPU MB in use: plain", p[1], "offloaded", h[1], "; reported drop", reported)
    assert reported > 100
    assert abs(measured - reported) <= 0.05 * reported
