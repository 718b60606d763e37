"""Reference implementations, in numpy, of Megatron's data formats and sample order.

Written from the spec (../shared/specs/data.md) and Megatron-Core's algorithms, so the tests can
compare Leantron's C++ against numpy without installing torch / megatron-core. Not a test file.
"""
import struct

import numpy as np

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}
MAGIC = b"MMIDIDX\x00\x00"


class NumpyIndexedDatasetBuilder:
    """Megatron's IndexedDatasetBuilder semantics: add_item, end_document, add_document, add_index."""

    def __init__(self, prefix, dtype):
        self.prefix = prefix
        self.dtype = np.dtype(dtype)
        self.data = open(prefix + ".bin", "wb")
        self.lengths = []
        self.doc_index = [0]

    def add_item(self, values):
        a = np.array(values, dtype=self.dtype)
        self.data.write(a.tobytes(order="C"))
        self.lengths.append(a.size)

    def end_document(self):
        self.doc_index.append(len(self.lengths))

    def add_document(self, tokens, lengths):
        self.data.write(np.array(tokens, dtype=self.dtype).tobytes(order="C"))
        self.lengths.extend(lengths)
        self.doc_index.append(len(self.lengths))

    def add_index(self, prefix):
        dtype, lengths, _, doc_index = read_index(prefix + ".idx")
        assert dtype == self.dtype
        offset = len(self.lengths)
        self.lengths.extend(int(x) for x in lengths)
        self.doc_index.extend(int(x) + offset for x in doc_index[1:])
        with open(prefix + ".bin", "rb") as f:
            self.data.write(f.read())

    def finalize(self):
        self.data.close()
        pointers, current = [], 0
        for n in self.lengths:
            pointers.append(current)
            current += n * self.dtype.itemsize
        with open(self.prefix + ".idx", "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<Q", 1))
            f.write(struct.pack("<B", CODES[self.dtype]))
            f.write(struct.pack("<Q", len(self.lengths)))
            f.write(struct.pack("<Q", len(self.doc_index)))
            f.write(np.array(self.lengths, dtype=np.int32).tobytes(order="C"))
            f.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
            f.write(np.array(self.doc_index, dtype=np.int64).tobytes(order="C"))


def read_index(path):
    with open(path, "rb") as f:
        buf = f.read()
    assert buf[:9] == MAGIC
    (version,) = struct.unpack("<Q", buf[9:17])
    assert version == 1
    dtype = np.dtype(DTYPES[buf[17]])
    s, d = struct.unpack("<QQ", buf[18:34])
    lengths = np.frombuffer(buf, dtype=np.int32, count=s, offset=34)
    pointers = np.frombuffer(buf, dtype=np.int64, count=s, offset=34 + 4 * s)
    doc_index = np.frombuffer(buf, dtype=np.int64, count=d, offset=34 + 12 * s)
    return dtype, lengths, pointers, doc_index


def read_sequence(prefix, i):
    dtype, lengths, pointers, _ = read_index(prefix + ".idx")
    with open(prefix + ".bin", "rb") as f:
        f.seek(int(pointers[i]))
        return np.frombuffer(f.read(int(lengths[i]) * dtype.itemsize), dtype=dtype)


# ---------------------------------------------------------------- GPT sample order


def normalize(weights):
    w = np.array(weights, dtype=np.float64)
    return (w / np.sum(w)).tolist()


def split_ranges(split, n):
    import re

    v = list(map(float, re.findall(r"[.0-9]+", split)))
    v = v + [0.0] * (3 - len(v))
    v = normalize(v)
    ends = [0]
    for x in v:
        ends.append(ends[-1] + x)
    out = []
    for lo, hi in zip(ends[:-1], ends[1:]):
        out.append(None if hi <= lo else (int(round(lo * float(n))), int(round(hi * float(n)))))
    return out


def build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch, drop_last, extra):
    if drop_last:
        num_samples = (num_epochs * tokens_per_epoch - extra) // seq_length
    else:
        num_samples = int(np.ceil(np.float32(num_epochs * tokens_per_epoch - extra) / np.float32(seq_length)))
    out = np.zeros((num_samples + 1, 2), dtype=np.int64)
    sample, d, offset = 1, 0, 0
    while sample <= num_samples:
        remaining = seq_length + extra
        while remaining != 0:
            length = int(sizes[doc_idx[d]]) - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - extra
                remaining = 0
            else:
                if d == len(doc_idx) - 1:
                    offset = int(sizes[doc_idx[d]]) - extra
                    break
                d += 1
                offset = 0
        out[sample] = (d, offset)
        sample += 1
    return out


def gpt_indices(lengths, begin, end, num_samples, seq_length, seed, extra=1, drop_last=True):
    indices = np.arange(begin, end, dtype=np.int32)
    tokens_per_epoch = int(np.sum(lengths[indices]))
    epochs, tokens = 1, tokens_per_epoch
    if num_samples is not None:
        while tokens < num_samples * seq_length + extra:
            epochs += 1
            tokens += tokens_per_epoch
    separate = False
    if epochs > 1:
        n_sans = ((epochs - 1) * tokens_per_epoch - extra) // seq_length
        n_final = num_samples - n_sans
        per_epoch = (tokens_per_epoch - extra) // seq_length
        separate = n_final < int(0.80 * per_epoch)
    rs = np.random.RandomState(seed)

    def doc_index(e):
        d = np.mgrid[0:e, 0 : len(indices)][1]
        d[:] = indices
        d = d.reshape(-1).astype(np.int32)
        rs.shuffle(d)
        return d

    doc = doc_index(epochs) if not separate else np.concatenate((doc_index(epochs - 1), doc_index(1)))
    sample = build_sample_idx(lengths, doc, seq_length, epochs, tokens_per_epoch, drop_last, extra)
    total = sample.shape[0] - 1
    first = n_sans if separate else total
    shuffle = np.arange(first, dtype=np.uint32)
    rs.shuffle(shuffle)
    if first != total:
        rest = np.arange(first, total, dtype=np.uint32)
        rs.shuffle(rest)
        shuffle = np.concatenate((shuffle, rest))
    return doc, sample, shuffle.astype(np.int64), epochs, separate


class LoadedDataset:
    """An indexed dataset in memory, for fast sequence reads in the sample tests."""

    def __init__(self, prefix):
        self.dtype, self.lengths, self.pointers, self.doc_index = read_index(prefix + ".idx")
        self.data = np.fromfile(prefix + ".bin", dtype=np.uint8)

    def get(self, i):
        start = int(self.pointers[i])
        n = int(self.lengths[i]) * self.dtype.itemsize
        return self.data[start : start + n].view(self.dtype)


def gpt_sample(ds, doc, sample, shuffle, i, seq_length, extra=1):
    """Megatron's GPTDataset._query_document_sample_shuffle_indices: the ids of sample i."""
    j = shuffle[i]
    b, bo = sample[j]
    e, eo = sample[j + 1]
    parts = []
    if b == e:
        parts.append(ds.get(doc[b])[bo : eo + extra])
    else:
        for k in range(b, e + 1):
            seq = ds.get(doc[k])
            off = 0 if k > b else bo
            parts.append(seq[off:] if k < e else seq[off : eo + extra])
    text = np.concatenate(parts).astype(np.int64)
    if len(text) < seq_length + extra:
        text = np.concatenate([text, -np.ones(seq_length + extra - len(text), dtype=np.int64)])
    return text


def blending_indices(weights, size):
    dataset_index = np.zeros(size, dtype=np.int16)
    sample_index = np.zeros(size, dtype=np.int64)
    current = [0] * len(weights)
    for s in range(size):
        x = max(float(s), 1.0)
        errors = [w * x - c for w, c in zip(weights, current)]
        best = 0
        for d in range(1, len(weights)):
            if errors[d] > errors[best]:
                best = d
        dataset_index[s] = best
        sample_index[s] = current[best]
        current[best] += 1
    return dataset_index, sample_index
