"""Context parallelism on CPUs over Gloo, as real separate processes: the lm loss of every
iteration (20, with gradient accumulation and dropout on), the validation losses, the grad norms
and the final weights of CP runs equal one process's, for each --cp-comm-type (p2p ring,
all_gather, a2a head split), CP 2 and 4, alone and with TP 2 (+SP), PP 2 (1F1B and interleaved),
DP 2 and the distributed optimizer, for the GPT-2-style and the Llama-style model (RoPE, grouped
queries, SwiGLU); the long-context companions (--reset-position-ids, --reset-attention-mask,
--eod-mask-loss) on packed documents, with and without CP; a checkpoint saved at CP 2 resumed by
one process. The vocabulary (255 bytes + NullTokenizer's EOD = 256) pads to 256 at TP 1 and 2
alike (Megatron's 128 x TP), so every layout trains the same model."""
import numpy as np
import pytest

from ckpt_testlib import read_ours
from train_testlib import TINY, licence_dataset, parse_log, run_train

ITERS = 20
LLAMA = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
         "--group-query-attention", "--num-query-groups", "2",
         "--untie-embeddings-and-output-weights", "--disable-bias-linear",
         "--ffn-hidden-size", "48"]
COMPANIONS = ["--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"]
TP2_SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
PP2 = ["--pipeline-model-parallel-size", "2"]
VPP = PP2 + ["--num-layers-per-virtual-pipeline-stage", "1"]


def cp(size, comm):
    return ["--context-parallel-size", size, "--cp-comm-type", comm]


def common(data, save):
    return TINY + ["--data-path", data, "--split", "90,10,0", "--micro-batch-size", "2",
                   "--global-batch-size", "8", "--train-iters", ITERS, "--lr", "2e-3",
                   "--lr-warmup-iters", "3", "--lr-decay-style", "cosine", "--min-lr", "1e-4",
                   "--log-interval", "1", "--eval-interval", "10", "--eval-iters", "2",
                   "--save", save]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    return {"plain": licence_dataset(d / "licences"),
            "packed": licence_dataset(d / "packed", eod=255)}


# The one-process runs every layout is compared with: (model, data, companions).
BASELINES = {
    "gpt2": ([], "plain"),
    "llama": (LLAMA, "plain"),
    "gpt2_docs": (COMPANIONS, "packed"),
    "llama_docs": (LLAMA + COMPANIONS, "packed"),
}


@pytest.fixture(scope="module")
def baselines(datasets, tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            extra, data = BASELINES[name]
            save = tmp_path_factory.mktemp(name) / "ck"
            proc = run_train(common(datasets[data], save) + extra)
            train, valid = parse_log(proc.stdout)
            assert sorted(train) == list(range(1, ITERS + 1)) and sorted(valid) == [10, 20]
            assert train[ITERS][1] < train[1][1]
            cache[name] = (train, valid, read_ours(save)[1])
        return cache[name]
    return get


# name: (baseline, processes, flags). Every comm type meets each model and each other
# parallelism at least once; CP 4 with each comm type.
CASES = {
    "gpt2_cp2_p2p": ("gpt2", 2, cp(2, "p2p")),
    "gpt2_cp2_all_gather": ("gpt2", 2, cp(2, "all_gather")),
    "gpt2_cp2_a2a": ("gpt2", 2, cp(2, "a2a")),
    "gpt2_cp4_p2p": ("gpt2", 4, cp(4, "p2p")),
    "gpt2_cp4_a2a": ("gpt2", 4, cp(4, "a2a")),
    "gpt2_cp2_tp2_sp_p2p": ("gpt2", 4, cp(2, "p2p") + TP2_SP),
    "gpt2_cp2_pp2_all_gather": ("gpt2", 4, cp(2, "all_gather") + PP2),
    "gpt2_cp2_dp2_distopt_a2a": ("gpt2", 4, cp(2, "a2a") + ["--use-distributed-optimizer"]),
    "gpt2_cp2_vpp2_p2p": ("gpt2", 4, cp(2, "p2p") + VPP),
    "gpt2_cp2_tp2_dp2_sp_distopt_all_gather": (
        "gpt2", 8, cp(2, "all_gather") + TP2_SP + ["--use-distributed-optimizer"]),
    "llama_cp2_p2p": ("llama", 2, cp(2, "p2p")),
    "llama_cp2_a2a": ("llama", 2, cp(2, "a2a")),
    "llama_cp4_all_gather": ("llama", 4, cp(4, "all_gather")),
    "llama_cp2_tp2_sp_all_gather": ("llama", 4, cp(2, "all_gather") + TP2_SP),
    "llama_cp2_vpp2_a2a": ("llama", 4, cp(2, "a2a") + VPP),
    "llama_cp2_dp2_distopt_p2p": ("llama", 4, cp(2, "p2p") + ["--use-distributed-optimizer"]),
    "llama_cp2_pp2_p2p": ("llama", 4, cp(2, "p2p") + PP2),
    "gpt2_docs_cp2_p2p": ("gpt2_docs", 2, cp(2, "p2p")),
    "gpt2_docs_cp4_all_gather": ("gpt2_docs", 4, cp(4, "all_gather")),
    "gpt2_docs_cp2_tp2_sp_a2a": ("gpt2_docs", 4, cp(2, "a2a") + TP2_SP),
    "llama_docs_cp2_a2a": ("llama_docs", 2, cp(2, "a2a")),
    "llama_docs_cp2_pp2_p2p": ("llama_docs", 4, cp(2, "p2p") + PP2),
}


def assert_same_run(proc, save, base):
    train, valid = parse_log(proc.stdout)
    base_train, base_valid, base_weights = base
    assert sorted(train) == sorted(base_train)
    for it, (lr, loss, norm, _) in base_train.items():
        assert train[it][0] == lr
        assert train[it][1] == pytest.approx(loss, rel=1e-5), f"iteration {it}"
        assert train[it][2] == pytest.approx(norm, rel=1e-3, abs=2e-3), f"grad norm {it}"
    for it, loss in base_valid.items():
        assert valid[it] == pytest.approx(loss, rel=1e-5), f"validation {it}"
    _, weights = read_ours(save)
    for kind in ("", "main_param.", "exp_avg.", "exp_avg_sq."):
        weights[kind].pop("output_layer.weight", None)  # PP's tied copy, when tied
        base = dict(base_weights[kind])
        base.pop("output_layer.weight", None)
        assert base.keys() == weights[kind].keys()
        for name, want in base.items():
            np.testing.assert_allclose(weights[kind][name], want, rtol=1e-3, atol=2e-5,
                                       err_msg=f"{kind}{name}")


@pytest.mark.parametrize("case", list(CASES))
def test_context_parallel_matches_one_process(case, datasets, baselines, tmp_path):
    base_name, nproc, flags = CASES[case]
    extra, data = BASELINES[base_name]
    save = tmp_path / "ck"
    proc = run_train(common(datasets[data], save) + extra + flags, nproc=nproc)
    assert_same_run(proc, save, baselines(base_name))
    # The report names context parallelism's communication, per rank.
    comm = flags[flags.index("--cp-comm-type") + 1]
    assert proc.stdout.count(f"context-parallel communication ({comm}):") == nproc
    assert "cp 1 |" in proc.stdout


def test_companions_on_packed_data_differ_from_plain_attention(datasets, baselines, tmp_path):
    """Masked documents, reset positions and no EOD targets train another model than plain
    packing does (what they compute is tests/trainer/document_mask_test.cc's)."""
    plain = parse_log(run_train(common(datasets["packed"], tmp_path / "ck")).stdout)[0]
    docs = baselines("gpt2_docs")[0]
    assert all(plain[it][1] != docs[it][1] for it in docs)


def test_checkpoint_saved_at_cp2_resumes_in_one_process(datasets, baselines, tmp_path):
    """The model is replicated over CP: one CP rank writes, and the checkpoint is the same
    whatever the CP size; one process resumes it and continues the one-process run."""
    base_train = baselines("llama")[0]
    run_train(common(datasets["plain"], tmp_path / "a") + LLAMA + cp(2, "p2p")
              + ["--exit-interval", ITERS // 2], nproc=2)
    rest = run_train(common(datasets["plain"], tmp_path / "b") + LLAMA
                     + ["--load", tmp_path / "a"])
    train, _ = parse_log(rest.stdout)
    assert sorted(train) == list(range(ITERS // 2 + 1, ITERS + 1))
    for it in train:
        assert train[it][1] == pytest.approx(base_train[it][1], rel=1e-5), f"iteration {it}"


def test_bad_context_parallel_settings_are_refused(datasets, tmp_path):
    proc = run_train(common(datasets["plain"], tmp_path / "ck") + cp(2, "a2a") + LLAMA + TP2_SP,
                     nproc=4, ok=False)
    assert proc.returncode == 2
    assert "--cp-comm-type a2a splits each TP rank's query groups over CP" in proc.stderr
    proc = run_train(common(datasets["plain"], tmp_path / "ck") + cp(3, "p2p"), nproc=3, ok=False)
    assert "is not divisible by 2 x CP 3" in proc.stderr
