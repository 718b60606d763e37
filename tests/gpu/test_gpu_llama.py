"""Device-machine tests of the Llama family (torch, transformers and a GPU; CI has none): tiny
random models made with transformers — Llama 3 (grouped-query), Llama 3.1 (rope scaling
"llama3"), Llama 3.2 (tied, scaled), Mistral (no sliding window) and Qwen2 (q/k/v biases) —
saved with save_pretrained, converted by `convert_hf --from-hf`, then:

- `train --finetune --train-iters 1`: the first iteration's loss is transformers' loss on the same
  tokens (the mock samples 0..3), in bf16 (`--bf16`, rel 2e-2) and in float32 on the GPU
  (`--ops-backend cuda`, rel 1e-4);
- a few training steps, `--save`, `convert_hf --to-hf`: transformers' loss of the exported folder
  on the validation samples is train's validation loss (same tolerances), and the folder names the
  class it came from.

Hidden 64, 4 heads of 16 (2 KV heads), seq 64, vocabulary 256 (NullTokenizer 255 + EOD). Over 64
positions Llama 3.1's scaling (which changes only wavelengths above 2048) moves a random model's
loss by less than 1e-4: for the float32 comparison the query and key rows of the lowest-frequency
rotary pairs are scaled up (LOW_FREQUENCY_GAIN), which makes the loss of the scaled families
differ from the unscaled one by 27x the float32 tolerance (measured with transformers 5.17 and
torch 2.11; checked by its own test below). The bf16 comparison keeps plain random weights, whose
tolerance no rope scaling could reach anyway.
    python3 -m pytest -v tests/gpu/test_gpu_llama.py
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))
from train_testlib import BIN, mock_sample, parse_log, run_train  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
# transformers 5 takes rope_theta and the scaling in one rope_parameters dict.
TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5

SEED, SEQ, VOCAB, GBS = 1234, 64, 256, 4
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, POSITIONS = 64, 4, 2, 16, 128, 2, 64
LOW_FREQUENCY_GAIN = 16.0
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
FAMILIES = {
    "llama3": dict(model_type="llama", theta=500000.0, tied=False),
    "llama31": dict(model_type="llama", theta=500000.0, tied=False, scaling=LLAMA3_SCALING),
    "llama32": dict(model_type="llama", theta=500000.0, tied=True,
                    scaling=dict(LLAMA3_SCALING, factor=32.0)),
    "mistral": dict(model_type="mistral", theta=1000000.0, tied=False),
    "qwen2": dict(model_type="qwen2", theta=1000000.0, tied=True),
}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM"}
# backend: train flags, relative tolerance of the loss, gain of the low-frequency q/k rows.
BACKENDS = {"bf16": (["--bf16"], 2e-2, 1.0),
            "cuda-float32": (["--ops-backend", "cuda"], 1e-4, LOW_FREQUENCY_GAIN)}


def hf_config(family, scaled=True):
    spec = FAMILIES[family]
    scaling = spec.get("scaling") if scaled else None
    kwargs = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN,
                  num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  num_key_value_heads=KV_HEADS, max_position_embeddings=POSITIONS,
                  rms_norm_eps=1e-5, tie_word_embeddings=spec["tied"], initializer_range=0.1,
                  attention_dropout=0.0, bos_token_id=0, eos_token_id=VOCAB - 1)
    if TRANSFORMERS_5:
        kwargs["rope_parameters"] = dict(scaling or {"rope_type": "default"},
                                         rope_theta=spec["theta"])
    else:
        kwargs.update(rope_theta=spec["theta"], rope_scaling=dict(scaling) if scaling else None)
    if spec["model_type"] != "qwen2":  # Qwen2's config has no head_dim; hidden/heads is 16
        kwargs["head_dim"] = HEAD_DIM
    if spec["model_type"] == "mistral":
        kwargs["sliding_window"] = None  # MistralConfig's default is a 4096 window
    if spec["model_type"] == "qwen2":
        kwargs["use_sliding_window"] = False
    return transformers.AutoConfig.for_model(spec["model_type"], **kwargs)


def make_hf(path, family, low_frequency_gain):
    """A random model of the family (on the CPU, so the same on every machine) with non-trivial
    norms and biases, the q/k rows of the rotary pairs i >= head_dim/4 (the lowest frequencies,
    in rotate-half layout dims [d/4, d/2) and [3d/4, d)) times `low_frequency_gain`; saved as
    float32."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(family)).float().eval()
    gain = torch.ones(HEAD_DIM)
    quarter = HEAD_DIM // 4
    gain[quarter:2 * quarter] = low_frequency_gain
    gain[3 * quarter:] = low_frequency_gain
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.view(-1, HEAD_DIM, p.shape[-1]).mul_(gain[None, :, None])
            if name.endswith(("q_proj.bias", "k_proj.bias")):
                p.view(-1, HEAD_DIM).mul_(gain[None, :])
    model.save_pretrained(path, safe_serialization=True)
    return model


def hf_loss(model, first_sample):
    """transformers' mean cross-entropy (float64) on GBS mock samples from `first_sample`."""
    samples = np.stack([mock_sample(first_sample + i, SEED, VOCAB, SEQ) for i in range(GBS)])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(samples[:, :-1])).logits.double()
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                   torch.tensor(samples[:, 1:]).reshape(-1)))


def float64(model):
    """A float64 copy (the model itself stays as saved)."""
    copy = transformers.AutoModelForCausalLM.from_config(model.config).eval()
    copy.load_state_dict(model.state_dict())
    return copy.double()


def convert(hf_dir, ck):
    proc = subprocess.run([str(BIN / "convert_hf"), "--from-hf", str(hf_dir), "--save", str(ck)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def train_flags(family):
    spec = FAMILIES[family]
    flags = ["--num-layers", LAYERS, "--hidden-size", HIDDEN, "--num-attention-heads", HEADS,
             "--group-query-attention", "--num-query-groups", KV_HEADS, "--kv-channels", HEAD_DIM,
             "--ffn-hidden-size", FFN, "--seq-length", SEQ, "--max-position-embeddings", POSITIONS,
             "--normalization", "RMSNorm", "--norm-epsilon", "1e-5", "--swiglu",
             "--position-embedding-type", "rope", "--rotary-base", spec["theta"],
             "--disable-bias-linear", "--tokenizer-type", "NullTokenizer",
             "--vocab-size", VOCAB - 1, "--mock-data", "--micro-batch-size", 2,
             "--global-batch-size", GBS, "--hidden-dropout", 0, "--attention-dropout", 0,
             "--log-interval", 1, "--seed", SEED]
    if spec.get("scaling"):
        flags += ["--use-rope-scaling", "--rope-scaling-factor", spec["scaling"]["factor"]]
    if spec["model_type"] == "qwen2":
        flags.append("--add-qkv-bias")
    if not spec["tied"]:
        flags.append("--untie-embeddings-and-output-weights")
    return flags


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_converted_family_gives_transformers_first_loss(tmp_path, family, backend):
    flags, tolerance, gain = BACKENDS[backend]
    model = make_hf(tmp_path / "hf", family, gain)
    convert(tmp_path / "hf", tmp_path / "ck")
    proc = run_train(train_flags(family) + flags + [
        "--load", tmp_path / "ck", "--finetune", "--train-iters", 1, "--lr", "1e-12",
        "--min-lr", "0", "--eval-iters", 0])
    train, _ = parse_log(proc.stdout)
    expected = hf_loss(float64(model), 0)
    print(f"{family} {backend}: transformers {expected:.6f}, train {train[1][1]:.6f}")
    assert train[1][1] == pytest.approx(expected, rel=tolerance)


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_trained_family_exports_to_transformers(tmp_path, family, backend):
    flags, tolerance, gain = BACKENDS[backend]
    make_hf(tmp_path / "hf", family, gain)
    convert(tmp_path / "hf", tmp_path / "ck")
    iters = 3
    proc = run_train(train_flags(family) + flags + [
        "--load", tmp_path / "ck", "--finetune", "--train-iters", iters, "--lr", "1e-3",
        "--eval-interval", iters, "--eval-iters", 1, "--save", tmp_path / "tuned"])
    _, valid = parse_log(proc.stdout)
    out = subprocess.run([str(BIN / "convert_hf"), "--to-hf", "--load", str(tmp_path / "tuned"),
                          "--save", str(tmp_path / "out")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURES[FAMILIES[family]["model_type"]]]
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    expected = hf_loss(exported.eval().double(), 1000003)  # the mock validation samples
    print(f"{family} {backend}: validation loss train {valid[iters]:.6f}, "
          f"transformers on the export {expected:.6f}")
    assert valid[iters] == pytest.approx(expected, rel=tolerance)


@pytest.mark.parametrize("family", [f for f in FAMILIES if FAMILIES[f].get("scaling")])
def test_rope_scaling_changes_the_loss_measurably(tmp_path, family):
    """The power of the float32 comparison above: without the scaling the same weights give a
    loss at least 5 float32 tolerances away (else a trainer ignoring it would pass)."""
    _, tolerance, gain = BACKENDS["cuda-float32"]
    model = make_hf(tmp_path / "hf", family, gain)
    unscaled = transformers.AutoModelForCausalLM.from_config(hf_config(family, scaled=False))
    unscaled.load_state_dict(model.state_dict())
    scaled_loss = hf_loss(float64(model), 0)
    unscaled_loss = hf_loss(unscaled.eval().double(), 0)
    gap = abs(scaled_loss - unscaled_loss) / scaled_loss
    print(f"{family}: loss {scaled_loss:.6f} scaled, {unscaled_loss:.6f} unscaled (rel {gap:.2e})")
    assert gap > 5 * tolerance, "the scaling hardly shows: change LOW_FREQUENCY_GAIN"
