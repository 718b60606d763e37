"""GPT sample order: Leantron's index arrays and sample tokens against numpy's RandomState and
Megatron-Core's GPTDataset / BlendedDataset / BlendedMegatronDatasetBuilder algorithms
(megatron_data_ref.py; megatron-core itself needs torch, which CI does not install). Arrays are
exported by `inspect dataset --export-dir`."""
import math
import re

import numpy as np
import pytest

from megatron_data_ref import (LoadedDataset, NumpyIndexedDatasetBuilder, blending_indices,
                               gpt_indices, gpt_sample, normalize, split_ranges)
from tiktoken_ref import run_tool

SPLITS = {"train": 0, "valid": 1, "test": 2}


def make_dataset(prefix, documents, seed, max_len=300, dtype=np.uint16):
    rng = np.random.default_rng(seed)
    b = NumpyIndexedDatasetBuilder(prefix, dtype)
    for _ in range(documents):
        n = int(rng.integers(0, max_len))
        b.add_document(rng.integers(0, 50257, size=n), [n] if n else [])
    b.finalize()
    return LoadedDataset(prefix)


def export(tmp_path, data_path, seq_length, seed, num_samples, split, split_name, count, *extra):
    out = tmp_path / f"export_{split_name}_{seed}_{seq_length}"
    out.mkdir(exist_ok=True)
    proc = run_tool("inspect", ["dataset", *data_path, "--seq-length", str(seq_length), "--seed",
                                str(seed), "--num-samples", *map(str, num_samples), "--split", split,
                                "--split-name", split_name, "--export-dir", str(out),
                                "--export-samples", str(count), *extra])
    return out, proc.stdout.decode()


def check_single(ds_ref, out, lo, hi, num_samples, seq_length, seed):
    doc, sample, shuffle, epochs, separate = gpt_indices(ds_ref.lengths, lo, hi, num_samples,
                                                         seq_length, seed)
    np.testing.assert_array_equal(np.load(out / "document_index.npy"), doc)
    np.testing.assert_array_equal(np.load(out / "sample_index.npy"), sample)
    np.testing.assert_array_equal(np.load(out / "shuffle_index.npy"), shuffle)
    samples = np.load(out / "samples.npy")
    for i in range(len(samples)):
        np.testing.assert_array_equal(samples[i], gpt_sample(ds_ref, doc, sample, shuffle, i,
                                                             seq_length))
    return epochs, separate


CASES = [
    # documents, seq_length, seed, (train, valid, test), split, split name
    (50, 64, 1234, (100, 20, 5), "969, 30, 1", "train"),   # several epochs
    (300, 32, 7, (2000, 300, 10), "80,20", "train"),       # separate final epoch
    (300, 32, 7, (2000, 300, 10), "80,20", "valid"),
    (300, 128, 99, (40, 3, 3), "1", "train"),              # one epoch, no valid/test
    (500, 16, 1, (3000, 100, 100), "7,2,1", "test"),
    (400, 16, 2024, (1180, 100, 100), "7,2,1", "train"),
    (200, 2, 5, (500, 50, 5), "949,50,1", "valid"),        # tiny sequences
]


@pytest.mark.parametrize("documents,seq_length,seed,num_samples,split,split_name", CASES)
def test_single_dataset_matches_megatron(tmp_path, documents, seq_length, seed, num_samples,
                                         split, split_name):
    prefix = str(tmp_path / "corpus")
    ds = make_dataset(prefix, documents, seed=documents + seed)
    j = SPLITS[split_name]
    lo, hi = split_ranges(split, len(ds.lengths))[j]
    out, _ = export(tmp_path, [prefix], seq_length, seed, num_samples, split, split_name, 64,
                    "--no-cache")
    check_single(ds, out, lo, hi, num_samples[j], seq_length, seed)


def test_separate_final_epoch_and_multiple_epochs_are_exercised(tmp_path):
    prefix = str(tmp_path / "corpus")
    ds = make_dataset(prefix, 300, seed=1)
    seen = set()
    for n in [10, 900, 1500, 1900, 4000]:
        out, _ = export(tmp_path, [prefix], 32, 3, (n, 0, 0), "1", "train", 16, "--no-cache")
        seen.add(check_single(ds, out, 0, len(ds.lengths), n, 32, 3))
    assert (1, False) in seen and any(s for _, s in seen) and any(e > 1 and not s for e, s in seen)


def blend_reference(datasets, weights, num_samples, split, seq_length, seed, j):
    """BlendedMegatronDatasetBuilder._build_blended_dataset_splits for split j."""
    subs = []
    if weights is not None:
        w = normalize(weights)
        target = [math.ceil(num_samples[j] * wi) for wi in w]
        buffer = [int(math.ceil(t * (1 + 0.005))) for t in target]
        size = sum(target)
    else:
        buffer = [None] * len(datasets)
    for ds, n in zip(datasets, buffer):
        lo, hi = split_ranges(split, len(ds.lengths))[j]
        subs.append(gpt_indices(ds.lengths, lo, hi, n, seq_length, seed))
    if weights is None:
        w = [len(s[2]) for s in subs]
        size = min(num_samples[j], sum(w))
    dataset_index, dataset_sample_index = blending_indices(normalize(w), size)
    return subs, dataset_index, dataset_sample_index


@pytest.mark.parametrize("weights,split_name", [
    ([0.3, 0.7], "train"),
    ([1, 2, 3], "train"),
    ([2.5, 1, 0.125], "valid"),
    (None, "train"),
    (None, "test"),
])
def test_blends_match_megatron(tmp_path, weights, split_name):
    n_datasets = 3 if weights is None else len(weights)
    prefixes = [str(tmp_path / f"corpus{k}") for k in range(n_datasets)]
    datasets = [make_dataset(p, 120 + 40 * k, seed=k, max_len=200) for k, p in enumerate(prefixes)]
    data_path = prefixes if weights is None else [x for w, p in zip(weights, prefixes)
                                                  for x in (str(w), p)]
    num_samples, split, seq_length, seed = (1500, 200, 50), "90,7,3", 24, 4321
    j = SPLITS[split_name]
    out, _ = export(tmp_path, data_path, seq_length, seed, num_samples, split, split_name, 200,
                    "--no-cache")
    subs, dataset_index, dataset_sample_index = blend_reference(
        datasets, weights, num_samples, split, seq_length, seed, j)
    np.testing.assert_array_equal(np.load(out / "dataset_index.npy"), dataset_index)
    np.testing.assert_array_equal(np.load(out / "dataset_sample_index.npy"), dataset_sample_index)
    for k, (doc, sample, shuffle, _, _) in enumerate(subs):
        np.testing.assert_array_equal(np.load(out / f"d{k}_document_index.npy"), doc)
        np.testing.assert_array_equal(np.load(out / f"d{k}_sample_index.npy"), sample)
        np.testing.assert_array_equal(np.load(out / f"d{k}_shuffle_index.npy"), shuffle)
    samples = np.load(out / "samples.npy")
    for i in range(len(samples)):
        d, k = dataset_index[i], dataset_sample_index[i]
        doc, sample, shuffle, _, _ = subs[d]
        np.testing.assert_array_equal(samples[i], gpt_sample(datasets[d], doc, sample, shuffle, k,
                                                             seq_length))


def test_index_cache_is_reused_and_gives_the_same_samples(tmp_path):
    prefix = str(tmp_path / "corpus")
    make_dataset(prefix, 200, seed=8)
    args = ([prefix], 32, 11, (700, 30, 3), "90,8,2", "train", 50)
    first, log1 = export(tmp_path, *args)
    assert "(hit)" not in log1.split("train samples")[1].splitlines()[0]
    arrays = {f: np.load(first / f) for f in ["document_index.npy", "sample_index.npy",
                                               "shuffle_index.npy", "samples.npy"]}
    second, log2 = export(tmp_path, *args)
    assert re.search(r"train samples: \d+ .*index cache .*\(hit\)", log2), log2
    for f, a in arrays.items():
        np.testing.assert_array_equal(np.load(second / f), a)
    assert list(tmp_path.glob("corpus.gpt-*.idxcache"))
