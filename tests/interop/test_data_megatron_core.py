"""Leantron's GPT samples and indexed files against Megatron-Core's own dataset code, run
without torch.

Opt-in: set MEGATRON_LM_DIR to a checkout of NVIDIA/Megatron-LM (pybind11 and a C++ compiler
needed). The test copies megatron/core/datasets from that checkout into a temporary overlay at run
time (nothing of Megatron's is committed here), compiles its helpers.cpp, stands in minimal
modules for torch and for the few megatron.core modules the datasets import (logging, npy loading,
the tokenizer base class), then builds GPTDataset / BlendedDataset splits with
BlendedMegatronDatasetBuilder and compares every sample, and the index arrays, with `inspect
dataset --export-dir`; and writes and merges indexed datasets of every dtype with its
IndexedDatasetBuilder, against the numpy builder and merge_datasets. Without MEGATRON_LM_DIR it is skipped (CI has no Megatron checkout).
"""
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

from megatron_data_ref import NumpyIndexedDatasetBuilder
from tiktoken_ref import run_tool

MEGATRON = os.environ.get("MEGATRON_LM_DIR")
pytestmark = pytest.mark.skipif(not MEGATRON, reason="set MEGATRON_LM_DIR to a Megatron-LM checkout")

TORCH_STUB = '''
import sys, types
class _Any:
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k): return _Any()
    def __getattr__(self, n): return _Any()
    def __or__(self, o): return self
    def __ror__(self, o): return self
    def __getitem__(self, k): return self
Tensor = dtype = device = _Any
distributed = types.ModuleType("torch.distributed")
distributed.is_initialized = lambda: False
distributed.get_rank = lambda *a, **k: 0
distributed.barrier = lambda *a, **k: None
sys.modules["torch.distributed"] = distributed
utils = types.ModuleType("torch.utils"); sys.modules["torch.utils"] = utils
data = types.ModuleType("torch.utils.data"); data.Dataset = object; utils.data = data
sys.modules["torch.utils.data"] = data
__version__ = "2.5.0"
def __getattr__(name): return _Any()
'''


@pytest.fixture(scope="module")
def megatron(tmp_path_factory):
    overlay = tmp_path_factory.mktemp("overlay")
    src = pathlib.Path(MEGATRON) / "megatron" / "core"
    core = overlay / "megatron" / "core"
    shutil.copytree(src / "datasets", core / "datasets")
    shutil.copy(src / "msc_utils.py", core / "msc_utils.py")
    (overlay / "megatron" / "__init__.py").write_text("")
    (core / "__init__.py").write_text("")
    (core / "utils.py").write_text(
        "def log_single_rank(logger, *args, rank=0, **kwargs):\n    logger.log(*args, **kwargs)\n")
    (core / "safe_globals.py").write_text(
        "import numpy\ndef safe_numpy_load(path, **kw):\n    return numpy.load(path, **kw)\n")
    (core / "tokenizers").mkdir()
    (core / "tokenizers" / "__init__.py").write_text("class MegatronTokenizerBase: pass\n")
    (overlay / "torch").mkdir()
    (overlay / "torch" / "__init__.py").write_text(TORCH_STUB)
    pybind11 = pytest.importorskip("pybind11")
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    subprocess.run(["c++", "-O2", "-shared", "-fPIC", "-std=c++17", f"-I{pybind11.get_include()}",
                    f"-I{sysconfig.get_paths()['include']}", str(core / "datasets" / "helpers.cpp"),
                    "-o", str(core / "datasets" / f"helpers_cpp{ext}")], check=True)
    sys.path.insert(0, str(overlay))
    from megatron.core.datasets.blended_dataset import BlendedDataset
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    return BlendedDataset, BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig


class Tokenizer:  # what GPTDatasetConfig asks of a tokenizer here
    pad, eod, eos, vocab_size = -1, 50256, 50256, 50257
    special_tokens_dict = {}
    unique_identifiers = {"class": "Tokenizer"}


def make(prefix, docs, seed):
    rng = np.random.default_rng(seed)
    b = NumpyIndexedDatasetBuilder(prefix, np.uint16)
    for _ in range(docs):
        n = int(rng.integers(0, 300))
        b.add_document(rng.integers(0, 50257, size=n), [n] if n else [])
    b.finalize()


# Megatron loops forever on a split that rounds to no sequence, so every split here has some.
CASES = [
    (1200, 64, 1234, [100, 20, 5], "969, 30, 1", None),
    (300, 32, 7, [2000, 300, 10], "80,20", None),
    (300, 128, 99, [40, 3, 3], "1", None),
    (500, 16, 1, [3000, 100, 100], "7,2,1", None),
    (400, 16, 2024, [1180, 100, 100], "7,2,1", None),
    (200, 24, 4321, [1500, 200, 50], "90,7,3", [0.3, 0.7]),
    (200, 24, 4321, [1500, 200, 50], "90,7,3", [1, 2, 3]),
    (200, 24, 4321, [1500, 200, 50], "90,7,3", [2.5, 1, 0.125]),
    (200, 24, 55, [1500, 200, 50], "90,7,3", "unweighted"),
    (200, 24, 56, [700, 20, 5], "98,2", [1.0]),
]


@pytest.mark.parametrize("docs,seq,seed,sizes,split,weights", CASES)
def test_samples_equal_megatron_core(tmp_path, megatron, docs, seq, seed, sizes, split, weights):
    BlendedDataset, Builder, GPTDataset, GPTDatasetConfig = megatron
    n = 1 if weights is None else 3 if weights == "unweighted" else len(weights)
    prefixes = [str(tmp_path / f"corpus{i}") for i in range(n)]
    for i, p in enumerate(prefixes):
        make(p, docs + 40 * i, seed=seed + i)
    w = None if weights in (None, "unweighted") else [float(x) for x in weights]
    config = GPTDatasetConfig(random_seed=seed, sequence_length=seq, blend=(prefixes, w), split=split,
                              reset_position_ids=False, reset_attention_mask=False,
                              eod_mask_loss=False, path_to_cache=str(tmp_path / "mcache"),
                              tokenizer=Tokenizer())
    datasets = Builder(GPTDataset, sizes, lambda: True, config).build()
    data_path = prefixes if w is None else [x for ww, p in zip(w, prefixes) for x in (str(ww), p)]
    for j, name in enumerate(["train", "valid", "test"]):
        ds = datasets[j]
        out = tmp_path / f"export_{name}"
        out.mkdir()
        proc = run_tool("inspect", ["dataset", *data_path, "--seq-length", str(seq), "--seed",
                                    str(seed), "--num-samples", *map(str, sizes), "--split", split,
                                    "--split-name", name, "--export-dir", str(out),
                                    "--export-samples", "1000000", "--no-cache"], check=False)
        if ds is None:
            assert proc.returncode == 1 and b"split is empty" in proc.stderr
            continue
        assert proc.returncode == 0, proc.stderr
        ours = np.load(out / "samples.npy")
        assert len(ours) == len(ds)
        for i in range(len(ds)):
            if isinstance(ds, BlendedDataset):
                sub = ds.datasets[ds.dataset_index[i]]
                text, _, _ = sub._query_document_sample_shuffle_indices(ds.dataset_sample_index[i])
            else:
                text, _, _ = ds._query_document_sample_shuffle_indices(i)
            np.testing.assert_array_equal(ours[i], text)
        if isinstance(ds, BlendedDataset):
            np.testing.assert_array_equal(np.load(out / "dataset_index.npy"), ds.dataset_index)
            np.testing.assert_array_equal(np.load(out / "dataset_sample_index.npy"),
                                          ds.dataset_sample_index)
        else:
            np.testing.assert_array_equal(np.load(out / "document_index.npy"), ds.document_index)
            np.testing.assert_array_equal(np.load(out / "sample_index.npy"), ds.sample_index)
            np.testing.assert_array_equal(np.load(out / "shuffle_index.npy"), ds.shuffle_index)


@pytest.mark.parametrize("code", range(1, 9))
def test_indexed_files_equal_megatron_core_builder(tmp_path, megatron, code):
    """Megatron's IndexedDatasetBuilder writes what the numpy builder writes; merge_datasets writes
    what its add_index writes; its IndexedDataset reads Leantron's merged files."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    from megatron_data_ref import DTYPES

    class AsTensor:  # add_item calls tensor.numpy()
        def __init__(self, a):
            self.a = a

        def numpy(self):
            return self.a

    dtype = DTYPES[code]
    parts = tmp_path / "parts"
    parts.mkdir()
    rng = np.random.default_rng(code)
    for name in ["b", "a"]:
        theirs = IndexedDatasetBuilder(str(parts / f"{name}.bin"), dtype=dtype)
        ours = NumpyIndexedDatasetBuilder(str(tmp_path / f"numpy_{name}"), dtype)
        for d in range(25):
            n = int(rng.integers(0, 20))
            t = rng.integers(0, 100, size=n).astype(dtype)
            if d % 3 == 0:  # sentence level
                for b in (theirs, ours):
                    b.add_item(AsTensor(t) if b is theirs else t)
                    b.add_item(AsTensor(t[:2]) if b is theirs else t[:2])
                    b.end_document()
            else:
                theirs.add_document(t, [n] if n else [])
                ours.add_document(t, [n] if n else [])
        theirs.finalize(str(parts / f"{name}.idx"))
        ours.finalize()
        for ext in [".bin", ".idx"]:
            assert (parts / f"{name}{ext}").read_bytes() == (tmp_path / f"numpy_{name}{ext}").read_bytes()
    run_tool("merge_datasets", ["--input", str(parts), "--output-prefix", str(tmp_path / "merged")])
    ref = IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=dtype)
    for name in ["a", "b"]:
        ref.add_index(str(parts / name))
    ref.finalize(str(tmp_path / "ref.idx"))
    for ext in [".bin", ".idx"]:
        assert (tmp_path / f"merged{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes()
    merged = IndexedDataset(str(tmp_path / "merged"))
    assert len(merged) == len(ref.sequence_lengths)
