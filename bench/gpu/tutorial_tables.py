"""Every table of the Megatron tutorial "Megatron, Transformed!" (../shared/specs/tutorial.md: DP /
ZeRO-2, TP weak and strong scaling, SP against recompute, CP, PP / VPP, EP / MoE), row by row, as
data, run with `train --bf16` on the GPUs at hand and printed beside Megatron's figures (8 x H100
80 GB, Megatron-LM core_r0.14.0).

Each row keeps the tutorial's model shape, batch sizes, parallel layout, recompute and ZeRO-2 flags
(`--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather`), its optimizer settings
(lr 6e-5 cosine to 6e-6 over 430000 iterations, warm-up fraction .001 = 430 iterations, weight decay
0.1, betas 0.9 / 0.95, init std 0.006, clipping 1.0), hidden dropout 0.1, erf GELU, tied embeddings,
biases, learned positions, evaluation every 50 iterations (25 in the CP table) over 10 batches, and
100 iterations (`--iters N` for fewer). What differs:
- Data: `--mock-data` with NullTokenizer `--vocab-size 50256` (50257 ids, GPT-2's vocabulary, padded
  to a multiple of 128 x TP as Megatron pads it) instead of openwebtext-10k. Step time and memory
  depend on the shapes, not on the token values, so the figures compare.
- Attention dropout 0 instead of 0.1: the bf16 model's flash attention has none (train refuses it).
- What train lacks is not imitated: a row whose flags train does not know (MoE / EP) is printed as
  "not implemented: FLAG" and a row train refuses (context parallelism today) with train's sentence.
Both are printed in the tables (a line above each table for what every row shares, the row's note
for the rest).

Measured: our step time (mean of the logged iterations after the first tenth, Megatron's `elapsed
time per iteration`; evaluation is outside it in both), tokens/s per GPU, MFU by Megatron's FLOPs
formula (bench/gpu/megatron_flops.py, padded vocabulary, 989 TFLOP/s bf16 peak of H100 / H200) and
GPU memory per GPU: each rank's `GPU memory in use at the end` line (cudaMemGetInfo, CUDA context
included, as gpustat's reading is), in the tutorial's unit GB = MiB / 1000; the largest rank, with
the range where ranks differ. Rows whose world size (DP x TP x PP x CP) exceeds the GPUs present
are printed as "needs N GPUs".

    python3 bench/gpu/tutorial_tables.py [--table dp|tp-weak|tp-strong|sp-ra|cp|pp|ep]
        [--only R1,R3 | dp:R8,pp:R7] [--world 1,2,4,8] [--iters N] [--gpus N] [--makefile]
        [--row-timeout S] [--out FILE] [--log-dir DIR] [--dry-run]
On the device machine: bash scripts/device_check.sh tutorial [args] (writes $OUT/tutorial.md).
`--world` keeps the rows of those world sizes. `--makefile` runs, for the rows where the
tutorial's Makefile launches something else than its image shows, what the Makefile launches.
`--dry-run` prints every selected row's command and an estimate of its wall time (start-up,
initialisation, iterations at Megatron's pace), to plan device calls of at most 10 minutes.
"""
import argparse
import dataclasses
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_flops import flops_per_token  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PEAK_TFLOPS = 989.0  # dense bf16, H100 / H200 SXM
VOCAB = 50257        # GPT-2's; NullTokenizer --vocab-size 50256 plus its EOD


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_channels: int
    ffn: int
    seq: int
    experts: int = 0     # MoE (the EP table): experts per layer, router top-k, expert ffn
    topk: int = 0
    moe_ffn: int = 0


@dataclass(frozen=True)
class Row:
    table: str
    id: str
    target: str          # the tutorial's make target
    model: Model
    gbs: int
    mbs: int
    dp: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 0         # virtual stages per pipeline rank (the image's "VPP"); 0: not interleaved
    cp: int = 1
    ep: int = 1
    etp: int = 1
    sp: bool = False
    recompute: bool = False  # full, uniform, 1 layer (--recompute-granularity/-method/-num-layers)
    zero: bool = False       # ZeRO-2: --use-distributed-optimizer and both --overlap-* flags
    # With `zero`: what the data-parallel ranks shard (--sharding): the tutorial's flags (optim,
    # Megatron's distributed optimizer), or the gradients too (optim_grads), or the weights too
    # (optim_grads_params).
    sharding: str = "optim"
    cp_comm: str = ""        # --cp-comm-type (CP table; passed there only where CP > 1)
    mem_gb: Union[float, str, None] = None  # Megatron's GB/gpu ("OOM")
    step_ms: Optional[float] = None         # Megatron's ms (None: OOM)
    note: str = ""                          # printed: how the row reads the tutorial
    makefile: dict = field(default_factory=dict)  # what the Makefile launches instead (--makefile)

    @property
    def world(self):
        return self.dp * self.tp * self.pp * self.cp

    @property
    def key(self):
        return f"{self.table}:{self.id}"

    def padded_vocab(self):
        unit = 128 * self.tp
        return (VOCAB + unit - 1) // unit * unit


# ------------------------------------------------------------------------------------ the models
XL = Model("gpt2-xl", 48, 1600, 25, 64, 6400, 1024)
XL62 = dataclasses.replace(XL, name="gpt2-xl + 14 layers (1.99B)", layers=62)
B1_2 = Model("gpt2-1.2B", 40, 1536, 16, 96, 6144, 1024)
B2_5 = Model("gpt2-2.5B", 54, 1920, 20, 96, 7680, 1024)
B4_2 = Model("gpt2-4.2B", 64, 2304, 24, 96, 9216, 1024)
B8_3 = Model("gpt2-8.3B", 72, 3072, 32, 96, 12288, 1024)
B22 = Model("GPT-22B", 48, 6144, 64, 96, 24576, 2048)
# The EP table's "OLMoE": every layer MoE (the dense ffn, 4h, is unused), GeLU experts.
OLMOE = Model("OLMoE-like", 16, 1024, 16, 64, 4096, 4096, experts=64, topk=8, moe_ffn=1024)


def cp_model(seq):
    return dataclasses.replace(B1_2, name=f"gpt2-1.2B, seq {seq}", seq=seq)


def moe(experts):
    return dataclasses.replace(OLMOE, experts=experts)


def R(table, id_, target, model, gbs, mbs, mem, ms, **kw):
    return Row(table, id_, target, model, gbs, mbs, mem_gb=mem, step_ms=ms, **kw)


TABLES = {  # key: (title, spec section)
    "dp": ("DP / ZeRO-2, gpt2-xl (1.56B), seq 1024", "§1"),
    "tp-weak": ("TP weak scaling, 1.2B to 8.3B, seq 1024, MBS = GBS", "§3"),
    "tp-strong": ("TP strong scaling, gpt2-1.2B, seq 1024, MBS = GBS", "§4"),
    "sp-ra": ("SP against activation recompute, GPT-22B, TP8, seq 2048, GBS = MBS = 4", "§5"),
    "cp": ("Context parallelism, gpt2-1.2B, GBS = MBS = 8", "§6"),
    "pp": ("PP / VPP, gpt2-8.3B, GBS 32 on 8 GPUs", "§7"),
    "ep": ("EP / MoE, OLMoE-like (16 layers, h 1024, top-8), DP8, GBS 32, MBS 4, seq 4096", "§8"),
}
ALIASES = {"sp": "sp-ra"}

ROWS = [
    # §1 DP / ZeRO-2 (tbl-101).
    R("dp", "R1", "101-gpt2xl-dp1-gbs1-bf16", XL, 1, 1, 33.3, 220),
    R("dp", "R2", "104-gpt2xl-dp4-gbs4", XL, 4, 1, 33.8, 250, dp=4),
    R("dp", "R3", "111-gpt2xl-dp1-fit-80GB", XL, 15, 15, 78.5, 393),
    R("dp", "R4", "112-gpt2xl-dp1-fit-80GB-GA4", XL, 60, 15, 78.5, 1470),
    R("dp", "R5", "114-gpt2xl-dp4-fit-4x80GB", XL, 60, 15, 79.0, 421, dp=4),
    # MISMATCH: the Makefile runs `4 64 1` (GBS 64, MBS 16: R9's command); the image and the
    # target's name say GBS 60, and R6's memory below R9's points to GBS 60 / MBS 15.
    R("dp", "R6", "115-gpt2xl-dp4-gbs60-zero2", XL, 60, 15, 64.8, 415, dp=4, zero=True,
      note="the image's GBS 60 / MBS 15; the Makefile runs GBS 64 / MBS 16 (--makefile)",
      makefile=dict(gbs=64, mbs=16)),
    # The image strikes out "ZeRO2": the flags are passed and do nothing at DP1.
    R("dp", "R7", "121-gpt2xl-dp1-gbs16-oom", XL, 16, 16, "OOM", None, zero=True,
      note="ZeRO-2 flags passed, no effect at DP1"),
    R("dp", "R8", "122-gpt2xl-dp2-gbs32-zero2", XL, 32, 16, 74.9, 423, dp=2, zero=True),
    R("dp", "R9", "124-gpt2xl-dp4-gbs64-zero2", XL, 64, 16, 67.5, 419, dp=4, zero=True),
    R("dp", "R10", "128-gpt2xl-dp8-gbs128-zero2", XL, 128, 16, 64.5, 432, dp=8, zero=True),
    # The image names it 129-gpt2xl-dp8-zero2-fit-gbs (commit cba83b2, undone at HEAD).
    R("dp", "R11", "129-gpt2xl-dp8-gbs168-zero2", XL, 168, 21, 80.3, 540, dp=8, zero=True),
    R("dp", "R12", "118-gpt2xl-dp8-fit-8x80GB", XL, 120, 15, 79.2, 421, dp=8),
    # Image: 130-gpt2xl-dp8-zero2-fit-param, no target at HEAD; the script is named "+12tx" but
    # sets L=62 (48 + 14).
    R("dp", "R13", "130_gpt2xl+12tx_dp8_zero2_gbs128.sh", XL62, 128, 16, 79.8, 542, dp=8,
      zero=True),
    # §3 TP weak scaling (tbl-202): MBS = GBS, DP 1, SP off.
    R("tp-weak", "R1", "211-weak-scale-tp1-gpt2-1.2B-paper", B1_2, 8, 8, 43.5, 209),
    R("tp-weak", "R2", "212-weak-scale-tp2-gpt2-2.5B-paper", B2_5, 8, 8, 46.8, 273, tp=2),
    R("tp-weak", "R3", "214-weak-scale-tp4-gpt2-4.2B-paper", B4_2, 8, 8, 42.6, 310, tp=4),
    R("tp-weak", "R4", "218-weak-scale-tp8-gpt2-8.3B-paper", B8_3, 8, 8, 46.4, 329, tp=8),
    R("tp-weak", "R5", "221-weak-scale-tp1-gpt2-1.2B-gbs20", B1_2, 20, 20, 78.1, 400),
    R("tp-weak", "R6", "222-weak-scale-tp2-gpt2-2.5B-gbs20", B2_5, 20, 20, 77.7, 475, tp=2),
    R("tp-weak", "R7", "224-weak-scale-tp4-gpt2-4.2B-gbs20", B4_2, 20, 20, 72.1, 450, tp=4),
    R("tp-weak", "R8", "228-weak-scale-tp8-gpt2-8.3B-gbs20", B8_3, 20, 20, 80.6, 512, tp=8),
    # §4 TP strong scaling (tbl-203). R11 = weak R1 and R15 = weak R5 (run-to-run noise ~2.5%).
    R("tp-strong", "R11", "231-strong-scale-gpt2-1.2B-tp1-paper", B1_2, 8, 8, 43.5, 210),
    R("tp-strong", "R12", "232-strong-scale-gpt2-1.2B-tp2-paper", B1_2, 8, 8, 27.6, 200, tp=2),
    R("tp-strong", "R13", "234-strong-scale-gpt2-1.2B-tp4-paper", B1_2, 8, 8, 17.2, 200, tp=4),
    R("tp-strong", "R14", "238-strong-scale-gpt2-1.2B-tp8-paper", B1_2, 8, 8, 13.3, 205, tp=8),
    R("tp-strong", "R15", "241-strong-scale-gpt2-1.2B-tp1-gbs20", B1_2, 20, 20, 78.1, 390),
    R("tp-strong", "R16", "242-strong-scale-gpt2-1.2B-tp2-gbs20", B1_2, 20, 20, 46.5, 259, tp=2),
    R("tp-strong", "R17", "244-strong-scale-gpt2-1.2B-tp4-gbs20", B1_2, 20, 20, 30.9, 207, tp=4),
    R("tp-strong", "R18", "248-strong-scale-gpt2-1.2B-tp8-gbs20", B1_2, 20, 20, 23.3, 207, tp=8),
    # §5 SP vs recompute (tbl-280-sp-ra). Profile targets (fwd/bwd/misc) are not rows here.
    R("sp-ra", "C1", "281-gpt-22B-tp8-gbs4-len2048-oom", B22, 4, 4, "OOM", None, tp=8),
    R("sp-ra", "C2", "282-gpt-22B-tp8-gbs4-len2048-sp", B22, 4, 4, 62.0, 427, tp=8, sp=True),
    R("sp-ra", "C3", "283-gpt-22B-tp8-gbs4-len2048-ra", B22, 4, 4, 57.6, 570, tp=8,
      recompute=True),
    # §6 CP (tbl-301-cp): --attention-backend flash (ours always is), eval every 25. The script
    # always passes --cp-comm-type; at CP1 it has no effect and is not passed here. The image
    # leaves Seq blank for R8 and R9; the Makefile sets 16384.
    R("cp", "R0", "300-cp1-gpt2-1.2B-gbs8-len4096-ra", cp_model(4096), 8, 8, 38, 995,
      recompute=True, note="--cp-comm-type p2p not passed (no effect at CP1)"),
    R("cp", "R1", "301-cp1-gpt2-1.2B-gbs8-len4096-oom", cp_model(4096), 8, 8, "OOM", None,
      note="--cp-comm-type p2p not passed (no effect at CP1)"),
    R("cp", "R2", "302-cp2-gpt2-1.2B-gbs8-len4096", cp_model(4096), 8, 8, 69, 475, cp=2,
      cp_comm="p2p"),
    R("cp", "R3", "304-cp4-gpt2-1.2B-gbs8-len4096", cp_model(4096), 8, 8, 49, 360, cp=4,
      cp_comm="p2p"),
    R("cp", "R4", "308-cp8-gpt2-1.2B-gbs8-len4096", cp_model(4096), 8, 8, 39, 450, cp=8,
      cp_comm="p2p"),
    R("cp", "R5", "318-cp8-gpt2-1.2B-gbs8-len4096-ag", cp_model(4096), 8, 8, 36, 342, cp=8,
      cp_comm="all_gather"),
    R("cp", "R6", "328-cp8-gpt2-1.2B-gbs8-len4096-a2a", cp_model(4096), 8, 8, 38, 332, cp=8,
      cp_comm="a2a"),
    R("cp", "R7", "338-cp8-gpt2-1.2B-gbs8-len16k", cp_model(16384), 8, 8, 80, 1300, cp=8,
      cp_comm="p2p"),
    R("cp", "R8", "348-cp8-gpt2-1.2B-gbs8-len16k-ag", cp_model(16384), 8, 8, 68, 1440, cp=8,
      cp_comm="all_gather"),
    R("cp", "R9", "358-cp8-gpt2-1.2B-gbs8-len16k-a2a", cp_model(16384), 8, 8, 71, 1250, cp=8,
      cp_comm="a2a"),
    # §7 PP / VPP (tbl-401-pp-vpp): GBS 32, world 8, DP 1. "VPP" is virtual stages per rank;
    # the scripts pass --num-layers-per-virtual-pipeline-stage (layers per stage / VPP), only
    # when > 1. Rows run the image's intent; `makefile` holds what the Makefile launches.
    R("pp", "R1", "401-gpt2-8.3B-pp8-m1", B8_3, 32, 32, 57, 2920, pp=8),
    R("pp", "R2", "402-gpt2-8.3B-pp8-m2", B8_3, 32, 16, 56, 1730, pp=8),
    R("pp", "R3", "404-gpt2-8.3B-pp8-m4", B8_3, 32, 8, 57, 1130, pp=8),
    R("pp", "R4", "408-gpt2-8.3B-pp8-m8", B8_3, 32, 4, 55, 875, pp=8),
    R("pp", "R5", "416-gpt2-8.3B-pp8-m16", B8_3, 32, 2, 40, 1160, pp=8),
    R("pp", "R6", "432-gpt2-8.3B-pp8-m32", B8_3, 32, 1, 33, 2050, pp=8),
    R("pp", "R7", "438-gpt2-8.3B-pp8-vpp3-m8", B8_3, 32, 4, 57, 715, pp=8, vpp=3),
    # MISMATCH: the target runs the tpsp script with its defaults (TP8 + SP, PP1, MBS 32: R9).
    R("pp", "R8", "498-gpt2-8.3B-pp8-vpp9-m8", B8_3, 32, 4, 55, 880, pp=8, vpp=9,
      note="the image's PP8 VPP9; the Makefile runs TP8+SP PP1 MBS 32 = R9 (--makefile)",
      makefile=dict(tp=8, sp=True, pp=1, vpp=0, mbs=32)),
    R("pp", "R9", "420-gpt2-8.3B-tpsp8", B8_3, 32, 32, 53, 757, tp=8, sp=True),
    R("pp", "R10", "424-gpt2-8.3B-tpsp2-pp4-m4", B8_3, 32, 8, 55, 887, tp=2, sp=True, pp=4),
    # No such target (the name says vpp3); 9 layers / substage is what target 449 launches.
    R("pp", "R11", "442-gpt2-8.3B-tpsp2-pp4-vpp3-m4", B8_3, 32, 8, 56, 745, tp=2, sp=True,
      pp=4, vpp=2, note="no such target; the image's VPP 2 (9 layers per virtual stage)"),
    # MISMATCH (R12-R15): the Makefile passes VPP as layers per virtual stage.
    R("pp", "R12", "443-gpt2-8.3B-tpsp2-pp4-vpp3-m4", B8_3, 32, 8, 56, 680, tp=2, sp=True,
      pp=4, vpp=3, note="the image's VPP 3; the Makefile runs VPP 6 (--makefile)",
      makefile=dict(vpp=6)),
    R("pp", "R13", "446-gpt2-8.3B-tpsp2-pp4-vpp6-m4", B8_3, 32, 8, 56, 665, tp=2, sp=True,
      pp=4, vpp=6, note="the image's VPP 6; the Makefile runs VPP 3 (--makefile)",
      makefile=dict(vpp=3)),
    R("pp", "R14", "449-gpt2-8.3B-tpsp2-pp4-vpp9-m4", B8_3, 32, 8, 55, 710, tp=2, sp=True,
      pp=4, vpp=9, note="the image's VPP 9; the Makefile runs VPP 2 (--makefile)",
      makefile=dict(vpp=2)),
    # 18 layers per virtual stage = one virtual stage: Megatron runs R10's schedule (887 ms).
    R("pp", "R15", "458-gpt2-8.3B-tpsp2-pp4-vpp18-m4", B8_3, 32, 8, 55, 895, tp=2, sp=True,
      pp=4, vpp=18, note="the image's VPP 18; the Makefile runs no VPP, = R10 (--makefile)",
      makefile=dict(vpp=0)),
    # §8 EP / MoE (tbl-502-ep): TP1 (--sequence-parallel passed, off at TP1), DP8, GBS 32, MBS 4.
    R("ep", "R0", "500-olmoe-dp8", moe(64), 32, 4, 70, 373, dp=8, sp=True),
    R("ep", "R1", "501-olmoe-dp8-zero2", moe(64), 32, 4, 48, 337, dp=8, sp=True, zero=True),
    R("ep", "R2", "502-olmoe-dp8-zero2-ep8", moe(64), 32, 4, 43, 256, dp=8, sp=True, zero=True,
      ep=8),
    R("ep", "R3", "503-olmoe-2xE-dp8-zero2", moe(128), 32, 4, 64, 527, dp=8, sp=True, zero=True),
    R("ep", "R4", "504-olmoe-2xE-dp8-zero2-ep8", moe(128), 32, 4, 49, 284, dp=8, sp=True,
      zero=True, ep=8),
    R("ep", "R5", "505-olmoe-4xE-dp8-zero2", moe(256), 32, 4, "OOM", None, dp=8, sp=True,
      zero=True),
    R("ep", "R6", "506-olmoe-4xE-dp8-zero2-ep8", moe(256), 32, 4, 57, 314, dp=8, sp=True,
      zero=True, ep=8),
    R("ep", "R7", "511-olmoe-4xE-dp8-zero2-ep4-etp2", moe(256), 32, 4, 62, 473, dp=8, sp=True,
      zero=True, ep=4, etp=2),
    R("ep", "R8", "512-olmoe-4xE-dp8-zero2-ep2-etp4", moe(256), 32, 4, 74, 855, dp=8, sp=True,
      zero=True, ep=2, etp=4),
]

# What every row runs differently from the tutorial (printed above each table).
COMMON_NOTE = ("attention dropout 0 (the tutorial's 0.1: the bf16 model's flash attention has "
               "none); mock data (NullTokenizer, 50257 ids)")


def as_launched(row, makefile):
    """The row as the Makefile launches it (with --makefile), else as the image shows it."""
    return dataclasses.replace(row, **row.makefile) if makefile and row.makefile else row


def train_args(row, iters):
    """`train --bf16` flags for a row (Megatron's names), without the binary."""
    m = row.model
    a = ["--bf16", "--num-layers", m.layers, "--hidden-size", m.hidden,
         "--num-attention-heads", m.heads, "--kv-channels", m.kv_channels,
         "--ffn-hidden-size", m.ffn, "--seq-length", m.seq, "--max-position-embeddings", m.seq,
         "--hidden-dropout", "0.1", "--attention-dropout", "0",
         "--micro-batch-size", row.mbs, "--global-batch-size", row.gbs,
         "--tensor-model-parallel-size", row.tp, "--pipeline-model-parallel-size", row.pp]
    if row.vpp > 1:
        a += ["--num-layers-per-virtual-pipeline-stage", m.layers // row.pp // row.vpp]
    if row.sp:
        a.append("--sequence-parallel")
    if row.cp > 1:
        a += ["--context-parallel-size", row.cp, "--cp-comm-type", row.cp_comm]
    if row.recompute:
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform",
              "--recompute-num-layers", "1"]
    if row.zero:
        a += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
        if row.sharding != "optim":
            a += ["--data-parallel-sharding-strategy", row.sharding]
    if m.experts:
        a += ["--num-experts", m.experts, "--moe-router-topk", m.topk, "--moe-ffn-hidden-size",
              m.moe_ffn, "--moe-grouped-gemm", "--moe-permute-fusion", "--disable-bias-linear",
              "--moe-router-force-load-balancing", "--moe-token-dispatcher-type", "alltoall",
              "--expert-model-parallel-size", row.ep, "--expert-tensor-parallel-size", row.etp]
    a += ["--lr", "6.0e-5", "--min-lr", "6.0e-6", "--lr-decay-style", "cosine",
          "--lr-decay-iters", "430000", "--lr-warmup-iters", "430", "--weight-decay", "0.1",
          "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--init-method-std", "0.006",
          "--clip-grad", "1.0",
          "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", VOCAB - 1,
          "--train-iters", iters, "--log-interval", "1", "--log-throughput",
          "--eval-interval", 25 if row.table == "cp" else 50, "--eval-iters", "10"]
    if row.world > 1:
        a += ["--nproc-per-node", row.world]
    return [str(x) for x in a]


def command(bin_dir, row, iters):
    return [str(Path(bin_dir) / "train")] + train_args(row, iters)


def layout(row):
    parts = [f"{n}{v}" for n, v in (("DP", row.dp), ("TP", row.tp), ("PP", row.pp),
                                     ("CP", row.cp), ("EP", row.ep), ("ETP", row.etp)) if v > 1]
    if row.vpp > 1:
        parts.append(f"VPP{row.vpp}")
    if row.sp and row.tp > 1:
        parts.append("SP")
    if row.cp > 1:
        parts.append(row.cp_comm)
    if row.recompute:
        parts.append("recompute")
    if row.zero:
        parts.append("ZeRO-2" if row.sharding == "optim" else f"ZeRO-2 ({row.sharding})")
    if row.model.experts:
        parts.insert(0, f"E{row.model.experts}")
    return " ".join(parts) or "1 GPU"


def select(table, only, world=""):
    tables = [ALIASES.get(t, t) for t in table.split(",")] if table else list(TABLES)
    for t in tables:
        if t not in TABLES:
            raise SystemExit(f"unknown table {t}; tables: {', '.join(TABLES)}")
    rows = [r for r in ROWS if r.table in tables]
    if only:
        want = [w.strip() for w in only.split(",") if w.strip()]
        rows = [r for r in rows if r.id in want or r.key in want]
        known = {r.id for r in ROWS} | {r.key for r in ROWS}
        for w in want:
            if w not in known:
                raise SystemExit(f"unknown row {w}")
    if world:
        sizes = {int(w) for w in world.split(",")}
        rows = [r for r in rows if r.world in sizes]
    return rows


def parameters(row):
    """Dense parameters (MoE rows: the dense model's), tied embedding counted once."""
    m = row.model
    q = m.heads * m.kv_channels
    layer = m.hidden * 3 * q + 3 * q + q * m.hidden + 2 * m.hidden * m.ffn + m.ffn + 6 * m.hidden
    return m.layers * layer + (row.padded_vocab() + m.seq + 2) * m.hidden


def estimate_s(row, iters):
    """Wall time of a row, for planning device calls: start-up, initialisation (train draws the
    normals of its stage's full tensors on the host, one core, on every TP rank: about 30 M/s),
    the iterations at Megatron's step time (1 s where Megatron ran out of memory)."""
    return 15 + parameters(row) / row.pp / 30e6 + iters * (row.step_ms or 1000) / 1000


# ------------------------------------------------------------------------------------ running
def known_flags(bin_dir):
    """The flags `train --help` lists (None without a binary)."""
    try:
        p = subprocess.run([str(Path(bin_dir) / "train"), "--help"], capture_output=True,
                           text=True, timeout=60)
    except OSError:
        return None
    return set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", p.stdout))


def missing_flags(row, flags):
    if flags is None:
        return []
    return [a for a in train_args(row, 1) if a.startswith("--") and a not in flags]


def gpu_count():
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except OSError:
        return 0
    return sum(1 for line in p.stdout.splitlines() if line.startswith("GPU"))


def parse(out, iters):
    ms = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([\d.]+)", out)]
    skip = max(1, iters // 10) if len(ms) > 1 else 0  # warm-up: the first tenth
    steady = ms[skip:]
    mem = {int(r): int(m) for r, m in
           re.findall(r"\[Rank (\d+)\] GPU memory in use at the end: (\d+) MB", out)}
    reports = re.findall(r"(\[Rank \d+\] step time .*)", out)
    loss = re.findall(r"lm loss: ([\d.E+-]+)", out)
    return {"ms": sum(steady) / len(steady) if steady else None, "iters": len(steady),
            "mem": mem, "reports": reports, "loss": float(loss[-1]) if loss else None}


def failure(out):
    """A short reason from a failed run's output."""
    if re.search(r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|OutOfMemory", out, re.I):
        return "OOM"
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    for line in lines:
        if "not implemented" in line or "not supported" in line:
            return "not implemented: " + line[-200:]
    return "error: " + (lines[-1][-200:] if lines else "no output")


def run_row(bin_dir, row, iters, timeout, log_dir):
    cmd = command(bin_dir, row, iters)
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")  # never NVLink multicast on shared hosts
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout or None, env=env)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:  # the launcher is killed, its ranks with it
        out = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x
                      for x in (e.stdout or "", e.stderr or ""))
        out, rc = out + f"\n(stopped after {timeout} s)", None
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        name = f"{row.table}_{row.id}.log"
        (Path(log_dir) / name).write_text(shlex.join(cmd) + "\n\n" + out)
    r = parse(out, iters)
    r["wall_s"] = time.time() - t0
    if rc != 0 or r["ms"] is None:
        r["status"] = f"timeout ({timeout} s)" if rc is None else failure(out)
    return r


# ------------------------------------------------------------------------------------ printing
def flops_token(row):
    m = row.model
    return flops_per_token(m.layers, m.hidden, m.seq, row.padded_vocab(), m.ffn, m.heads,
                           m.heads, m.kv_channels)


def per_gpu(row, ms):
    """(tokens/s per GPU, MFU %) at a step time."""
    tok = row.gbs * row.model.seq / (ms / 1000) / row.world
    return tok, flops_token(row) * tok / (PEAK_TFLOPS * 1e12) * 100


def fmt_gb(mib):
    return f"{mib / 1000:.1f}"


HEADER = ("| row | target | GPUs | layout | GBS / MBS | ours ms | Megatron ms | speed-up | "
          "ours tok/s per GPU | ours MFU | Megatron MFU | ours GB/gpu | Megatron GB/gpu | note |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def row_line(row, res):
    meg_ms = "–" if row.step_ms is None else f"{row.step_ms:g}"
    meg_mfu = "–" if row.step_ms is None or row.model.experts else \
        f"{per_gpu(row, row.step_ms)[1]:.1f}%"
    meg_mem = row.mem_gb if isinstance(row.mem_gb, str) else f"{row.mem_gb:g}"
    cells = ["", "", "", "", ""]  # ours ms, speed-up, tok/s, MFU, GB
    if res is None:
        cells[0] = "pending"
    elif "status" in res:
        cells[0] = res["status"]
        if res["status"] == "OOM" and row.mem_gb == "OOM":
            cells[1] = "OOM as Megatron"
    else:
        tok, mfu = per_gpu(row, res["ms"])
        cells[0] = f"{res['ms']:.1f}"
        cells[2], cells[3] = f"{tok:,.0f}", f"{mfu:.1f}%"
        if row.step_ms is None:
            cells[1] = "fits (Megatron OOM)"
        else:
            cells[1] = f"{row.step_ms / res['ms']:.2f}×"
        if res["mem"]:
            lo, hi = min(res["mem"].values()), max(res["mem"].values())
            cells[4] = fmt_gb(hi)
            if hi - lo >= 1000:
                cells[4] += f" (ranks {fmt_gb(lo)}–{fmt_gb(hi)})"
    return (f"| {row.id} | {row.target} | {row.world} | {layout(row)} | {row.gbs} / {row.mbs} | "
            f"{cells[0]} | {meg_ms} | {cells[1]} | {cells[2]} | {cells[3]} | {meg_mfu} | "
            f"{cells[4]} | {meg_mem} | {row.note} |")


def render(rows, results, args):
    out = [f"`train --bf16`, {args.iters} iterations per row"
           f"{', the Makefile configs (--makefile)' if args.makefile else ''}; "
           f"{args.gpus} GPU(s) present. Megatron: the tutorial's 8 x H100 80 GB. "
           "Speed-up = Megatron ms / ours; GB = MiB / 1000 as the tutorial's.", ""]
    for t, (title, section) in TABLES.items():
        rs = [r for r in rows if r.table == t]
        if not rs:
            continue
        out += [f"### {title} (tutorial {section}, `--table {t}`)", "",
                f"Every row: {COMMON_NOTE}.", "", HEADER]
        out += [row_line(r, results.get(r.key)) for r in rs]
        details = [f"- {r.id}: {rep}" for r in rs for rep in
                   (results.get(r.key) or {}).get("reports", [])]
        out += [""] + (details + [""] if details else [])
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    ap.add_argument("--table", default="", help="dp, tp-weak, tp-strong, sp-ra, cp, pp, ep "
                    "(comma-separated; default all)")
    ap.add_argument("--only", default="", help="rows: R1,R3 (in the tables chosen) or dp:R8,pp:R7")
    ap.add_argument("--world", default="", help="only rows of these world sizes (e.g. 2 or 4,8)")
    ap.add_argument("--iters", type=int, default=100, help="iterations per row (tutorial: 100)")
    ap.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: nvidia-smi -L)")
    ap.add_argument("--makefile", action="store_true",
                    help="run what the Makefile launches where it differs from the image")
    ap.add_argument("--row-timeout", type=int, default=0, help="seconds per row (0: none)")
    ap.add_argument("--out", default=None, help="markdown file, rewritten after every row")
    ap.add_argument("--log-dir", default=None, help="each row's full train log")
    ap.add_argument("--dry-run", action="store_true", help="print each row's command only")
    ap.add_argument("--sharding", default="optim",
                    choices=["optim", "optim_grads", "optim_grads_params"],
                    help="the ZeRO-2 rows: the tutorial's distributed optimizer (optim), "
                         "the gradients sharded too (optim_grads), or the weights too "
                         "(optim_grads_params)")
    args = ap.parse_args()
    rows = [as_launched(r, args.makefile) for r in select(args.table, args.only, args.world)]
    rows = [dataclasses.replace(r, sharding=args.sharding) if r.zero else r for r in rows]
    flags = known_flags(args.bin)
    if args.dry_run:
        total = 0
        for r in rows:
            missing = missing_flags(r, flags)
            est = 0 if missing else estimate_s(r, args.iters)
            total += est
            print(f"{r.key} | {r.world} GPUs | ~{est:.0f} s | "
                  f"{'not implemented: ' + ' '.join(missing) if missing else 'runs'} | "
                  f"$ {shlex.join(command(args.bin, r, args.iters))}")
            if r.note:
                print(f"    note: {r.note}")
        print(f"{len(rows)} rows, about {total:.0f} s for those that run ({args.iters} iterations)")
        return 0
    if flags is None:
        raise SystemExit(f"no train binary in {args.bin} (--bin)")
    args.gpus = gpu_count() if args.gpus is None else args.gpus
    results = {}
    for r in rows:
        missing = missing_flags(r, flags)
        if missing:
            results[r.key] = {"status": "not implemented: " + ", ".join(missing[:2]) + (
                f", … ({len(missing)} flags)" if len(missing) > 2 else "")}
        elif r.world > args.gpus:
            results[r.key] = {"status": f"needs {r.world} GPUs"}
    print(f"{len(rows)} rows; {sum(1 for r in rows if r.key not in results)} to run on "
          f"{args.gpus} GPU(s)", flush=True)
    for r in rows:
        if r.key in results:
            continue
        print(f"== {r.key} ({layout(r)}): {shlex.join(command(args.bin, r, args.iters))}",
              flush=True)
        res = run_row(args.bin, r, args.iters, args.row_timeout, args.log_dir)
        results[r.key] = res
        print(row_line(r, res), flush=True)
        for rep in res["reports"]:
            print("   ", rep, flush=True)
        if args.out:
            Path(args.out).write_text(render(rows, results, args) + "\n")
    text = render(rows, results, args)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
