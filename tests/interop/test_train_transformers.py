"""Where transformers and torch are installed (the device machine): a checkpoint trained with
TP 2 x PP 2 and exported by convert_hf --to-hf loads into transformers' GPT2LMHeadModel and gives
the trainer's validation loss. Skipped elsewhere (CI has neither)."""
import numpy as np
import pytest

from train_testlib import export_validation_samples, train_tp2pp2_and_export_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_gpt2lmheadmodel_reproduces_the_validation_loss(tmp_path):
    valid_loss = train_tp2pp2_and_export_hf(tmp_path)
    model = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf"),
                                                         torch_dtype=torch.float64).eval()
    samples = np.stack(export_validation_samples())
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(samples[:, :-1])).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             torch.tensor(samples[:, 1:]).reshape(-1))
    assert float(loss) == pytest.approx(valid_loss, rel=5e-6)
