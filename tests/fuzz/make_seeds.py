#!/usr/bin/env python3
"""Writes the seed corpus of one libFuzzer target (not the GGUF one: gguf_seeds.c) into a
directory, built from the repository's own fixtures at build time so that no binary seed is
committed. Usage: make_seeds.py TARGET OUTDIR (run from the repository root)."""
import glob
import json
import os
import struct
import sys
import zlib

FIX = "tests/fixtures"
TOKENIZER = f"{FIX}/tokenizer/small/tokenizer.json"


def st_file(tensors):
    """A .safetensors file: tensors = [(name, dtype, shape)], zero data, contiguous."""
    size = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U8": 1, "F64": 8}
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dt, shape in tensors:
        n = size[dt]
        for d in shape:
            n *= d
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + bytes(off)


def seeds_safetensors():
    out = []
    for path in sorted(glob.glob(f"{FIX}/*/*/model.safetensors"))[:3]:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
        ts = [(k, v["dtype"], [min(d, 2) for d in v["shape"]]) for k, v in hdr.items()
              if k != "__metadata__"]
        out += [b"\0" + st_file(ts[:1]), b"\0" + st_file(ts[:4]), b"\0" + st_file(ts)]
    out += [b"\0" + st_file([]), b"\0" + st_file([("a", "F32", [0]), ("b", "BF16", [3, 1])]),
            b"\0" + st_file([("u", "U8", [2]), ("i", "I64", [1, 1, 1, 1, 1])])]
    wm = {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors", "w": "b.safetensors"}
    out += [b"\1" + json.dumps({"metadata": {"total_size": 34}, "weight_map": wm}).encode(),
            b"\1" + json.dumps({"weight_map": {"x": "a.safetensors"}}).encode()]
    return out


def seeds_hfconfig():
    return [open(p, "rb").read() for p in sorted(glob.glob(f"{FIX}/*/*/config*.json"))]


def small_tokenizer(nfc=True, byte_level_regex=False, merges_as_strings=False, n_merges=40):
    tok = json.load(open(TOKENIZER, encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    keep = {k: v for k, v in vocab.items() if v < 256}
    merges = []
    for a, b in tok["model"]["merges"]:
        if a in keep and b in keep and a + b in vocab and len(merges) < n_merges:
            merges.append([a, b])
            keep[a + b] = vocab[a + b]
    # ids must be dense for the added tokens to follow the vocabulary (HF's rule)
    order = sorted(keep, key=lambda k: keep[k])
    tok["model"]["vocab"] = {k: i for i, k in enumerate(order)}
    tok["model"]["merges"] = [f"{a} {b}" for a, b in merges] if merges_as_strings else merges
    added = []
    for a in tok["added_tokens"]:
        if a["content"] in ("<|endoftext|>", "<|im_start|>", "<think>", "</think>", "<tool_call>"):
            added.append(dict(a, id=len(order) + len(added)))
    tok["added_tokens"] = added
    if not nfc:
        tok["normalizer"] = None
    if byte_level_regex:
        tok["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    return json.dumps(tok, ensure_ascii=False).encode()


def seeds_bpe_load():
    gemma = os.path.join(os.path.dirname(os.path.dirname(TOKENIZER)), "small_gemma",
                         "tokenizer.json")
    return [open(TOKENIZER, "rb").read(), open(gemma, "rb").read(), small_tokenizer(),
            small_tokenizer(nfc=False),
            small_tokenizer(byte_level_regex=True, merges_as_strings=True),
            small_tokenizer(n_merges=0)]


TEXTS = ["Hello, world!", "The quick brown fox jumps over the lazy dog.\n\n  indented\ttab",
         "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok",
         "caf\u00e9 cafe\u0301 \u1e9b\u0323 \ud55c\uad6d\uc5b4 \u65e5\u672c\u8a9e \U0001f600",
         "it's 2024: 3.14159, I'll've we'd", "<tool_call>\n<function=f>\n</function>\n</tool_call>",
         "\u0300\u0301 leading marks", "a" * 300]


def ids_of(text):
    """Ids of text with the small tokenizer, one byte token each (no merges: still valid)."""
    tok = json.load(open(TOKENIZER, encoding="utf-8"))
    vocab, added = tok["model"]["vocab"], {a["content"]: a["id"] for a in tok["added_tokens"]}
    tab = {}
    n = 0
    for b in list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100)):
        tab[b] = chr(b)
    for b in range(256):
        if b not in tab:
            tab[b] = chr(0x100 + n)
            n += 1
    ids, i = [], 0
    while i < len(text):
        for a, aid in added.items():
            if text.startswith(a, i):
                ids.append(aid)
                i += len(a)
                break
        else:
            ids += [vocab[tab[b]] for b in text[i].encode()]
            i += 1
    return ids


def seeds_bpe_encode():
    out = [bytes([f]) + t.encode() for t in TEXTS for f in (0, 1, 3, 8, 9)]
    out += [b"\0\xff\xfe\xc3\x28\xe2\x82\x41\xf0\x9f\x98", b"\x01" + b"\xed\xa0\x80<|im_end|>"]
    out += [b"\x04" + struct.pack(f"<{len(i)}H", *i) for i in map(ids_of, TEXTS)]
    out += [b"\x06" + struct.pack("<8H", 0xC3, 0xA9, 1000, 0xE2, 0x82, 0xAC, 1001, 0xF0)]
    return out


def seeds_openai():
    chats = [
        {"messages": [{"role": "user", "content": "Hello"}]},
        {"model": "tessera", "messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "Hi"}],
         "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
         "seed": 7, "stream": True, "stream_options": {"include_usage": True}, "stop": ["\n\n", "END"],
         "logprobs": True, "top_logprobs": 3, "presence_penalty": 0.5, "frequency_penalty": -0.5,
         "repetition_penalty": 1.1, "logit_bias": {"5": -100, "17": 2.5, "0": 0},
         "chat_template_kwargs": {"enable_thinking": True}, "thinking_token_budget": 64},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                   {"type": "text", "text": "b"}]},
                      {"role": "assistant", "content": None, "reasoning_content": "think",
                       "tool_calls": [{"id": "c1", "type": "function",
                                       "function": {"name": "get", "arguments": "{\"x\": [1, 2.5, null]}"}}]},
                      {"role": "tool", "tool_call_id": "c1", "content": "{\"ok\": true}"},
                      {"role": "developer", "content": "<|im_start|>system"}],
         "tools": [{"type": "function", "function": {"name": "get", "description": "d",
                                                     "parameters": {"type": "object", "properties": {
                                                         "x": {"type": "array"}}}}}],
         "tool_choice": "auto", "parallel_tool_calls": False, "reasoning_effort": "none",
         "response_format": {"type": "text"}, "max_completion_tokens": 32, "n": 1},
    ]
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 9},
                                               "age": {"type": "integer", "minimum": 0},
                                               "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                               "at": {"type": "string", "format": "date"}},
              "required": ["name"]}
    tools = chats[2]["tools"]
    # images: a tiny PNG inline (a data: URL), and the forms refused
    png = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP4"
           "z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg==")
    chats += [
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": png}},
                                                   {"type": "text", "text": "what?"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url",
                                                    "image_url": {"url": "data:image/png,x"}}]}]},
    ]
    chats += [
        {"messages": [{"role": "user", "content": "json"}],
         "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": person,
                                                                    "strict": True}}},
        {"messages": [{"role": "user", "content": "json"}], "response_format": {"type": "json_object"}},
        {"messages": [{"role": "user", "content": "g"}], "grammar": 'root ::= "a" [b-z]{1,3} | x\nx ::= "(" root ")"'},
        {"messages": [{"role": "user", "content": "c"}], "guided_choice": ["yes", "no"]},
        {"messages": [{"role": "user", "content": "r"}], "guided_regex": "(cat|dog)s?[0-9]{2}"},
        {"messages": [{"role": "user", "content": "s"}], "structured_outputs": {"json": person}},
        {"messages": [{"role": "user", "content": "t"}], "tools": tools, "tool_choice": "required",
         "parallel_tool_calls": False},
        {"messages": [{"role": "user", "content": "t"}, {"role": "assistant", "content": "a "}],
         "continue_final_message": True, "add_generation_prompt": False},
        {"messages": [{"role": "user", "content": "t"}], "tools": tools,
         "tool_choice": {"type": "function", "function": {"name": "get"}}},
        {"messages": [{"role": "user", "content": "edit"}],
         "prediction": {"type": "content", "content": [{"type": "text", "text": "a b"}]}},
    ]
    comps = [{"prompt": "Once upon a time", "max_tokens": 8, "logprobs": 2, "echo": False,
              "best_of": 1, "stop": "\n"},
             {"prompt": [1, 2, 3, 1000], "ignore_eos": True, "return_token_ids": True},
             {"prompt": ["a", "b"], "n": 2, "best_of": 3, "logprobs": 0},
             {"prompt": "x", "min_tokens": 3, "stop_token_ids": [5, 1000], "max_tokens": 4,
              "include_stop_str_in_output": True, "stop": ["a", "bc"]},
             {"prompt": [[5, 6]]}, {"prompt": ["one"]},
             {"prompt": ["one", [7, 8], "three"], "n": 2, "seed": 4},
             {"prompt": "scored", "echo": True, "max_tokens": 0, "logprobs": 1},
             {"prompt": "x", "prediction": {"type": "content", "content": "x y z"}},
             {"prompt": "def f(", "suffix": "):\n    pass", "max_tokens": 4}]
    resps = [{"input": "hi", "instructions": "be brief", "max_output_tokens": 8,
              "text": {"format": {"type": "json_schema", "name": "x",
                                  "schema": {"type": "object"}}}},
             {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}]},
                        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]},
                        {"type": "message", "role": "assistant",
                         "content": [{"type": "output_text", "text": "b"}]},
                        {"type": "function_call", "call_id": "c", "name": "f",
                         "arguments": "{}"},
                        {"type": "function_call_output", "call_id": "c", "output": "r"}],
              "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
              "tool_choice": {"type": "function", "name": "f"}, "reasoning": {"effort": "low"},
              "include": ["message.output_text.logprobs"], "top_logprobs": 2},
             {"input": [{"type": "function_call_output", "call_id": "c", "output": "r"}],
              "previous_response_id": "resp_1", "store": False}]
    out = [b"\0" + json.dumps(c).encode() for c in chats]
    out += [b"\x10" + json.dumps(c).encode() for c in resps]
    out += [b"\1" + json.dumps(c).encode() for c in comps]
    embeds = [{"input": "Hello, world!"},
              {"input": ["a", "bc", TEXTS[1]], "encoding_format": "base64", "model": "qwen"},
              {"input": [[1, 2, 3], [4], [5, 6]], "encoding_format": "float", "dimensions": 4},
              {"input": [1, 2, 3], "user": "u"}]
    out += [b"\x20" + json.dumps(c).encode() for c in embeds]
    infills = [{"input_prefix": "def f(", "input_suffix": "):\n    pass\n", "n_predict": 8},
               {"input_prefix": "x", "input_extra": [{"filename": "a.py", "text": "y = 1\n"},
                                                     {"text": "z"}],
                "prompt": "ret", "n_predict": -1, "repeat_penalty": 1.1, "stop": ["\n"],
                "stream": True, "temperature": 0.2, "top_k": 40}]
    out += [b"\x41" + json.dumps(c).encode() for c in infills]
    msgs = [{"model": "tessera", "max_tokens": 8, "system": [{"type": "text", "text": "sys"}],
             "messages": [{"role": "user", "content": "hi"}], "stop_sequences": ["\n"],
             "thinking": {"type": "enabled", "budget_tokens": 1024}, "stream": True},
            {"max_tokens": 4, "messages": [{"role": "user", "content": [
                {"type": "document", "title": "t", "context": "c",
                 "source": {"type": "text", "media_type": "text/plain", "data": "d"}},
                {"type": "document", "source": {"type": "content",
                                                "content": [{"type": "text", "text": "e"}]}},
                {"type": "text", "text": "q"}]}]},
            {"max_tokens": 8, "tools": [{"name": "f", "description": "d",
                                         "input_schema": {"type": "object"}}],
             "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
             "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {
                 "type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "iVBORw0KGgo="}}]},
                          {"role": "assistant", "content": [
                              {"type": "thinking", "thinking": "t", "signature": "s"},
                              {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
                          {"role": "user", "content": [
                              {"type": "tool_result", "tool_use_id": "t1",
                               "content": [{"type": "text", "text": "r"}]},
                              {"type": "text", "text": "go on"}]}]}]
    out += [b"\x50" + json.dumps(c).encode() for c in msgs]  # bits 4 and 6: the Messages API
    return out


def seeds_toolcall():
    calls = ["<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
             "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
             "Sure.\n\n<tool_call>\n<function=f>\n<parameter=obj>\n{\"a\": [1, {\"b\": null}]}\n"
             "</parameter>\n</function>\n</tool_call>\ntext after <tool_c",
             "<tool_call><function=x></function></tool_call><tool_call>\n<function=y>\n"
             "<parameter=q>\n\"quoted\"\n</parameter>\n</function>\n</tool_call>",
             "<tool_call>\n<function=bad>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n"
             "</parameter>\n</function>\n</tool_call> unfinished <tool_call>\n<function=z>"]
    out = [bytes([7]) + c.encode() for c in calls]
    out += [b"\0" + c.split("<tool_call>", 1)[-1].encode() for c in calls[:2]]
    return out


def seeds_textout():
    tok = json.load(open(TOKENIZER, encoding="utf-8"))
    added = {a["content"]: a["id"] for a in tok["added_tokens"]}
    texts = ["<think>\nLet me see.\n\n</think>\n\nThe answer is 42.\n\nEND more",
             "Hello\n\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n"
             "</tool_call>",
             "caf\u00e9 \U0001f600 stop here STOP after", "plain text<|im_end|>"]
    stops = [b"\x02END", b"\x03STOP", b"\x01\n\n"]
    out = []
    for i, t in enumerate(texts):
        ids = ids_of(t)
        flags = (i & 1) | (2 if "tool_call" in t else 0) | (len(stops) << 2)
        out.append(bytes([flags]) + b"".join(stops) + struct.pack(f"<{len(ids)}H", *ids))
        out.append(bytes([0]) + struct.pack(f"<{len(ids)}H", *ids))
    assert added["<think>"] == 1024
    return out


def seeds_grammar():
    schemas = [
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                          "age": {"type": "integer"},
                                          "tags": {"type": "array", "items": {"enum": ["a", 1, None]},
                                                   "maxItems": 3}},
         "required": ["name"], "additionalProperties": False},
        {"$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "number"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
         "$ref": "#/$defs/node"},
        {"anyOf": [{"type": "string", "minLength": 2}, {"type": ["boolean", "null"]},
                   {"const": {"k": [1.5, "x"]}}]},
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
        True,
    ]
    texts = ['{"name": "ab", "age": -12, "tags": ["a", null]}',
             '{"v": 1.5e3, "kids": [{"kids": []}]}', '"hello"', '[1, "x"]', '\n {"a": [true]}']
    out = []
    for s, t in zip(schemas, texts):
        out.append(b"\0" + json.dumps(s).encode() + b"\0" + t.encode())
        out.append(b"\2" + json.dumps(s).encode() + b"\0" + t[:4].encode())
    out.append(b"\1\0" + b'{"a": {"b": [1, 2, {"c": "\\u00e9"}]}}')
    gbnf = b'root ::= "[" ws (item ("," ws item)*)? "]"\nitem ::= [a-z\\u00e0-\\u00ff]+ | [0-9]{1,3}\nws ::= [ \\t\\n]*\n'
    out.append(b"\4" + gbnf + b"\0[ab, 12]")
    out.append(b"\6" + gbnf + b"\0[")
    out.append(b"\x08" + rb"^(\+\d{1,3} )?\(?\d{3}\)?[ -]?\d{3}-\d{4}$" + b"\0+1 (555) 123-4567")
    out.append(b"\x0a" + rb"[^a-z]+|(cat|dog)s?\.{2,}" + b"\0cats..")
    out.append(b"\x0c" + b"yes\nno\nnot sure\0not")
    out.append(b"\3\0{")
    return out


def seeds_image():
    """The image fixtures themselves (PNG, JPEG, WebP; all a few KiB), and a few stubs."""
    files = sorted(glob.glob(f"{FIX}/image/*.png") + glob.glob(f"{FIX}/image/*.jpg") +
                   glob.glob(f"{FIX}/image/*.webp"))
    out = [open(p, "rb").read() for p in files]
    return [s for s in out if len(s) <= 8192] + [b"GIF89a", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xd9",
                                                 huge_chunk_png()]


def huge_chunk_png():
    """A 24x16 PNG header, then an iTXt chunk that declares 2^31 - 16 bytes and holds 8: read
    whole by libpng it is a 2 GB allocation (past libFuzzer's malloc limit)."""
    def chunk(kind, data, length=None):
        n = len(data) if length is None else length
        return (struct.pack(">I", n) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff))
    ihdr = struct.pack(">IIBBBBB", 24, 16, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) +
            chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0x", 0x7ffffff0))


def seeds_video():
    """The video fixtures (MP4, WebM, Matroska; all a few KiB), and stubs of each container and
    of the lists that must be refused."""
    files = sorted(glob.glob(f"{FIX}/video/*.mp4") + glob.glob(f"{FIX}/video/*.webm") +
                   glob.glob(f"{FIX}/video/*.mkv"))
    out = [open(p, "rb").read() for p in files]
    return [s for s in out if len(s) <= 8192] + [
        b"\0\0\0\x18ftypisom\0\0\0\0isomavc1", b"\x1a\x45\xdf\xa3\x9f\x42\x82\x84webm",
        b"#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nfile:///etc/passwd\n#EXT-X-ENDLIST\n",
        b"ffconcat version 1.0\nfile '/etc/passwd'\n"]


def main():
    target, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    seeds = globals()["seeds_" + target]()
    for i, s in enumerate(seeds):
        with open(os.path.join(outdir, f"seed-{i:03d}"), "wb") as f:
            f.write(s)


if __name__ == "__main__":
    main()
