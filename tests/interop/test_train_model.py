"""The trainer's first-iteration loss equals a float64 numpy GPT-2 on the same weights and samples
(erf GELU and --openai-gelu), and training on mock data lowers the loss."""
import numpy as np
import pytest
from safetensors.numpy import load_file

from train_testlib import TINY, gpt_loss, mock_sample, parse_log, run_train


@pytest.mark.parametrize("openai_gelu", [False, True])
def test_first_loss_matches_numpy_float64(tmp_path, openai_gelu):
    seed, seq, vocab = 1234, 32, 256
    args = TINY + ["--mock-data", "--micro-batch-size", "1", "--global-batch-size", "2",
                   "--train-iters", "1", "--lr", "1e-30", "--weight-decay", "0",
                   "--hidden-dropout", "0", "--attention-dropout", "0", "--init-method-std", "0.2",
                   "--log-interval", "1", "--eval-iters", "0", "--save", tmp_path / "ck",
                   "--seed", seed]
    if openai_gelu:
        args.append("--openai-gelu")
    proc = run_train(args)
    train, _ = parse_log(proc.stdout)
    # lr 1e-30 leaves the saved weights equal to the initial ones to float32 precision.
    t = load_file(str(tmp_path / "ck" / "iter_0000001" / "mp_rank_00" / "model.safetensors"))
    losses = []
    for i in range(2):
        text = mock_sample(i, seed, vocab, seq)
        losses.append(gpt_loss(t, 4, 4, text[:-1], text[1:], openai_gelu))
    want = np.mean(losses)
    assert train[1][1] == pytest.approx(want, rel=2e-6), (train[1][1], want)


def test_mock_training_lowers_the_loss():
    proc = run_train(TINY + ["--mock-data", "--micro-batch-size", "4", "--global-batch-size", "8",
                             "--train-iters", "60", "--lr", "3e-3", "--lr-warmup-iters", "5",
                             "--lr-decay-style", "cosine", "--log-interval", "10",
                             "--eval-interval", "30", "--eval-iters", "2"])
    train, valid = parse_log(proc.stdout)
    assert sorted(train) == [10, 20, 30, 40, 50, 60]
    assert train[60][1] < train[10][1] - 1.0
    assert sorted(valid) == [30, 60]
    assert train[60][0] == 0.0  # cosine decayed to --min-lr 0
