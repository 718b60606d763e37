"""Indexed datasets written by a numpy implementation of Megatron's builder are read and merged
by Leantron byte for byte, and Leantron's files are read back by the numpy reader."""
import os
import shutil

import numpy as np
import pytest

from megatron_data_ref import DTYPES, NumpyIndexedDatasetBuilder, read_index, read_sequence
from tiktoken_ref import run_tool


def write_dataset(prefix, dtype, seed, documents=40):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
    hi = min(info.max, 50000) if info else 1000
    lo = max(info.min, -1000) if info else -1000
    b = NumpyIndexedDatasetBuilder(prefix, dtype)
    for d in range(documents):
        if d % 7 == 3:
            b.end_document()  # an empty document
            continue
        if d % 3 == 0:  # sentence level: several sequences, one boundary
            for _ in range(int(rng.integers(1, 4))):
                b.add_item(rng.integers(lo, hi, size=int(rng.integers(0, 20))).astype(dtype))
            b.end_document()
        else:
            n = int(rng.integers(1, 30))
            b.add_document(rng.integers(lo, hi, size=n).astype(dtype), [n])
    b.finalize()


def summary(stdout):
    out = {}
    for line in stdout.decode().splitlines():
        if ": " in line and not line.startswith(" "):
            k, v = line.split(": ", 1)
            out[k] = v
    return out


@pytest.mark.parametrize("code", sorted(DTYPES))
def test_numpy_written_datasets_are_read_and_merged_byte_for_byte(tmp_path, code):
    dtype = DTYPES[code]
    parts = tmp_path / "parts"
    parts.mkdir()
    for i, name in enumerate(["c", "a", "b"]):
        write_dataset(str(parts / name), dtype, seed=code * 10 + i)
    for name in ["a", "b", "c"]:
        _, lengths, _, doc_index = read_index(str(parts / name) + ".idx")
        s = summary(run_tool("inspect", ["dataset", str(parts / name)]).stdout)
        assert s["dtype"] == f"{np.dtype(dtype).name} (code {code})"
        assert int(s["sequences"]) == len(lengths)
        assert int(s["documents"]) == len(doc_index) - 1
        assert int(s["tokens"]) == int(lengths.sum())

    run_tool("merge_datasets", ["--input", str(parts), "--output-prefix", str(tmp_path / "merged")])
    ref = NumpyIndexedDatasetBuilder(str(tmp_path / "ref"), dtype)
    for name in ["a", "b", "c"]:  # Megatron merges in sorted prefix order
        ref.add_index(str(parts / name))
    ref.finalize()
    for ext in [".idx", ".bin"]:
        assert (tmp_path / ("merged" + ext)).read_bytes() == (tmp_path / ("ref" + ext)).read_bytes()


def test_leantron_files_read_back_with_numpy(tmp_path):
    # The spec's worked example, through preprocess_data, read with the numpy reader.
    from tiktoken_ref import vocab_args

    (tmp_path / "in.jsonl").write_text('{"text": "Hello world"}\n{"text": ""}\n')
    run_tool("preprocess_data", ["--input", str(tmp_path / "in.jsonl"), "--output-prefix",
                                 str(tmp_path / "out"), "--append-eod", *vocab_args()])
    prefix = str(tmp_path / "out_text_document")
    assert (tmp_path / "out_text_document.bin").read_bytes() == bytes.fromhex("883ce30350c4")
    dtype, lengths, pointers, doc_index = read_index(prefix + ".idx")
    assert dtype == np.uint16 and list(lengths) == [3] and list(pointers) == [0]
    assert list(doc_index) == [0, 1, 1]
    assert list(read_sequence(prefix, 0)) == [15496, 995, 50256]


def test_corrupt_files_are_clear_errors(tmp_path):
    write_dataset(str(tmp_path / "ok"), np.uint16, seed=1)
    idx = (tmp_path / "ok.idx").read_bytes()
    bin_ = (tmp_path / "ok.bin").read_bytes()
    for cut in [0, 10, 33, 34, len(idx) // 2, len(idx) - 1]:
        (tmp_path / "bad.idx").write_bytes(idx[:cut])
        (tmp_path / "bad.bin").write_bytes(bin_)
        proc = run_tool("inspect", ["dataset", str(tmp_path / "bad")], check=False)
        assert proc.returncode == 1, cut
        assert b"bad.idx" in proc.stderr, proc.stderr
    (tmp_path / "bad.idx").write_bytes(idx)
    (tmp_path / "bad.bin").write_bytes(bin_[: len(bin_) // 2])
    proc = run_tool("inspect", ["dataset", str(tmp_path / "bad")], check=False)
    assert proc.returncode == 1 and b"bad.bin" in proc.stderr, proc.stderr
    # merge_datasets stops on the first bad input and writes nothing.
    parts = tmp_path / "parts"
    parts.mkdir()
    shutil.copy(tmp_path / "ok.idx", parts / "a.idx")
    shutil.copy(tmp_path / "ok.bin", parts / "a.bin")
    shutil.copy(tmp_path / "bad.idx", parts / "b.idx")
    shutil.copy(tmp_path / "bad.bin", parts / "b.bin")
    proc = run_tool("merge_datasets", ["--input", str(parts), "--output-prefix",
                                       str(tmp_path / "m")], check=False)
    assert proc.returncode == 1 and b"b.bin" in proc.stderr
    assert not any(p.name.startswith("m.") for p in tmp_path.iterdir()), os.listdir(tmp_path)
