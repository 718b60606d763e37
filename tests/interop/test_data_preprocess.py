"""preprocess_data against a Python peer that does what Megatron's tools/preprocess_data.py does
(json.loads, the GPT-2 tokenizer via tiktoken, Megatron's builder semantics in numpy): the same
bytes, for any worker count and input compression; and its behaviour on bad or interrupted input."""
import glob
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from megatron_data_ref import NumpyIndexedDatasetBuilder
from tiktoken_ref import BIN, reference, run_tool, vocab_args


def real_paragraphs():
    """Human-written text shipped by Debian (licences are always installed)."""
    paragraphs = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                paragraphs += [p for p in f.read().split("\n\n") if p.strip()]
    return paragraphs


def corpus(n=600, seed=0):
    rng = np.random.default_rng(seed)
    paragraphs = real_paragraphs() or ["Plain text."]
    extra = ["Grüße aus Köln. ", "日本語の文です。", "<|endoftext|>", "  \n\t", "émoji 🙂 ", "", "1234"]
    lines = []
    for d in range(n):
        text = paragraphs[d % len(paragraphs)] + "".join(
            extra[i] for i in rng.integers(0, len(extra), size=int(rng.integers(0, 4))))
        if d % 13 == 5:
            text = ""
        doc = {"text": text, "title": f"Document {d}", "meta": {"n": d}}
        if d % 11 == 2:
            doc["text"] = [text, "", "Another sentence."]
        lines.append(json.dumps(doc, ensure_ascii=bool(d % 2)))
    return lines


def python_peer(lines, prefix, keys, append_eod, allowed_special=()):
    """Megatron's Encoder.encode + IndexedDatasetBuilder.add_document, with tiktoken."""
    enc = reference()
    builders = {k: NumpyIndexedDatasetBuilder(f"{prefix}_{k}_document", np.uint16) for k in keys}
    for line in lines:
        if not line.strip():
            continue
        data = json.loads(line)
        for key in keys:
            text = data[key]
            sentences = text if isinstance(text, list) else [text]
            doc_ids, lens = [], []
            for sentence in sentences:
                ids = enc.encode(sentence, allowed_special=set(allowed_special), disallowed_special=())
                if ids:
                    doc_ids.extend(ids)
                    lens.append(len(ids))
            if doc_ids and append_eod:
                doc_ids.append(50256)
                lens[-1] += 1
            builders[key].add_document(doc_ids, lens)
    for b in builders.values():
        b.finalize()


def preprocess(inp, prefix, *extra, check=True):
    return run_tool("preprocess_data", ["--input", *([inp] if isinstance(inp, str) else inp),
                                        "--output-prefix", prefix, *vocab_args(), *extra],
                    check=check)


def same_files(a, b, keys=("text",)):
    for k in keys:
        for ext in [".bin", ".idx"]:
            fa, fb = f"{a}_{k}_document{ext}", f"{b}_{k}_document{ext}"
            with open(fa, "rb") as x, open(fb, "rb") as y:
                if x.read() != y.read():
                    return False
    return True


@pytest.mark.parametrize("append_eod", [True, False])
@pytest.mark.parametrize("workers", [1, 3])
def test_matches_python_peer(tmp_path, append_eod, workers):
    lines = corpus()
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    keys = ["text", "title"]
    python_peer(lines, str(tmp_path / "ref"), keys, append_eod)
    preprocess(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), "--json-keys", *keys,
               "--workers", str(workers), *(["--append-eod"] if append_eod else []))
    assert same_files(str(tmp_path / "out"), str(tmp_path / "ref"), keys)


def test_eod_in_text_special_matches_tiktoken_allowed_special(tmp_path):
    lines = corpus(200, seed=3)
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    python_peer(lines, str(tmp_path / "ref"), ["text"], True, allowed_special=("<|endoftext|>",))
    preprocess(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), "--append-eod",
               "--eod-in-text", "special")
    assert same_files(str(tmp_path / "out"), str(tmp_path / "ref"))


def test_compressed_inputs_globs_and_directories_give_the_same_output(tmp_path):
    lines = corpus(300, seed=5)
    half = len(lines) // 2
    d = tmp_path / "data"
    d.mkdir()
    (d / "part1.jsonl").write_text("\n".join(lines[:half]) + "\n", encoding="utf-8")
    with gzip.open(d / "part2.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(lines[half:]))  # no final newline
    python_peer(lines, str(tmp_path / "ref"), ["text"], True)
    preprocess(str(d), str(tmp_path / "dir"), "--append-eod", "--workers", "2")
    assert same_files(str(tmp_path / "dir"), str(tmp_path / "ref"))
    preprocess(str(d / "part*"), str(tmp_path / "glob"), "--append-eod")
    assert same_files(str(tmp_path / "glob"), str(tmp_path / "ref"))
    if shutil.which("zstd"):
        subprocess.run(["zstd", "-q", str(d / "part1.jsonl")], check=True)
        os.remove(d / "part1.jsonl")
        preprocess([str(d / "part1.jsonl.zst"), str(d / "part2.jsonl.gz")], str(tmp_path / "zst"),
                   "--append-eod")
        assert same_files(str(tmp_path / "zst"), str(tmp_path / "ref"))
        # Standard input: a decompressor piped in front.
        with subprocess.Popen(["zstdcat", str(d / "part1.jsonl.zst")], stdout=subprocess.PIPE) as z:
            subprocess.run([str(BIN / "preprocess_data"), "--input", "-", str(d / "part2.jsonl.gz"),
                            "--output-prefix", str(tmp_path / "stdin"), "--append-eod",
                            *vocab_args()], stdin=z.stdout, check=True, capture_output=True)
        assert same_files(str(tmp_path / "stdin"), str(tmp_path / "ref"))
        packed = (d / "part1.jsonl.zst").read_bytes()
        (d / "part1.jsonl.zst").write_bytes(packed[: len(packed) // 2])
        proc = preprocess(str(d / "part1.jsonl.zst"), str(tmp_path / "cut"), check=False)
        assert proc.returncode == 1 and b"part1.jsonl.zst" in proc.stderr, proc.stderr
        assert not list(tmp_path.glob("cut_*"))


def test_progress_lines_in_megatrons_format(tmp_path):
    (tmp_path / "in.jsonl").write_text("\n".join(corpus(250)) + "\n", encoding="utf-8")
    proc = preprocess(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), "--log-interval", "100")
    progress = [l for l in proc.stderr.decode().splitlines() if l.startswith("Processed")]
    assert len(progress) == 2
    for line, count in zip(progress, [100, 200]):
        assert re.fullmatch(rf"Processed {count} documents \([0-9.]+ docs/s, [0-9.]+ MB/s\)\.", line)


BAD = [
    ('{"text": "unterminated}', "malformed JSON"),
    ('{"body": "x"}', 'missing key "text"'),
    ('{"text": null}', "not a string"),
    ('{"text": ["a", {"b": 1}]}', "non-string"),
    (b'{"text": "\xc3\x28"}', "invalid UTF-8"),
]


@pytest.mark.parametrize("line,message", BAD)
def test_bad_input_is_an_error_naming_file_and_line_or_skipped(tmp_path, line, message):
    good = b'{"text": "fine"}\n'
    raw = line if isinstance(line, bytes) else line.encode()
    (tmp_path / "in.jsonl").write_bytes(good * 4 + raw + b"\n" + good)
    proc = preprocess(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), check=False)
    assert proc.returncode == 1
    err = proc.stderr.decode()
    assert "in.jsonl:5:" in err and message in err, err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]
    proc = preprocess(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), "--skip-invalid")
    assert "Skipped 1 invalid lines" in proc.stderr.decode()
    assert "Done: 5 documents" in proc.stderr.decode()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_interrupted_run_leaves_nothing_that_looks_valid(tmp_path, sig):
    # Input through a FIFO that stays open: the run is surely mid-way when the signal comes.
    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)
    cmd = [str(BIN / "preprocess_data"), "--input", str(fifo), "--output-prefix",
           str(tmp_path / "out"), "--append-eod", "--log-interval", "1000", *vocab_args()]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    writer = open(fifo, "w", encoding="utf-8")
    lines = corpus(3000, seed=9)
    writer.write("\n".join(lines) + "\n")
    writer.flush()
    # Wait until the tool has written documents (its progress line says so), then interrupt.
    seen = proc.stderr.readline()
    assert seen.startswith(b"Processed 1000 documents"), seen
    proc.send_signal(sig)
    proc.wait(timeout=60)
    writer.close()
    assert proc.returncode == -sig
    names = sorted(os.listdir(tmp_path))
    assert "out_text_document.idx" not in names and "out_text_document.bin" not in names, names
    if sig == signal.SIGKILL:  # only uniquely named temporaries can remain
        assert all(".tmp-" in n for n in names if n != "in.jsonl"), names
    else:  # a catchable signal also removes them
        assert names == ["in.jsonl"], names


def test_tiktoken_rank_file_gives_the_same_output(tmp_path):
    import base64

    from tiktoken_ref import vocab_dir

    rank_file = vocab_dir() / "gpt2.tiktoken"
    if not rank_file.exists():  # write one from the reference's ranks (tiktoken's file format)
        rank_file = tmp_path / "gpt2.tiktoken"
        ranks = reference()._mergeable_ranks
        rank_file.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n"
                                     for t, r in sorted(ranks.items(), key=lambda x: x[1])))
    lines = corpus(150, seed=2)
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    python_peer(lines, str(tmp_path / "ref"), ["text"], True)
    run_tool("preprocess_data", ["--input", str(tmp_path / "in.jsonl"), "--output-prefix",
                                 str(tmp_path / "out"), "--tiktoken-file", str(rank_file),
                                 "--append-eod"])
    assert same_files(str(tmp_path / "out"), str(tmp_path / "ref"))
