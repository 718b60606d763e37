"""Writes (and reads back) PyTorch's file formats without PyTorch, for the CI tests of the C++
readers: what `torch.save` writes and what `torch.distributed.checkpoint`'s FileSystemWriter
writes. Facts from torch/serialization.py (`_save`), caffe2/serialize/inline_container.cc
(PyTorchStreamWriter: record order, 64-byte alignment through an "FB" extra field, zip64),
PyTorch's bundled miniz (local headers with zero sizes and a data descriptor, a zip64 end record
always), torch/distributed/checkpoint/{metadata,filesystem}.py.

The pickles are made by CPython's own Pickler at torch's protocol (2), with stand-ins for the few
torch objects they name (storage classes, dtypes, `torch._utils._rebuild_tensor_v2`, torch.Size,
the DCP metadata dataclasses) installed as modules named like torch's for the duration of a dump,
so the byte stream is what torch's PyTorchPickler emits for the same objects.

    t = Tensor.from_numpy(np.ones((2, 3), np.float32))
    torch_save({"model": OrderedDict(w=t)}, "model_optim_rng.pt")
    obj = torch_load("model_optim_rng.pt")          # tensors come back as LoadedTensor
"""
import argparse
import collections
import contextlib
import dataclasses
import enum
import io
import pickle
import struct
import sys
import time
import types
import uuid
import zipfile
import zlib
from pathlib import Path

import numpy as np

# ---------------------------------------------------------------- dtypes
# our name -> (torch storage class, torch dtype attribute, element size, numpy dtype or None)
DTYPES = {
    "F32": ("FloatStorage", "float32", 4, np.float32),
    "F64": ("DoubleStorage", "float64", 8, np.float64),
    "F16": ("HalfStorage", "float16", 2, np.float16),
    "BF16": ("BFloat16Storage", "bfloat16", 2, None),
    "I64": ("LongStorage", "int64", 8, np.int64),
    "I32": ("IntStorage", "int32", 4, np.int32),
    "U8": ("ByteStorage", "uint8", 1, np.uint8),
    "BOOL": ("BoolStorage", "bool", 1, np.bool_),
}
STORAGE_TO_DTYPE = {v[0]: k for k, v in DTYPES.items()}
TORCH_DTYPE_TO_DTYPE = {v[1]: k for k, v in DTYPES.items()}


def bf16_bits(array):
    """float32 values -> bfloat16 bits (uint16), round to nearest even."""
    bits = np.asarray(array, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


class Storage:
    """An untyped byte buffer several tensors may view (like Megatron's parameter buffer). `data`:
    bytes, or a StreamedData whose bytes are produced only while the archive is written."""

    def __init__(self, data, dtype, location="cpu"):
        self.data = data if isinstance(data, StreamedData) else bytes(data)
        self.dtype = dtype
        self.location = location
        assert len(self.data) % DTYPES[dtype][2] == 0

    @property
    def numel(self):
        return len(self.data) // DTYPES[self.dtype][2]


class StreamedData:
    """A record's bytes as pieces made on demand (for multi-gigabyte archives: the benchmark's
    generator): `pieces` is a function returning an iterable of bytes-like pieces that add up to
    `size` bytes."""

    def __init__(self, size, pieces):
        self.size, self.pieces = int(size), pieces

    def __len__(self):
        return self.size


class Tensor:
    """A contiguous tensor: `shape` elements of `dtype` at element `offset` of `storage`."""

    def __init__(self, storage, shape, offset=0):
        self.storage = storage
        self.shape = tuple(int(d) for d in shape)
        self.offset = offset
        assert offset + self.numel <= storage.numel

    @property
    def dtype(self):
        return self.storage.dtype

    @property
    def numel(self):
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @staticmethod
    def from_numpy(array, dtype=None, location="cpu"):
        array = np.ascontiguousarray(array)
        if dtype == "BF16":
            raw = bf16_bits(array).tobytes() if array.dtype != np.uint16 else array.tobytes()
        else:
            dtype = dtype or {np.dtype(v[3]): k for k, v in DTYPES.items() if v[3] is not None}[array.dtype]
            raw = array.astype(DTYPES[dtype][3]).tobytes()
        return Tensor(Storage(raw, dtype, location), array.shape)

    def tobytes(self):
        size = DTYPES[self.dtype][2]
        return self.storage.data[self.offset * size:(self.offset + self.numel) * size]

    def stride(self):
        strides, acc = [], 1
        for d in reversed(self.shape):
            strides.append(acc)
            acc *= d
        return tuple(reversed(strides))


# ---------------------------------------------------------------- stand-ins for torch's globals
_MODULES = {}


def _module(name):
    if name not in _MODULES:
        _MODULES[name] = types.ModuleType(name)
    return _MODULES[name]


def _export(module, obj, name=None):
    name = name or obj.__name__
    obj.__module__ = module
    obj.__qualname__ = name
    obj.__name__ = name
    setattr(_module(module), name, obj)
    return obj


class _TorchNamed:
    """torch.bfloat16, torch.strided, ...: pickled as the global torch.<name>."""
    __module__ = "torch"

    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return self.name


for _storage, _dtype, _, _ in DTYPES.values():
    _export("torch", type(_storage, (), {}))
    setattr(_module("torch"), _dtype, _TorchNamed(_dtype))
for _name in ("strided", "contiguous_format"):
    setattr(_module("torch"), _name, _TorchNamed(_name))


class Size(tuple):
    def __reduce__(self):
        return (Size, (tuple(self),))


_export("torch", Size)


def _rebuild_tensor_v2(*args):  # never called here; pickled by reference like torch's
    raise NotImplementedError


_export("torch._utils", _rebuild_tensor_v2)


class _TypedStorage:
    """What a tensor's reduce hands to the pickler; persistent_id turns it into torch's tuple."""

    def __init__(self, storage):
        self.storage = storage


def _tensor_reduce(self, protocol):
    return (_rebuild_tensor_v2, (_TypedStorage(self.storage), self.offset, tuple(self.shape),
                                 self.stride(), False, collections.OrderedDict()))


Tensor.__reduce_ex__ = _tensor_reduce

_DCP_MD = "torch.distributed.checkpoint.metadata"
_DCP_FS = "torch.distributed.checkpoint.filesystem"


@dataclasses.dataclass
class ChunkStorageMetadata:
    offsets: Size
    sizes: Size


class _MEM_FORMAT_ENCODING(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


@dataclasses.dataclass
class TensorProperties:
    dtype: object = None
    layout: object = None
    requires_grad: bool = False
    memory_format: object = None
    pin_memory: bool = False

    def __getstate__(self):  # as torch's: the memory format as an enum
        return (self.dtype, self.layout, self.requires_grad,
                _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT, self.pin_memory)


@dataclasses.dataclass
class TensorStorageMetadata:
    properties: TensorProperties
    size: Size
    chunks: list


@dataclasses.dataclass
class BytesStorageMetadata:
    pass


@dataclasses.dataclass
class StorageMeta:
    checkpoint_id: object = None
    save_id: object = None
    load_id: object = None
    modules: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Metadata:
    state_dict_metadata: dict
    planner_data: object = None
    storage_data: object = None
    storage_meta: object = None
    version: object = None


@dataclasses.dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: object = None
    index: object = dataclasses.field(hash=False, compare=False, default=None)


@dataclasses.dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int
    transform_descriptors: object = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if v is not None}


for _cls in (ChunkStorageMetadata, _MEM_FORMAT_ENCODING, TensorProperties, TensorStorageMetadata,
             BytesStorageMetadata, StorageMeta, Metadata, MetadataIndex):
    _export(_DCP_MD, _cls)
_export(_DCP_FS, _StorageInfo)
for _parent in ("torch.distributed", "torch.distributed.checkpoint"):
    _module(_parent)


@contextlib.contextmanager
def _stand_ins():
    """Installs the stand-in modules (restoring whatever was there, real torch included)."""
    saved = {name: sys.modules.get(name) for name in _MODULES}
    sys.modules.update(_MODULES)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


# ---------------------------------------------------------------- torch.save
def dos_time_date(now=None):
    t = time.localtime(now if now is not None else time.time())
    return ((t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec // 2),
            ((t.tm_year - 1980) << 9) | (t.tm_mon << 5) | t.tm_mday)


def write_torch_zip(out, archive_name, records, mtime=None):
    """records: [(name, bytes)] -> the zip PyTorchStreamWriter + miniz produce, into `out`."""
    time_, date = dos_time_date(mtime)
    start = out.tell()
    central = []
    for name, data in records:
        full = f"{archive_name}/{name}".encode()
        cursor = out.tell() - start
        size = len(data)  # bytes, or StreamedData
        big_size, big_cursor = size >= 0xFFFFFFFF, cursor >= 0xFFFFFFFF
        zip64 = b""
        if big_size or big_cursor:
            fields = (struct.pack("<QQ", size, size) if big_size else b"") + \
                     (struct.pack("<Q", cursor) if big_cursor else b"")
            zip64 = struct.pack("<HH", 1, len(fields)) + fields
        # Data 64-byte aligned: an "FB" extra field of 'Z' padding (getPadding).
        data_start = cursor + 30 + len(full) + len(zip64) + 4
        pad = (64 - data_start % 64) % 64
        extra = zip64 + b"FB" + struct.pack("<H", pad) + b"Z" * pad
        flags = 0x0800 | (0x0008 if size else 0)
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, flags, 0, time_, date, 0, 0, 0,
                              len(full), len(extra)))
        out.write(full)
        out.write(extra)
        if isinstance(data, StreamedData):
            crc, written = 0, 0
            for piece in data.pieces():
                crc = zlib.crc32(piece, crc)
                written += out.write(piece)
            assert written == size, (name, written, size)
            crc &= 0xFFFFFFFF
        else:
            crc = zlib.crc32(data) & 0xFFFFFFFF
            out.write(data)
        if size:
            out.write(struct.pack("<IIQQ" if zip64 else "<IIII", 0x08074B50, crc, size, size))
        cd_extra = b""
        if big_size or big_cursor:
            fields = (struct.pack("<QQ", size, size) if big_size else b"") + \
                     (struct.pack("<Q", cursor) if big_cursor else b"")
            cd_extra = struct.pack("<HH", 1, len(fields)) + fields
        central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0, 0, flags, 0, time_, date, crc,
                                   min(size, 0xFFFFFFFF), min(size, 0xFFFFFFFF), len(full),
                                   len(cd_extra), 0, 0, 0, 0, min(cursor, 0xFFFFFFFF)) + full + cd_extra)
    cd_offset = out.tell() - start
    cd = b"".join(central)
    out.write(cd)
    z64 = out.tell() - start
    n = len(records)
    out.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 0x002D, 0, 0, n, n, len(cd), cd_offset))
    out.write(struct.pack("<IIQI", 0x07064B50, 0, z64, 1))
    out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF),
                          min(len(cd), 0xFFFFFFFF), min(cd_offset, 0xFFFFFFFF), 0))


class _TorchPickler(pickle.Pickler):
    def __init__(self, file):
        super().__init__(file, protocol=2)
        self.storages = {}  # id(Storage) -> (key, Storage)

    def persistent_id(self, obj):
        if isinstance(obj, _TypedStorage):
            s = obj.storage
            key = self.storages.setdefault(id(s), (str(len(self.storages)), s))[0]
            storage_class = getattr(_module("torch"), DTYPES[s.dtype][0])
            return ("storage", storage_class, key, s.location, s.numel)
        return None


def torch_dump(obj, out, archive_name="archive", mtime=None):
    """Writes what torch.save(obj, f) writes into the binary stream `out`; archive_name is the
    file's stem ("archive" for a stream)."""
    buf = io.BytesIO()
    with _stand_ins():
        pickler = _TorchPickler(buf)
        pickler.dump(obj)
    records = [("data.pkl", buf.getvalue()), (".format_version", b"1"), (".storage_alignment", b"64"),
               ("byteorder", b"little")]
    records += [(f"data/{key}", s.data) for key, s in pickler.storages.values()]
    records.append(("version", b"3\n"))
    records.append((".data/serialization_id", f"{uuid.uuid4().int % 10**40:040d}".encode()))
    write_torch_zip(out, archive_name, records, mtime)


def torch_dumps(obj, archive_name="archive", mtime=None):
    """The bytes torch.save(obj, f) writes."""
    out = io.BytesIO()
    torch_dump(obj, out, archive_name, mtime)
    return out.getvalue()


def torch_save(obj, path):
    path = Path(path)
    with open(path, "wb") as f:
        torch_dump(obj, f, archive_name=path.stem)


# ---------------------------------------------------------------- torch.load (for checks)
class LoadedTensor:
    def __init__(self, dtype, shape, raw):
        self.dtype, self.shape, self.raw = dtype, tuple(shape), raw

    def numpy(self):
        """float32 for BF16, else the natural numpy dtype."""
        if self.dtype == "BF16":
            return bf16_to_f32(np.frombuffer(self.raw, np.uint16)).reshape(self.shape)
        return np.frombuffer(self.raw, DTYPES[self.dtype][3]).reshape(self.shape)

    def __repr__(self):
        return f"LoadedTensor({self.dtype}, {self.shape})"


class Placeholder:
    """Any other global, called or not: recorded, never run."""

    def __init__(self, name, args=(), state=None):
        self.name, self.args, self.state, self.items = name, args, state, {}

    def __call__(self, *args, **kwargs):
        return Placeholder(self.name, args)

    def __setstate__(self, state):
        self.state = state

    def __setitem__(self, key, value):
        self.items[key] = value

    def __repr__(self):
        return f"<{self.name}{self.args!r}>"


class _TorchUnpickler(pickle.Unpickler):
    def __init__(self, file, records):
        super().__init__(file)
        self.records = records

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            def rebuild(storage, offset, size, stride, *rest):
                dtype, raw = storage
                elem = DTYPES[dtype][2]
                numel = int(np.prod(size, dtype=np.int64)) if size else 1
                return LoadedTensor(dtype, size, raw[offset * elem:(offset + numel) * elem])
            return rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("argparse", "Namespace"):
            return argparse.Namespace
        if module == "torch" and name in STORAGE_TO_DTYPE:
            return ("storage-class", STORAGE_TO_DTYPE[name])
        if module == "torch" and name in TORCH_DTYPE_TO_DTYPE:
            return f"torch.{name}"
        if module == "torch" and name == "Size":
            return tuple
        if (module, name) in (("builtins", "set"), ("builtins", "frozenset"), ("_codecs", "encode")):
            return super().find_class(module, name)
        return Placeholder(f"{module}.{name}")

    def persistent_load(self, pid):
        kind, storage_class, key, location, numel = pid
        assert kind == "storage"
        return (storage_class[1], self.records[f"data/{key}"])


def torch_loads(blob):
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        names = z.namelist()
        prefix = names[0].split("/")[0] + "/"
        records = {n[len(prefix):]: z.read(n) for n in names}  # zipfile checks every CRC
    return _TorchUnpickler(io.BytesIO(records["data.pkl"]), records).load()


def torch_load(path):
    return torch_loads(Path(path).read_bytes())


# ---------------------------------------------------------------- torch.distributed.checkpoint
class DcpTensor:
    """A global tensor of a DCP checkpoint: its chunks, each (offsets, Tensor, rank)."""

    def __init__(self, shape, dtype, chunks):
        self.shape, self.dtype, self.chunks = tuple(shape), dtype, chunks


def write_dcp(directory, items, planner_data=None, mtime=None):
    """items: fqn -> DcpTensor | (bytes, rank). Writes __<rank>_0.distcp files and .metadata the
    way FileSystemWriter does (bytes items first in each file, then the tensor chunks, each a
    torch.save archive named "archive")."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    class _Files(dict):  # rank -> its __<rank>_0.distcp, opened on first use
        def __missing__(self, rank):
            f = self[rank] = open(directory / f"__{rank}_0.distcp", "wb")
            return f

    files = _Files()
    state_md, storage = {}, {}
    with _stand_ins():
        dtype_of = lambda d: getattr(_module("torch"), DTYPES[d][1])  # noqa: E731
        for fqn, item in items.items():
            if not isinstance(item, DcpTensor):
                blob, rank = item
                f = files[rank]
                storage[MetadataIndex(fqn)] = _StorageInfo(f"__{rank}_0.distcp", f.tell(), len(blob))
                f.write(blob)
                state_md[fqn] = BytesStorageMetadata()
        for fqn, item in items.items():
            if isinstance(item, DcpTensor):
                chunks = []
                for index, (offsets, tensor, rank) in enumerate(item.chunks):
                    f = files[rank]
                    begin = f.tell()
                    torch_dump(tensor, f, "archive", mtime)
                    key = MetadataIndex(fqn, Size(offsets), index)
                    storage[key] = _StorageInfo(f"__{rank}_0.distcp", begin, f.tell() - begin)
                    chunks.append(ChunkStorageMetadata(Size(offsets), Size(tensor.shape)))
                props = TensorProperties(dtype_of(item.dtype), getattr(_module("torch"), "strided"), False,
                                         None, False)
                state_md[fqn] = TensorStorageMetadata(props, Size(item.shape), chunks)
        metadata = Metadata(state_md, planner_data if planner_data is not None else {k: (k,) for k in items},
                            storage, StorageMeta(str(directory), str(uuid.uuid4())), "1.0.0")
        md_bytes = pickle.dumps(metadata)  # DCP's pickle.dump: the default protocol
    for f in files.values():
        f.close()
    (directory / ".metadata").write_bytes(md_bytes)
