"""Where transformers and torch are installed (the device machine): a checkpoint trained with
TP 2 x PP 2 and exported by convert_hf --to-hf loads into transformers' GPT2LMHeadModel and gives
the trainer's validation loss. Skipped elsewhere (CI has neither)."""
import numpy as np
import pytest

from train_testlib import BIN, TINY, mock_sample, parse_log, run_train

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_gpt2lmheadmodel_reproduces_the_validation_loss(tmp_path):
    import subprocess
    seed, seq, vocab, gbs = 1234, 32, 256, 4
    proc = run_train(TINY + ["--mock-data", "--openai-gelu", "--micro-batch-size", "1",
                             "--global-batch-size", gbs, "--train-iters", "6", "--lr", "3e-3",
                             "--log-interval", "6", "--eval-interval", "6", "--eval-iters", "1",
                             "--tensor-model-parallel-size", "2",
                             "--pipeline-model-parallel-size", "2", "--save", tmp_path / "ck",
                             "--seed", seed], nproc=4)
    _, valid = parse_log(proc.stdout)
    subprocess.run([str(BIN / "convert_hf"), "--to-hf", "--load", str(tmp_path / "ck"),
                    "--save", str(tmp_path / "hf")], check=True, capture_output=True)
    model = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf"),
                                                         torch_dtype=torch.float64).eval()
    samples = np.stack([mock_sample(i + 1000003, seed, vocab, seq) for i in range(gbs)])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(samples[:, :-1])).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             torch.tensor(samples[:, 1:]).reshape(-1))
    assert float(loss) == pytest.approx(valid[6], rel=5e-6)
