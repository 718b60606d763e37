"""bench/gpu/tutorial_tables.py --dry-run: the `train` commands it builds for the Megatron
tutorial's rows carry the configurations of ../shared/specs/tutorial.md (copied here by hand from
the spec's tables, independently of the script's own data): model shape, batch sizes, the parallel
layout and its launch size, VPP as layers per virtual stage, SP, recompute, the ZeRO-2 flags, CP's
comm type. No GPU needed: the commands are printed, not run."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("LEANTRON_ROOT", Path(__file__).resolve().parents[2]))
BIN = Path(os.environ.get("LEANTRON_BIN", ROOT / "build" / "bin"))
SCRIPT = ROOT / "bench" / "gpu" / "tutorial_tables.py"

# The spec's row ids per table (§1, §3-§8).
IDS = {
    "dp": [f"R{i}" for i in range(1, 14)],
    "tp-weak": [f"R{i}" for i in range(1, 9)],
    "tp-strong": [f"R{i}" for i in range(11, 19)],
    "sp-ra": ["C1", "C2", "C3"],
    "cp": [f"R{i}" for i in range(0, 10)],
    "pp": [f"R{i}" for i in range(1, 16)],
    "ep": [f"R{i}" for i in range(0, 9)],
}
ZERO = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
RECOMPUTE = {"--recompute-granularity": "full", "--recompute-method": "uniform",
             "--recompute-num-layers": "1"}
# layers, hidden, heads, kv channels, ffn, seq
XL = (48, 1600, 25, 64, 6400, 1024)
B1_2 = (40, 1536, 16, 96, 6144, 1024)
B8_3 = (72, 3072, 32, 96, 12288, 1024)
B22 = (48, 6144, 64, 96, 24576, 2048)


def dry_run(*args):
    p = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--bin", str(BIN), *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = {}
    for line in p.stdout.splitlines():
        if " | $ " not in line:
            continue
        key, world, _, status, cmd = line.split(" | ", 4)
        argv = shlex.split(cmd[2:])
        flags, i = {}, 1
        while i < len(argv):
            assert argv[i].startswith("--"), argv[i]
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                flags[argv[i]] = argv[i + 1]
                i += 2
            else:
                flags[argv[i]] = True
                i += 1
        rows[key] = (int(world.split()[0]), status, flags)
    return rows


@pytest.fixture(scope="module")
def rows():
    return dry_run()


def check(flags, model, gbs, mbs, nproc=1, tp=1, pp=1, per_virtual=None, sp=False,
          recompute=False, zero=False, cp=None, comm=None):
    layers, hidden, heads, kv, ffn, seq = model
    want = {"--num-layers": layers, "--hidden-size": hidden, "--num-attention-heads": heads,
            "--kv-channels": kv, "--ffn-hidden-size": ffn, "--seq-length": seq,
            "--max-position-embeddings": seq, "--global-batch-size": gbs,
            "--micro-batch-size": mbs, "--tensor-model-parallel-size": tp,
            "--pipeline-model-parallel-size": pp}
    for flag, value in want.items():
        assert flags[flag] == str(value), flag
    assert flags.get("--nproc-per-node", "1") == str(nproc)
    assert flags.get("--num-layers-per-virtual-pipeline-stage") == (
        None if per_virtual is None else str(per_virtual))
    assert ("--sequence-parallel" in flags) == sp
    assert all((f in flags) == zero for f in ZERO)
    assert all(flags.get(f) == (v if recompute else None) for f, v in RECOMPUTE.items())
    assert flags.get("--context-parallel-size") == (None if cp is None else str(cp))
    assert flags.get("--cp-comm-type") == comm
    # The tutorial's bf16 run on mock data: GPT-2's 50257 ids, 100 iterations, 0 attention dropout.
    assert flags["--bf16"] is True and flags["--mock-data"] is True
    assert (flags["--tokenizer-type"], flags["--vocab-size"]) == ("NullTokenizer", "50256")
    assert flags["--train-iters"] == "100" and flags["--hidden-dropout"] == "0.1"
    assert flags["--attention-dropout"] == "0"


def test_every_row_of_every_table(rows):
    assert sorted(rows) == sorted(f"{t}:{i}" for t, ids in IDS.items() for i in ids)
    for key, (world, _, flags) in rows.items():
        # One process per GPU, and the batch splits into micro-batches over DP.
        assert int(flags.get("--nproc-per-node", "1")) == world, key
        tp = int(flags["--tensor-model-parallel-size"])
        pp = int(flags["--pipeline-model-parallel-size"])
        cp = int(flags.get("--context-parallel-size", "1"))
        assert world % (tp * pp * cp) == 0, key
        dp = world // (tp * pp * cp)
        assert int(flags["--global-batch-size"]) % (int(flags["--micro-batch-size"]) * dp) == 0, key


def test_dp_rows(rows):
    check(rows["dp:R1"][2], XL, 1, 1)
    check(rows["dp:R4"][2], XL, 60, 15)                                  # GA 4 on one GPU
    check(rows["dp:R6"][2], XL, 60, 15, nproc=4, zero=True)              # the image's GBS 60
    check(rows["dp:R7"][2], XL, 16, 16, zero=True)                       # flags passed at DP1
    check(rows["dp:R8"][2], XL, 32, 16, nproc=2, zero=True)
    check(rows["dp:R11"][2], XL, 168, 21, nproc=8, zero=True)
    check(rows["dp:R12"][2], XL, 120, 15, nproc=8)
    check(rows["dp:R13"][2], (62,) + XL[1:], 128, 16, nproc=8, zero=True)  # 48 + 14 layers


def test_tp_and_sp_rows(rows):
    check(rows["tp-weak:R2"][2], (54, 1920, 20, 96, 7680, 1024), 8, 8, nproc=2, tp=2)
    check(rows["tp-weak:R3"][2], (64, 2304, 24, 96, 9216, 1024), 8, 8, nproc=4, tp=4)
    check(rows["tp-weak:R8"][2], B8_3, 20, 20, nproc=8, tp=8)
    check(rows["tp-strong:R11"][2], B1_2, 8, 8)
    check(rows["tp-strong:R17"][2], B1_2, 20, 20, nproc=4, tp=4)
    check(rows["sp-ra:C1"][2], B22, 4, 4, nproc=8, tp=8)
    check(rows["sp-ra:C2"][2], B22, 4, 4, nproc=8, tp=8, sp=True)
    check(rows["sp-ra:C3"][2], B22, 4, 4, nproc=8, tp=8, recompute=True)


def test_cp_rows(rows):
    s4k, s16k = B1_2[:5] + (4096,), B1_2[:5] + (16384,)
    check(rows["cp:R0"][2], s4k, 8, 8, recompute=True)   # CP1: --cp-comm-type has no effect
    check(rows["cp:R1"][2], s4k, 8, 8)
    check(rows["cp:R2"][2], s4k, 8, 8, nproc=2, cp=2, comm="p2p")
    check(rows["cp:R3"][2], s4k, 8, 8, nproc=4, cp=4, comm="p2p")
    check(rows["cp:R5"][2], s4k, 8, 8, nproc=8, cp=8, comm="all_gather")
    check(rows["cp:R6"][2], s4k, 8, 8, nproc=8, cp=8, comm="a2a")
    check(rows["cp:R7"][2], s16k, 8, 8, nproc=8, cp=8, comm="p2p")
    check(rows["cp:R9"][2], s16k, 8, 8, nproc=8, cp=8, comm="a2a")
    for key in ("cp:R0", "cp:R2", "cp:R9"):
        assert rows[key][2]["--eval-interval"] == "25"


def test_pp_rows(rows):
    check(rows["pp:R1"][2], B8_3, 32, 32, nproc=8, pp=8)
    check(rows["pp:R6"][2], B8_3, 32, 1, nproc=8, pp=8)
    check(rows["pp:R7"][2], B8_3, 32, 4, nproc=8, pp=8, per_virtual=3)   # VPP 3 of 9 layers
    check(rows["pp:R8"][2], B8_3, 32, 4, nproc=8, pp=8, per_virtual=1)   # the image's VPP 9
    check(rows["pp:R9"][2], B8_3, 32, 32, nproc=8, tp=8, sp=True)
    check(rows["pp:R10"][2], B8_3, 32, 8, nproc=8, tp=2, pp=4, sp=True)
    # The image's VPP (virtual stages per rank) of 18 layers per stage.
    for row, per in (("R11", 9), ("R12", 6), ("R13", 3), ("R14", 2), ("R15", 1)):
        check(rows[f"pp:{row}"][2], B8_3, 32, 8, nproc=8, tp=2, pp=4, sp=True, per_virtual=per)


def test_makefile_variants():
    """--makefile: what the tutorial's Makefile launches where the spec marks a MISMATCH."""
    rows = dry_run("--makefile", "--only", "dp:R6,pp:R8,pp:R12,pp:R13,pp:R14,pp:R15")
    check(rows["dp:R6"][2], XL, 64, 16, nproc=4, zero=True)
    check(rows["pp:R8"][2], B8_3, 32, 32, nproc=8, tp=8, sp=True)        # = R9
    for row, per in (("R12", 3), ("R13", 6), ("R14", 9), ("R15", None)):
        check(rows[f"pp:{row}"][2], B8_3, 32, 8, nproc=8, tp=2, pp=4, sp=True, per_virtual=per)


@pytest.mark.parametrize("strategy", ["optim_grads", "optim_grads_params"])
def test_zero2_rows_can_shard_the_gradients(strategy):
    """--sharding optim_grads (optim_grads_params): the ZeRO-2 rows add
    --data-parallel-sharding-strategy with it to the tutorial's flags; the other rows stay as
    they are."""
    rows = dry_run("--sharding", strategy, "--table", "dp")
    check(rows["dp:R8"][2], XL, 32, 16, nproc=2, zero=True)
    for key, (_, status, flags) in rows.items():
        zero = "--use-distributed-optimizer" in flags
        assert (flags.get("--data-parallel-sharding-strategy") == strategy) == zero, key
        assert status == "runs", key
    assert "--data-parallel-sharding-strategy" not in dry_run("--table", "dp")["dp:R8"][2]


def test_ep_rows_carry_megatron_moe_flags(rows):
    world, _, flags = rows["ep:R7"]
    assert world == 8 and flags["--nproc-per-node"] == "8"
    assert (flags["--num-experts"], flags["--moe-router-topk"], flags["--moe-ffn-hidden-size"]) == (
        "256", "8", "1024")
    assert (flags["--expert-model-parallel-size"], flags["--expert-tensor-parallel-size"]) == (
        "4", "2")
    assert (flags["--num-layers"], flags["--hidden-size"], flags["--seq-length"]) == (
        "16", "1024", "4096")
    assert (flags["--global-batch-size"], flags["--micro-batch-size"]) == ("32", "4")
    assert all(f in flags for f in ZERO)
    assert "--use-distributed-optimizer" not in rows["ep:R0"][2]


def test_selection_and_megatron_figures():
    """--table / --only pick rows; the figures kept are the spec's."""
    assert sorted(dry_run("--table", "sp")) == ["sp-ra:C1", "sp-ra:C2", "sp-ra:C3"]
    assert sorted(dry_run("--table", "dp", "--only", "R1,R8")) == ["dp:R1", "dp:R8"]
    assert sorted(dry_run("--only", "cp:R5,pp:R7")) == ["cp:R5", "pp:R7"]
    sys.path.insert(0, str(SCRIPT.parent))
    import tutorial_tables as tt
    fig = {r.key: (r.mem_gb, r.step_ms) for r in tt.ROWS}
    assert fig["dp:R8"] == (74.9, 423) and fig["dp:R7"] == ("OOM", None)
    assert fig["tp-weak:R8"] == (80.6, 512) and fig["tp-strong:R14"] == (13.3, 205)
    assert fig["sp-ra:C2"] == (62.0, 427) and fig["sp-ra:C1"] == ("OOM", None)
    assert fig["cp:R9"] == (71, 1250) and fig["pp:R13"] == (56, 665)
    assert fig["ep:R5"] == ("OOM", None) and fig["ep:R2"] == (43, 256)
    # Padded vocabulary as Megatron's 128 x TP: 50304 / 50432 / 50688 / 51200.
    pad = {r.tp: r.padded_vocab() for r in tt.ROWS}
    assert pad == {1: 50304, 2: 50432, 4: 50688, 8: 51200}


def test_world_sizes_as_the_spec_lists_them():
    """§10 of the spec: which rows run on 1, 2 and 4 GPUs (every other row needs 8)."""
    want = {
        1: ["dp:R1", "dp:R3", "dp:R4", "dp:R7", "tp-weak:R1", "tp-weak:R5", "tp-strong:R11",
            "tp-strong:R15", "cp:R0", "cp:R1"],
        2: ["dp:R8", "tp-weak:R2", "tp-weak:R6", "tp-strong:R12", "tp-strong:R16", "cp:R2"],
        4: ["dp:R2", "dp:R5", "dp:R6", "dp:R9", "tp-weak:R3", "tp-weak:R7", "tp-strong:R13",
            "tp-strong:R17", "cp:R3"],
    }
    for world, keys in want.items():
        assert sorted(dry_run("--world", str(world))) == sorted(keys), world
    every = dry_run()
    eight = dry_run("--world", "8")
    assert sorted(eight) == sorted(k for k in every if all(k not in v for v in want.values()))
    assert all(world == 8 for world, _, _ in eight.values())
