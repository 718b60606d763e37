"""What the data tools do when things go wrong: nothing already written is lost (a full disk, an
output that is also an input, a directory in the way), nothing wrong is written silently, and
every failure is one clear line and a non-zero exit."""
import gzip
import json
import random
import resource
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

from failure_testlib import run_bin, small_disk, snapshot
from megatron_data_ref import NumpyIndexedDatasetBuilder
from tiktoken_ref import vocab_args

WORDS = ("data loss is what this test is about so every word here is plain english text of a "
         "small corpus that the tokenizer turns into ids").split()


def corpus(path, documents, words_per_document=60, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(documents):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS)
                                                 for _ in range(words_per_document))}) + "\n")
    return path


def preprocess(inp, prefix, *extra, preexec=None):
    return run_bin("preprocess_data", ["--input", inp, "--output-prefix", prefix, *vocab_args(),
                                       *extra], preexec=preexec)


def test_a_failed_preprocess_keeps_the_previous_pair(tmp_path):
    """A run that fails at the end (full disk while writing the .idx, the .bin complete) leaves
    the previous good .bin/.idx untouched."""
    small = corpus(tmp_path / "small.jsonl", 50)
    # One-word documents: ~0.2 MB of ids and ~1.2 MB of scratch fit, the 1.6 MB .idx does not.
    big = corpus(tmp_path / "big.jsonl", 80000, words_per_document=1, seed=1)
    with small_disk(tmp_path) as (disk, preexec):
        proc = preprocess(small, disk / "X", preexec=preexec)
        assert proc.returncode == 0, proc.stderr
        before = snapshot(disk)
        assert set(before) == {"X_text_document.bin", "X_text_document.idx"}
        proc = preprocess(big, disk / "X", preexec=preexec)
        assert proc.returncode == 1, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("preprocess_data: ") and "X_text_document" in last, proc.stderr
        assert snapshot(disk) == before  # both files as they were, no temporary left


def test_a_failed_merge_keeps_the_previous_pair(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    rng = np.random.default_rng(0)
    # b: 100000 one-token documents, so the merged .idx (2 MB) is what no longer fits.
    for name, docs in [("a", 10), ("b", 100000)]:
        b = NumpyIndexedDatasetBuilder(str(parts / name), np.uint16)
        for _ in range(docs):
            b.add_document(rng.integers(0, 50000, size=1).astype(np.uint16), [1])
        b.finalize()
    with small_disk(tmp_path) as (disk, preexec):
        only_a = tmp_path / "only_a"
        only_a.mkdir()
        for ext in (".bin", ".idx"):
            shutil.copy(parts / f"a{ext}", only_a / f"a{ext}")
        assert run_bin("merge_datasets", ["--input", only_a, "--output-prefix", disk / "m"],
                       preexec=preexec).returncode == 0
        before = snapshot(disk)
        proc = run_bin("merge_datasets", ["--input", parts, "--output-prefix", disk / "m"],
                       preexec=preexec)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.startswith("merge_datasets: ") and str(disk / "m") in proc.stderr
        assert snapshot(disk) == before


@pytest.mark.parametrize("content", [False, True])
def test_a_directory_in_the_way_is_left_alone(tmp_path, content):
    inp = corpus(tmp_path / "in.jsonl", 10)
    for ext in (".bin", ".idx"):
        way = tmp_path / f"Y_text_document{ext}"
        way.mkdir()
        if content:
            (way / "keep.txt").write_text("mine")
        proc = preprocess(inp, tmp_path / "Y")
        assert proc.returncode == 1, proc.stderr
        assert "in the way" in proc.stderr and str(way) in proc.stderr, proc.stderr
        assert "terminate" not in proc.stderr and "filesystem_error" not in proc.stderr
        assert way.is_dir() and ((way / "keep.txt").read_text() == "mine" if content else True)
        shutil.rmtree(way)
        assert not any(p.name.startswith("Y_text_document") for p in tmp_path.iterdir())


def _dataset(prefix, seed):
    rng = np.random.default_rng(seed)
    b = NumpyIndexedDatasetBuilder(str(prefix), np.uint16)
    for _ in range(5):
        n = int(rng.integers(1, 20))
        b.add_document(rng.integers(0, 50000, size=n).astype(np.uint16), [n])
    b.finalize()


def test_merge_refuses_an_output_that_is_one_of_its_inputs(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    _dataset(parts / "a", 0)
    _dataset(parts / "english_text_document", 1)
    before = snapshot(parts)
    proc = run_bin("merge_datasets", ["--input", parts, "--output-prefix",
                                      parts / "english_text_document"])
    assert proc.returncode == 1, proc.stderr
    assert "english_text_document" in proc.stderr and "input" in proc.stderr
    assert snapshot(parts) == before


@pytest.mark.parametrize("spelling", ["absolute", "relative", "dotted"])
def test_merge_rerun_into_its_input_directory_never_doubles_the_data(tmp_path, spelling):
    parts = tmp_path / "parts"
    parts.mkdir()
    _dataset(parts / "a", 0)
    _dataset(parts / "b", 1)
    first = run_bin("merge_datasets", ["--input", parts, "--output-prefix", parts / "all"])
    assert first.returncode == 0, first.stderr
    merged = snapshot(parts)
    out = {"absolute": str(parts / "all"), "relative": "parts/all",
           "dotted": "./parts/../parts/all"}[spelling]
    again = run_bin("merge_datasets", ["--input", "parts", "--output-prefix", out], cwd=tmp_path)
    assert again.returncode == 1, again.stdout + again.stderr
    assert snapshot(parts) == merged


# ------------------------------------------------------------------------------- U2: compressed input
def lines_text(n):
    return "".join(json.dumps({"text": f"line {i} of the corpus"}) + "\n" for i in range(n))


def test_a_truncated_gz_is_reported_at_the_line_it_ends_in(tmp_path):
    text = lines_text(20000).encode()
    blob = gzip.compress(text)
    cut = blob[:len(blob) // 2]
    (tmp_path / "cut.jsonl.gz").write_bytes(cut)
    complete = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(cut).count(b"\n")
    assert complete > 1000
    proc = preprocess(tmp_path / "cut.jsonl.gz", tmp_path / "out")
    assert proc.returncode == 1
    assert "truncated gzip" in proc.stderr and f"(at line {complete + 1})" in proc.stderr, \
        proc.stderr
    assert not any(p.name.startswith("out_") for p in tmp_path.iterdir())


def test_gz_trailing_garbage_and_non_gzip_are_refused_like_zst(tmp_path):
    text = lines_text(50).encode()
    (tmp_path / "garbage.jsonl.gz").write_bytes(gzip.compress(text) + b"not gzip at all\n")
    proc = preprocess(tmp_path / "garbage.jsonl.gz", tmp_path / "a")
    assert proc.returncode == 1 and "after the end of the gzip stream" in proc.stderr, proc.stderr
    (tmp_path / "plain.jsonl.gz").write_bytes(text)
    proc = preprocess(tmp_path / "plain.jsonl.gz", tmp_path / "b")
    assert proc.returncode == 1 and "not gzip data" in proc.stderr, proc.stderr
    # Members back to back (gzip a b > c) are one stream, as gzip -d reads them.
    half = len(text) // 2
    (tmp_path / "two.jsonl.gz").write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))
    (tmp_path / "plain.jsonl").write_bytes(text)
    assert preprocess(tmp_path / "two.jsonl.gz", tmp_path / "c").returncode == 0
    assert preprocess(tmp_path / "plain.jsonl", tmp_path / "d").returncode == 0
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"c_text_document{ext}").read_bytes() == \
            (tmp_path / f"d_text_document{ext}").read_bytes()


# ------------------------------------------------------------------------------- U3, H5: inspect
def inspect(*args, preexec=None):
    return run_bin("inspect", ["dataset", *map(str, args)], preexec=preexec)


def test_an_empty_dataset_says_so(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    assert preprocess(tmp_path / "empty.jsonl", tmp_path / "e").returncode == 0
    proc = inspect(tmp_path / "e_text_document", "--sample", 0, "--seq-length", 8)
    assert proc.returncode == 1
    assert "e_text_document: the dataset is empty (0 documents)" in proc.stderr, proc.stderr


@pytest.mark.parametrize("flag", ["--document", "--sample"])
def test_negative_indices_are_refused_not_ignored(tmp_path, flag):
    _dataset(tmp_path / "d", 0)
    proc = inspect(tmp_path / "d", flag, -1)
    assert proc.returncode != 0 and flag in proc.stderr, proc.stdout + proc.stderr


def test_a_damaged_index_cache_is_rebuilt(tmp_path):
    _dataset(tmp_path / "d", 0)
    args = [tmp_path / "d", "--sample", 3, "--seq-length", 8, "--num-samples", 20, 0, 0]
    first = inspect(*args)
    assert first.returncode == 0, first.stderr
    (cache,) = tmp_path.glob("d.gpt-*.idxcache")
    blob = bytearray(cache.read_bytes())
    blob[-64:] = b"\xff" * 64  # sample and shuffle indices far out of range, the key intact
    cache.write_bytes(bytes(blob))
    again = inspect(*args)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    assert cache.read_bytes() != bytes(blob)  # rewritten
    assert "(hit)" in inspect(*args).stdout


def test_a_sample_index_too_large_for_memory_is_a_clean_error(tmp_path):
    _dataset(tmp_path / "d", 0)
    proc = inspect(tmp_path / "d", "--sample", 0, "--seq-length", 8, "--num-samples",
                   100000000000, 0, 0)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "more than this machine's" in proc.stderr and "100000000000 samples" in proc.stderr


def test_a_worker_count_the_system_refuses_is_a_clean_error(tmp_path):
    inp = corpus(tmp_path / "in.jsonl", 10)

    def small_address_space():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))  # 1.5 GiB: some 100 stacks

    proc = preprocess(inp, tmp_path / "w", "--workers", 100000, preexec=small_address_space)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "cannot start thread" in proc.stderr and "--workers 100000" in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["in.jsonl"]
