#!/usr/bin/env python3
"""Writes the scanner's test vectors into testdata/vectors with the standard library only (pickle, pickletools,
copyreg, zipfile, struct): no torch, numpy or keras. Run by `go generate ./scan/`; README.md names where each
technique was published. Each file's expected verdict is in expect.json beside it, which the Go test reads.

Nothing here is executed by anything: the pickles are written, never loaded.
"""
import copyreg
import io
import json
import operator
import os
import pickle
import struct
import sys
import types
import zipfile
import importlib

# ZIP entries carry the time they were written: fix it, so the vectors are the same bytes on every run.
import time
os.environ["TZ"] = "UTC"
time.tzset()
time.time = lambda: 347155200.0  # 1981-01-01

OUT = os.environ.get("VECTORS_OUT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors")
os.makedirs(OUT, exist_ok=True)
expect = {}


def write(name, data, fmt, verdict, callable_=None, note=""):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
    expect[name] = {"format": fmt, "verdict": verdict, "callable": callable_ or "", "note": note}


# --- stand-ins for torch, so state dicts pickle with torch's real global names (no torch on the machine) ---------
def fake_module(name, **attrs):
    m = types.ModuleType(name)
    for k, v in attrs.items():
        v.__module__ = name
        v.__qualname__ = k
        v.__name__ = k
        setattr(m, k, v)
    sys.modules[name] = m
    return m


def _rebuild_tensor_v2(*a):
    pass


class FloatStorage:
    pass


class NumpyArrayWrapper:
    pass


torch = fake_module("torch", FloatStorage=FloatStorage)
torch._utils = fake_module("torch._utils", _rebuild_tensor_v2=_rebuild_tensor_v2)
fake_module("joblib")
fake_module("joblib.numpy_pickle", NumpyArrayWrapper=NumpyArrayWrapper)


class Tensor:
    """Pickles as torch.save pickles a tensor: _rebuild_tensor_v2 over a persistent storage id."""

    def __init__(self, key, numel):
        self.key, self.numel = key, numel

    def __reduce__(self):
        from collections import OrderedDict
        return (_rebuild_tensor_v2, (StorageRef(self.key, self.numel), 0, (self.numel,), (1,), False, OrderedDict()))


class StorageRef:
    def __init__(self, key, numel):
        self.key, self.numel = key, numel


class TorchPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, StorageRef):
            return ("storage", FloatStorage, obj.key, "cpu", obj.numel)
        return None


def torch_pickle(obj, protocol=2):
    b = io.BytesIO()
    TorchPickler(b, protocol=protocol).dump(obj)
    return b.getvalue()


def state_dict():
    from collections import OrderedDict
    sd = OrderedDict()
    sd["layer.weight"] = Tensor("0", 4)
    sd["layer.bias"] = Tensor("1", 2)
    return sd


# --- hostile callables --------------------------------------------------------------------------------------
class Reduce:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


class CallableReduce(Reduce):
    def __call__(self, *a):
        pass


def torch_zip(pkl, extra=(), prefix="archive"):
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as z:
        z.writestr(prefix + "/data.pkl", pkl)
        z.writestr(prefix + "/byteorder", "little")
        z.writestr(prefix + "/data/0", b"\0" * 16)
        z.writestr(prefix + "/data/1", b"\0" * 8)
        for n, d in extra:
            z.writestr(n, d)
        z.writestr(prefix + "/version", "3\n")
    return b.getvalue()


def main():
    # Benign: what torch.save writes for a state dict, and plain files.
    sd = torch_pickle(state_dict())
    write("state_dict.pkl", sd, "pickle", "data")
    write("state_dict_p4.pkl", torch_pickle(state_dict(), 4), "pickle", "data")
    write("benign_torch.pt", torch_zip(sd), "pytorch-zip", "data")
    write("config.json", b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 16}\n', "json", "data")
    write("model_card.md", b"# a model\n\nWeights in safetensors.\n", "text", "data")
    write("image.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 32, "png", "data")

    # __reduce__ to os.system, builtins.exec, eval (Trail of Bits, "Never a dill moment", 2021; fickling).
    write("reduce_os_system.pkl", pickle.dumps(Reduce(os.system, "echo pwned"), protocol=2), "pickle", "code", "posix.system")
    write("builtins_exec_p4.pkl", pickle.dumps(Reduce(exec, "import os"), protocol=4), "pickle", "code", "builtins.exec")
    write("eval_p0.pkl", pickle.dumps(Reduce(eval, "1+1"), protocol=0), "pickle", "code", "builtins.eval",
          "protocol 0 writes c__builtin__\\neval: CPython maps __builtin__ to builtins")
    write("evil.safetensors", pickle.dumps(Reduce(os.system, "id"), protocol=2), "pickle", "code", "posix.system",
          "a pickle under a safetensors name: the name decides nothing")
    write("evil_named.bin", pickle.dumps(Reduce(os.system, "id"), protocol=3), "pickle", "code", "posix.system",
          "CVE-2025-10155: a PyTorch extension on a plain pickle")

    # importlib.import_module + operator.methodcaller / attrgetter (arXiv 2508.19774's gadget chains).
    imp = Reduce(importlib.import_module, "os")
    write("methodcaller.pkl", pickle.dumps(Reduce(operator.methodcaller("system", "id"), imp), protocol=4),
          "pickle", "code", "operator.methodcaller")
    write("attrgetter.pkl", pickle.dumps(Reduce(CallableReduce(operator.attrgetter("system"), imp), "id"), protocol=2),
          "pickle", "code", "importlib.import_module")

    # Names assembled in the memo, then STACK_GLOBAL (fickling; picklescan bypasses via memo, 2023-2025).
    memo = (b"\x80\x04" + b"\x8c\x02os\x94" + b"\x8c\x06system\x94" + b"0" + b"0"
            + b"h\x00h\x01\x93" + b"\x8c\x02id\x85R.")
    write("memo_names.pkl", memo, "pickle", "code", "os.system")
    # Protocol-0 string escapes building the names ('\x6fs' is 'os'), then STACK_GLOBAL, in a text-opcode stream.
    write("p0_escapes.pkl", b"S'\\x6fs'\np0\n0S'sys\\164em'\np1\n0g0\ng1\n\x93(S'id'\ntR.", "pickle", "code", "os.system")

    # INST and OBJ (protocol 0/1 instantiation opcodes picklescan long ignored).
    write("inst.pkl", b"(S'id'\nios\nsystem\n.", "pickle", "code", "os.system")
    write("obj.pkl", b"(cos\nsystem\nS'id'\no.", "pickle", "code", "os.system")

    # copyreg extension registry codes (EXT1/2/4 resolve to whatever the loader registered).
    copyreg.add_extension(os.system.__module__, "system", 240)
    try:
        ext1 = pickle.dumps(os.system, protocol=2)
    finally:
        copyreg.remove_extension(os.system.__module__, "system", 240)
    assert b"\x82" in ext1
    write("ext1.pkl", ext1, "pickle", "code", "(copyreg extension 240)")
    write("ext4.pkl", b"\x80\x02\x84\x01\x00\x01\x00X\x02\x00\x00\x00id\x85R.", "pickle", "code", "(copyreg extension 65537)")

    # A pickle nested in a pickle (the outer call is the loader: pickle.loads).
    inner = pickle.dumps(Reduce(os.system, "id"), protocol=2)
    write("nested.pkl", pickle.dumps(Reduce(pickle.loads, inner), protocol=2), "pickle", "code", "posix.system")

    # A payload followed by garbage: CPython has run the REDUCE before it fails.
    p = pickle.dumps(Reduce(os.system, "id"), protocol=2)
    write("payload_then_garbage.pkl", p[:-1] + b"\xff\xfe\xfd not a pickle", "pickle", "code", "posix.system")

    # PyTorch ZIPs: evil data.pkl; mismatched local/central headers, encrypted flag, duplicate names
    # (picklescan CVE-2025-10156 and CVE-2025-10157: its zipfile and torch's miniz disagree).
    write("evil_torch.pt", torch_zip(pickle.dumps(Reduce(os.system, "id"), protocol=2)), "pytorch-zip", "code", "posix.system")
    z = bytearray(torch_zip(sd))
    i = z.index(b"archive/data.pkl")  # first occurrence: the local header's name
    z[i + len("archive/data.pk")] = ord("x")
    write("zip_local_central_mismatch.pt", bytes(z), "zip", "malformed", note="local header names archive/data.pkx")
    z = bytearray(torch_zip(sd))
    for sig in (b"PK\x03\x04", b"PK\x01\x02"):
        j = z.index(sig)
        off = j + (6 if sig == b"PK\x03\x04" else 8)
        z[off] |= 1
    write("zip_encrypted_flag.pt", bytes(z), "zip", "malformed")
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as zz:
        zz.writestr("archive/data.pkl", sd)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zz.writestr("archive/data.pkl", pickle.dumps(Reduce(os.system, "id"), protocol=2))
    write("zip_duplicate_names.pt", b.getvalue(), "zip", "malformed")
    write("torchscript.pt", torch_zip(sd, [("archive/code/__torch__.py", b"def forward(self):\n  pass\n"),
                                           ("archive/constants.pkl", pickle.dumps((), protocol=2))]),
          "pytorch-zip", "code", "torch.jit")
    # zip64 local headers (what torch writes for records over 4 GiB), on a small benign archive.
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as zz:
        for n, d in (("archive/data.pkl", sd), ("archive/data/0", b"\0" * 16), ("archive/data/1", b"\0" * 8)):
            with zz.open(n, "w", force_zip64=True) as f:
                f.write(d)
    write("zip64_benign.pt", b.getvalue(), "pytorch-zip", "data")
    # Polyglot: a pickle whose end is a ZIP directory (zipfile sees the ZIP, torch.load the pickle).
    write("polyglot.pkl", pickle.dumps(Reduce(os.system, "id"), protocol=2) + torch_zip(sd), "pickle", "code", "posix.system")

    # Legacy torch.save format: magic, protocol, sys info, the model, storage keys, raw storages.
    magic = 0x1950A86A20F9469CFC6C

    def legacy(main):
        return (pickle.dumps(magic, protocol=2) + pickle.dumps(1001, protocol=2)
                + pickle.dumps({"protocol_version": 1001, "little_endian": True}, protocol=2)
                + main + pickle.dumps(["0", "1"], protocol=2) + struct.pack("<q", 4) + b"\x80\x02garbage")
    write("legacy_benign.pt", legacy(sd), "pytorch-legacy", "data")
    write("legacy_evil.pt", legacy(pickle.dumps(Reduce(os.system, "id"), protocol=2)), "pytorch-legacy", "code", "posix.system")

    # NumPy: object dtype (allow_pickle) and a plain array; npz of both.
    def npy(descr, shape, body):
        h = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (descr, shape)
        h = h + " " * (63 - (len(h) + 10) % 64) + "\n"
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + body
    evil_npy = npy("|O", (1,), pickle.dumps([Reduce(os.system, "id")], protocol=3))
    write("object.npy", evil_npy, "npy", "code", "numpy.object")
    plain = npy("<f4", (2, 2), b"\0" * 16)
    write("plain.npy", plain, "npy", "data")
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_DEFLATED) as zz:
        zz.writestr("a.npy", plain)
        zz.writestr("b.npy", evil_npy)
    write("object.npz", b.getvalue(), "npz", "code", "numpy.object")
    write("truncated.npy", npy("<f4", (1000,), b"\0" * 16), "npy", "malformed")

    # joblib: its pickle names NumpyArrayWrapper and the array bytes follow the pickle.
    write("joblib_like.joblib", pickle.dumps(Reduce(NumpyArrayWrapper), protocol=4) + b"\x93NUMPY...", "pickle", "code",
          "joblib.numpy_pickle.NumpyArrayWrapper")

    # Keras: a .keras ZIP whose config.json has a Lambda layer, and a Keras 2 .h5 with one in model_config.
    cfg = {"class_name": "Functional", "config": {"layers": [
        {"class_name": "InputLayer", "config": {"name": "in"}},
        {"class_name": "Lambda", "config": {"name": "evil", "function": {"class_name": "__lambda__", "config": {"code": "4wEA..."}}}}]}}
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_DEFLATED) as zz:
        zz.writestr("metadata.json", json.dumps({"keras_version": "3.6.0"}))
        zz.writestr("config.json", json.dumps(cfg))
        zz.writestr("model.weights.h5", b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    write("lambda.keras", b.getvalue(), "keras", "code", "keras.layers.Lambda")
    write("lambda.h5", b"\x89HDF\r\n\x1a\n" + b"\0" * 100 + b"model_config" + b"\0" * 8 + json.dumps(cfg).encode() + b"\0" * 64,
          "hdf5", "code", "keras.layers.Lambda")
    write("plain.h5", b"\x89HDF\r\n\x1a\n" + b"\0" * 200, "hdf5", "data")

    # ONNX whose external data points outside the model (CVE-2024-27318/CVE-2022-25882 path traversal).
    def varint(n):
        out = b""
        while True:
            b7 = n & 0x7F
            n >>= 7
            if n:
                out += bytes([b7 | 0x80])
            else:
                return out + bytes([b7])

    def fld(num, payload):
        return varint(num << 3 | 2) + varint(len(payload)) + payload

    def onnx(location):
        entry = fld(1, b"location") + fld(2, location.encode())
        tensor = varint(1 << 3) + varint(4) + varint(2 << 3) + varint(1) + fld(8, b"w") + fld(13, entry) + varint(14 << 3) + varint(1)
        graph = fld(5, tensor) + fld(2, b"g")
        return varint(1 << 3) + varint(8) + fld(2, b"gen.py") + fld(7, graph)
    write("external_escape.onnx", onnx("../../etc/passwd"), "onnx", "malformed")
    write("external_ok.onnx", onnx("weights.bin"), "onnx", "data")

    # GGUF whose tensor sizes and offsets overflow (llama.cpp GHSA-8947-pfff-2f3c and siblings, 2024).
    def gguf(tensors, data=b""):
        h = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 0)
        for name, dims, typ, off in tensors:
            h += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
            h += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", typ, off)
        h += b"\0" * ((32 - len(h) % 32) % 32)
        return h + data
    write("gguf_ok.gguf", gguf([(b"w", [4, 2], 0, 0), (b"b", [2], 0, 32)], b"\0" * 40), "gguf", "data")
    write("gguf_dims_overflow.gguf", gguf([(b"w", [1 << 62, 1 << 4], 0, 0)], b"\0" * 32), "gguf", "malformed")
    write("gguf_offset_overflow.gguf", gguf([(b"w", [4], 0, 0xFFFFFFFFFFFFFFE0)], b"\0" * 32), "gguf", "malformed")

    # safetensors whose header lies about sizes or offsets (Hugging Face safetensors audit, Trail of Bits 2023).
    def st(header, data):
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + data
    write("ok.safetensors", st({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                                "__metadata__": {"format": "pt"}}, b"\0" * 16), "safetensors", "data")
    write("lying_size.safetensors", st({"w": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}, b"\0" * 16),
          "safetensors", "malformed")
    write("overlap.safetensors", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                     "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12),
          "safetensors", "malformed")

    write("random.bin", bytes((i * 73 + 41) % 256 for i in range(4096)), "unknown", "malformed")

    with open(os.path.join(OUT, "expect.json"), "w") as f:
        json.dump(expect, f, indent=1, sort_keys=True)
        f.write("\n")


main()
