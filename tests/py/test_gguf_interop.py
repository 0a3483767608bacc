"""GGUF interoperability with llama.cpp's own Python package (`gguf`, gguf-py).

- A file from our writer (tests/tools/gguf_dump.c `sample`) loads in gguf.GGUFReader with the
  same keys, value types, values, tensor names, types, dims, offsets and bytes that our reader
  reports (`ts_gguf_dump json`), at the default and at a custom alignment.
- A file from gguf.GGUFWriter loads in our reader with what the Python side put in.
- The same content written by both writers is byte-identical (default alignment, same key
  order), so neither side has a private reading of the layout.

Skipped when the `gguf` package is not installed.
"""

import json
import struct

import pytest

from conftest import run, tool

gguf = pytest.importorskip("gguf", reason="pip install gguf (llama.cpp's gguf-py)")
np = pytest.importorskip("numpy")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402


def fnv1a(data):
    h = 0xCBF29CE484222325
    for b in bytes(data):
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def our_dump(path):
    return json.loads(run([tool("gguf_dump"), "json", str(path)]))


def raw_str(s):
    """Strings in our dump are bytes written as \\u00XX; back to the exact bytes."""
    return s.encode("latin-1")


def same_number(vtype, ours, theirs):
    if vtype == V.FLOAT32:
        return np.float32(float(ours)) == np.float32(theirs)
    if vtype == V.FLOAT64:
        return float(ours) == float(theirs)
    if vtype == V.BOOL:
        return bool(ours) == bool(theirs)
    return int(ours) == int(theirs)


def check_field(kv, field):
    vtype = V[{"STRING": "STRING", "ARRAY": "ARRAY"}.get(kv["type"], kv["type"])]
    assert field.types[0] == vtype, kv["key"]
    if vtype == V.STRING:
        assert bytes(field.parts[-1]) == raw_str(kv["value"]), kv["key"]
    elif vtype == V.ARRAY:
        elem = V[kv["elem"]]
        assert field.types[-1] == elem, kv["key"]
        assert len(field.data) == len(kv["value"]), kv["key"]
        for idx, ours in zip(field.data, kv["value"]):
            part = field.parts[idx]
            if elem == V.STRING:
                assert bytes(part) == raw_str(ours), kv["key"]
            else:
                assert same_number(elem, ours, part.tolist()[0]), (kv["key"], ours, part)
    else:
        assert same_number(vtype, kv["value"], field.parts[-1].tolist()[0]), kv["key"]


@pytest.mark.parametrize("alignment", [32, 64])
def test_our_file_reads_in_gguf_py(tmp_path, alignment):
    path = tmp_path / "ours.gguf"
    run([tool("gguf_dump"), "sample", str(path), str(alignment)])
    ours = our_dump(path)
    reader = gguf.GGUFReader(str(path))

    assert int(reader.alignment) == alignment == ours["alignment"]
    assert reader.data_offset == ours["data_offset"]
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == [kv["key"] for kv in ours["kv"]]
    for kv in ours["kv"]:
        check_field(kv, fields[kv["key"]])

    assert len(reader.tensors) == len(ours["tensors"])
    for t, o in zip(reader.tensors, ours["tensors"]):
        assert t.name == o["name"]
        assert int(t.tensor_type) == o["type_id"] and t.tensor_type.name == o["type"]
        assert [int(d) for d in t.shape] == o["ne"]
        assert t.n_bytes == o["nbytes"]
        assert t.data_offset == o["offset"] and t.data_offset % alignment == 0
        assert fnv1a(t.data.tobytes()) == o["fnv1a"]
        if o["shape"] is not None:
            assert o["shape"] == list(reversed(o["ne"]))
    # The one type we do not compute with is reported, not hidden.
    assert [o["type"] for o in ours["tensors"] if o["shape"] is None] == ["Q5_K"]


def tensor_bytes(i, n):
    return np.frombuffer(bytes((j * 7 + i) & 0xFF for j in range(n)), dtype=np.uint8)


# What `ts_gguf_dump sample` writes, spelled with gguf-py (same order, same types).
SAMPLE_KV = [
    ("general.name", V.STRING, None, "sample été"),
    ("s.u8", V.UINT8, None, 250),
    ("s.i8", V.INT8, None, -120),
    ("s.u16", V.UINT16, None, 65000),
    ("s.i16", V.INT16, None, -32000),
    ("s.u32", V.UINT32, None, 4000000000),
    ("s.i32", V.INT32, None, -2000000000),
    ("s.u64", V.UINT64, None, 2**64 - 1),
    ("s.i64", V.INT64, None, -(2**63)),
    ("s.f32", V.FLOAT32, None, float(np.float32(1e-6))),
    ("s.f64", V.FLOAT64, None, 1e-300),
    ("s.bool", V.BOOL, None, True),
    ("a.u8", V.ARRAY, V.UINT8, [0, 1, 255]),
    ("a.i8", V.ARRAY, V.INT8, [-128, 0, 127]),
    ("a.u16", V.ARRAY, V.UINT16, [0, 65535]),
    ("a.i16", V.ARRAY, V.INT16, [-32768, 32767]),
    ("a.u32", V.ARRAY, V.UINT32, [0, 4294967295]),
    ("a.i32", V.ARRAY, V.INT32, [-(2**31), 2**31 - 1]),
    ("a.u64", V.ARRAY, V.UINT64, [0, 2**64 - 1]),
    ("a.i64", V.ARRAY, V.INT64, [-(2**63), 2**63 - 1]),
    ("a.f32", V.ARRAY, V.FLOAT32, [float(np.float32(x)) for x in (0.1, -1e30, 1e-40)]),
    ("a.f64", V.ARRAY, V.FLOAT64, [0.1, -1e300]),
    ("a.bool", V.ARRAY, V.BOOL, [False, True]),
    ("tokenizer.ggml.tokens", V.ARRAY, V.STRING, ["<bos>", "\u2581hello", "", "tab\there"]),
]

# name, type, shape outermost-first (elements)
SAMPLE_TENSORS = [
    ("token_embd.weight", Q.F32, (3, 5)),
    ("blk.0.attn_q.weight", Q.F16, (4, 6)),
    ("blk.0.ffn_up.weight", Q.BF16, (2, 2, 3)),
    ("blk.0.ffn_down.weight", Q.Q8_0, (2, 64)),
    ("blk.0.attn_k.weight", Q.Q4_0, (3, 32)),
    ("blk.0.attn_v.weight", Q.Q4_K, (2, 256)),
    ("output.weight", Q.Q6_K, (512,)),
    ("blk.0.attn_output.weight", Q.Q5_K, (1, 256)),
]


def write_with_gguf_py(path, alignment=None):
    w = gguf.GGUFWriter(str(path), "gemma3")
    if alignment:
        w.add_custom_alignment(alignment)
    for key, vtype, sub, value in SAMPLE_KV:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for i, (name, qtype, shape) in enumerate(SAMPLE_TENSORS):
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = int(np.prod(shape)) // block * size
        raw = tensor_bytes(i, nbytes)
        if qtype == Q.F32:
            w.add_tensor(name, raw.view(np.float32).reshape(shape))
        elif qtype == Q.F16:
            w.add_tensor(name, raw.view(np.float16).reshape(shape))
        elif qtype == Q.BF16:
            w.add_tensor(name, raw.view(np.uint16).reshape(shape), raw_dtype=qtype)
        else:  # quantized: rows of bytes; gguf-py turns the byte shape into elements
            byte_shape = (*shape[:-1], shape[-1] // block * size)
            w.add_tensor(name, raw.reshape(byte_shape), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("alignment", [None, 128])
def test_gguf_py_file_reads_in_ours(tmp_path, alignment):
    path = tmp_path / "theirs.gguf"
    write_with_gguf_py(path, alignment)
    ours = our_dump(path)
    assert ours["version"] == 3 and ours["alignment"] == (alignment or 32)

    kvs = {kv["key"]: kv for kv in ours["kv"]}
    assert raw_str(kvs["general.architecture"]["value"]) == b"gemma3"
    for key, vtype, sub, value in SAMPLE_KV:
        kv = kvs[key]
        assert kv["type"] == vtype.name, key
        if vtype == V.STRING:
            assert raw_str(kv["value"]) == value.encode("utf-8"), key
        elif vtype == V.ARRAY:
            assert kv["elem"] == sub.name and len(kv["value"]) == len(value), key
            for o, v in zip(kv["value"], value):
                if sub == V.STRING:
                    assert raw_str(o) == v.encode("utf-8"), key
                else:
                    assert same_number(sub, o, v), (key, o, v)
        else:
            assert same_number(vtype, kv["value"], value), key

    assert [t["name"] for t in ours["tensors"]] == [t[0] for t in SAMPLE_TENSORS]
    for i, (t, (name, qtype, shape)) in enumerate(zip(ours["tensors"], SAMPLE_TENSORS)):
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = int(np.prod(shape)) // block * size
        assert t["type_id"] == int(qtype) and t["type"] == qtype.name, name
        assert t["ne"] == list(reversed(shape)), name
        assert t["nbytes"] == nbytes, name
        assert t["offset"] % ours["alignment"] == 0, name
        assert t["fnv1a"] == fnv1a(tensor_bytes(i, nbytes)), name
        if qtype == Q.Q5_K:
            assert t["shape"] is None, name
        else:
            assert t["shape"] == list(shape), name


def test_writers_agree_byte_for_byte(tmp_path):
    ours, theirs = tmp_path / "ours.gguf", tmp_path / "theirs.gguf"
    run([tool("gguf_dump"), "sample", str(ours)])
    write_with_gguf_py(theirs)
    a, b = ours.read_bytes(), theirs.read_bytes()
    if a != b:
        first = next(i for i in range(min(len(a), len(b))) if a[i] != b[i]) if len(a) == len(
            b) else min(len(a), len(b))
        pytest.fail(f"files differ: {len(a)} vs {len(b)} bytes, first difference at byte {first}")
    # Sanity: the header says what we think it says.
    magic, version, n_t, n_kv = struct.unpack_from("<4sIQQ", a)
    assert magic == b"GGUF" and version == 3
    assert n_t == len(SAMPLE_TENSORS) and n_kv == len(SAMPLE_KV) + 1
