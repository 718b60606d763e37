"""libckpt's safetensors reader and writer against the reference `safetensors` package:
files it writes read back identically, our files load in it byte for byte, and every file the
reference reader rejects is rejected by ours with a message naming the file."""
import json
import re
import struct

import numpy as np
import pytest
from safetensors import SafetensorError
from safetensors.numpy import load, load_file, save, save_file

from ckpt_testlib import run, tool


def roundtrip(tmp_path, src, ok=True):
    out = tmp_path / "out.safetensors"
    return run("safetensors_roundtrip", src, out, ok=ok), out


def test_reference_files_read_back_identically(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((7,)).astype(np.float16),
        "f64": rng.standard_normal((2, 2, 2)),
        "i64": rng.integers(-5, 5, (4,), dtype=np.int64),
        "i32": rng.integers(-5, 5, (2, 3), dtype=np.int32),
        "u8": rng.integers(0, 255, (9,), dtype=np.uint8),
        "i8": rng.integers(-100, 100, (3,), dtype=np.int8),
        "bool": rng.integers(0, 2, (5,)).astype(bool),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "name with \"quotes\" \\ and ünïcode": np.ones((2,), np.float32),
    }
    src = tmp_path / "ref.safetensors"
    save_file(tensors, str(src), metadata={"format": "pt", "note": "tab\there"})
    _, out = roundtrip(tmp_path, src)
    back = load_file(str(out))
    assert set(back) == set(tensors)
    for name, array in tensors.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape, name
        assert np.array_equal(back[name], array), name
    # Our writer follows the reference layout exactly: same bytes.
    assert out.read_bytes() == src.read_bytes()


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_our_bytes_equal_reference_bytes(tmp_path, metadata):
    tensors = {"b": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.arange(3, dtype=np.int64),
               "c": np.arange(5, dtype=np.float16)}
    ref = save(tensors, metadata=metadata)
    src = tmp_path / "in.safetensors"
    src.write_bytes(ref)
    _, out = roundtrip(tmp_path, src)
    assert out.read_bytes() == ref
    (n,) = struct.unpack("<Q", ref[:8])
    assert (8 + n) % 8 == 0


def header_file(header, data=b""):
    text = header if isinstance(header, bytes) else header.encode()
    return struct.pack("<Q", len(text)) + text + data


T = '"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
INVALID = {
    "shorter_than_8": b"\x01\x02",
    "header_too_large": struct.pack("<Q", 100_000_001) + b"{}",
    "header_past_end": struct.pack("<Q", 64) + b"{}",
    "not_utf8": header_file(b'{"\xff":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
    "not_json": header_file('{"a":', b""),
    "not_object": header_file("[]"),
    "trailing_nul": header_file("{" + T + "}\0", b"\0" * 4),
    "unknown_dtype": header_file('{"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
    "negative_dim": header_file('{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', b"\0" * 4),
    "float_offset": header_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}}', b"\0" * 4),
    "three_offsets": header_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}}', b"\0" * 4),
    "missing_shape": header_file('{"a":{"dtype":"F32","data_offsets":[0,4]}}', b"\0" * 4),
    "metadata_not_string": header_file('{"__metadata__":{"k":1}}'),
    "hole": header_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8),
    "overlap": header_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                           '"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}', b"\0" * 6),
    "end_before_begin": header_file('{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}', b"\0" * 4),
    "size_mismatch": header_file('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', b"\0" * 4),
    "shape_overflow": header_file('{"a":{"dtype":"F32","shape":[4294967296,4294967296],'
                                  '"data_offsets":[0,4]}}', b"\0" * 4),
    "trailing_bytes": header_file("{" + T + "}", b"\0" * 5),
    "missing_bytes": header_file("{" + T + "}", b"\0" * 3),
    "duplicate_name": header_file("{" + T + "," + T.replace("[0,4]", "[4,8]") + "}", b"\0" * 8),
}


# What the reference reader (safetensors 0.8) says for each: the precise error, so a test can only
# pass when the reference rejects the file for the reason the case is about.
REFERENCE_ERROR = {
    "shorter_than_8": "header too small",
    "header_too_large": "header too large",
    "header_past_end": "invalid header length",
    "not_utf8": "invalid UTF-8 in header",
    "not_json": "invalid JSON in header: EOF while parsing",
    "not_object": "invalid JSON in header: invalid type: sequence",
    "trailing_nul": "invalid JSON in header: trailing characters",
    "unknown_dtype": "unknown variant `F33`",
    "negative_dim": "invalid value: integer `-1`, expected usize",
    "float_offset": "invalid type: floating point `4.0`, expected usize",
    "three_offsets": "invalid length 3, expected 2 elements",
    "missing_shape": "missing field `shape`",
    "metadata_not_string": "invalid type: integer `1`, expected a string",
    "hole": "invalid offset for tensor `a`",
    "overlap": "invalid offset for tensor `b`",
    "end_before_begin": "invalid offset for tensor `a`",
    "size_mismatch": "invalid shape, data type, or offset for tensor",
    "shape_overflow": "overflow computing buffer size",
    "trailing_bytes": "incomplete metadata, file not fully covered",
    "missing_bytes": "incomplete metadata, file not fully covered",
    "duplicate_name": "invalid offset for tensor `a`",
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_rejects_what_the_reference_rejects(tmp_path, case):
    blob = INVALID[case]
    with pytest.raises(SafetensorError, match=re.escape(REFERENCE_ERROR[case])):
        load(blob)
    src = tmp_path / f"{case}.safetensors"
    src.write_bytes(blob)
    proc, out = roundtrip(tmp_path, src, ok=False)
    assert str(src) in proc.stderr, proc.stderr
    assert not out.exists()


ACCEPTED = {
    "whitespace": header_file(" {" + T + "}  ", b"\0" * 4),
    "null_metadata": header_file('{"__metadata__":null,' + T + "}", b"\0" * 4),
    "unknown_field": header_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":[1]}}', b"\0" * 4),
    "empty": header_file("{}"),
    "scalar": header_file('{"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}', b"\0" * 8),
    "zero_size": header_file('{"z":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]}}'),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_accepts_what_the_reference_accepts(tmp_path, case):
    blob = ACCEPTED[case]
    expected = load(blob)
    src = tmp_path / f"{case}.safetensors"
    src.write_bytes(blob)
    _, out = roundtrip(tmp_path, src)
    back = load_file(str(out))
    assert set(back) == set(expected)
    for k in expected:
        assert np.array_equal(back[k], expected[k])
