"""LoRA adapters in the server: llama-server's --lora / --lora-scaled, per-request `lora` and
/lora-adapters; vLLM's --lora-modules (the adapter as a model name of its own, listed by
/v1/models); prefix reuse keyed by the adapters a state was computed with; requests with
different adapters decoded together; what is refused.

The adapters are PEFT directories written here for the tiny model (random pairs on its MLPs);
that the engine applies a PEFT adapter as PEFT does is test_lora's (tests/unit)."""
import json
import os
import struct
import tempfile
import threading

import numpy as np
import pytest

from server_util import Server, tiny_model

PROMPT = "The quick brown fox jumps over the lazy dog. " * 12


def write_adapter(path, model_dir, seed, rank=4, alpha=8, std=0.5):
    """A PEFT LoRA directory adapting every MLP projection of the tiny model."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg = cfg.get("text_config", cfg)
    d, ff, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    rng = np.random.default_rng(seed)
    tensors = {}
    for il in range(layers):
        for mod, (out, inp) in {"gate_proj": (ff, d), "up_proj": (ff, d),
                                "down_proj": (d, ff)}.items():
            name = f"base_model.model.model.layers.{il}.mlp.{mod}"
            tensors[name + ".lora_A.weight"] = rng.normal(0, std, (rank, inp)).astype("<f4")
            tensors[name + ".lora_B.weight"] = rng.normal(0, std, (out, rank)).astype("<f4")
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [at, at + t.nbytes]}
        blobs.append(t.tobytes())
        at += t.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": alpha,
                   "target_modules": ["gate_proj", "up_proj", "down_proj"], "bias": "none",
                   "use_dora": False, "fan_in_fan_out": False}, f)
    return path


@pytest.fixture(scope="module")
def adapters():
    with tempfile.TemporaryDirectory() as tmp:
        yield (write_adapter(os.path.join(tmp, "style"), tiny_model(), 1),
               write_adapter(os.path.join(tmp, "sql"), tiny_model(), 2))


def answer(srv, prompt=PROMPT, **kw):
    """A greedy completion's tokens with their log-probabilities, and its cached prompt tokens."""
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 2, **kw}
    r = srv.post_ok("/v1/completions", body)
    lp = r["choices"][0]["logprobs"]
    return (lp["tokens"], [round(x, 4) for x in lp["token_logprobs"]],
            r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))


def same(a, b):
    return a[0] == b[0] and a[1] == b[1]


def test_request_scales_and_defaults(adapters):
    style, sql = adapters
    with Server("--lora", style, "--lora-scaled", sql, "0.5", "--cache-mb", "0") as srv:
        listed = json.loads(srv.request("GET", "/lora-adapters")[2])
        assert [(a["id"], a["name"], a["path"], a["scale"]) for a in listed] == \
            [(0, "style", style, 1.0), (1, "sql", sql, 0.5)]
        base = answer(srv, lora=[])
        assert same(answer(srv, lora=[{"id": 0, "scale": 0}]), base)
        on = answer(srv, lora=[{"id": 0, "scale": 1}])
        assert not same(on, base)
        # no field: the defaults, style at 1 and sql at 0.5
        both = answer(srv, lora=[{"id": 0, "scale": 1}, {"id": 1, "scale": 0.5}])
        assert not same(both, on)
        assert same(answer(srv), both)
        # POST /lora-adapters sets the defaults; those it leaves out go to 0
        status, _, r = srv.post("/lora-adapters", [{"id": 0, "scale": 1}])
        assert status == 200 and [a["scale"] for a in r] == [1.0, 0.0]
        assert same(answer(srv), on)
        assert srv.post("/lora-adapters", [])[0] == 200
        assert same(answer(srv), base)
        # on chat too, and on llama-server's /completion
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                "temperature": 0}
        c0 = srv.post_ok("/v1/chat/completions", chat)["choices"][0]["message"]["content"]
        c1 = srv.post_ok("/v1/chat/completions", {**chat, "lora": [{"id": 1, "scale": 2}]})
        assert c1["choices"][0]["message"]["content"] != c0
        # the Responses and Messages APIs pass it on as chat reads it
        ask = {"max_tokens": 12, "ignore_eos": True, "temperature": 0}
        on = [{"id": 1, "scale": 2}]
        want = [srv.post_ok("/v1/chat/completions", {**chat, **ask, "lora": x})["choices"][0]
                ["message"]["content"] for x in ([], on)]
        assert want[0] != want[1]
        for x, w in zip(([], on), want):
            r = srv.post_ok("/v1/responses", {"input": "hi", "max_output_tokens": 12,
                                              "ignore_eos": True, "temperature": 0, "lora": x,
                                              "store": False})
            assert r["output"][-1]["content"][0]["text"] == w
            m = srv.post_ok("/v1/messages", {"messages": [{"role": "user", "content": "hi"}],
                                             **ask, "lora": x})
            assert m["content"][-1]["text"] == w
        status, _, r = srv.post("/v1/responses", {"input": "hi", "lora": [{"id": 5, "scale": 1}]})
        assert status == 400 and r["error"]["param"].startswith("lora"), r
        t0 = srv.post_ok("/completion", {"prompt": PROMPT, "n_predict": 5, "temperature": 0})
        t1 = srv.post_ok("/completion", {"prompt": PROMPT, "n_predict": 5, "temperature": 0,
                                          "lora": [{"id": 0, "scale": 1}]})
        assert t0["content"] != t1["content"]


def test_bad_lora_fields(adapters):
    style, _ = adapters
    with Server("--lora", style) as srv:
        for bad, param in [({"lora": {"id": 0}}, "lora"),
                           ({"lora": [{"id": 1, "scale": 1}]}, "lora"),
                           ({"lora": [{"id": 0, "scale": "1"}]}, "lora[0]"),
                           ({"lora": [{"id": -1, "scale": 1}]}, "lora[0]"),
                           ({"lora": [{"id": 0, "scale": 1}, {"id": 0, "scale": 2}]}, "lora[1]"),
                           ({"lora": [{"id": 0, "scale": 1e300}]}, "lora[0]")]:
            status, _, r = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 1, **bad})
            assert status == 400, (bad, r)
            assert r["error"]["code"] == "invalid_value" and \
                r["error"]["param"].startswith(param), (bad, r)
        status, _, r = srv.post("/lora-adapters", [{"id": 3, "scale": 1}])
        assert status == 400 and "no LoRA adapter 3" in r["error"]["message"]
        assert srv.post("/lora-adapters", {"id": 0, "scale": 1})[0] == 400
        assert srv.request("POST", "/lora-adapters", "[1,")[0] == 400
        # the defaults are untouched by the refusals
        assert [a["scale"] for a in json.loads(srv.request("GET", "/lora-adapters")[2])] == [1.0]
        assert srv.request("DELETE", "/lora-adapters")[0] == 405


def test_lora_modules_are_models(adapters):
    style, sql = adapters
    with Server("--alias", "base", "--lora-modules", f"sql={sql}", "--lora", style,
                "--lora-init-without-apply", "--cache-mb", "0") as srv:
        models = json.loads(srv.request("GET", "/v1/models")[2])["data"]
        assert [m["id"] for m in models] == ["base", "sql"]
        assert models[1]["parent"] == "base" and models[1]["root"] == sql
        assert json.loads(srv.request("GET", "/v1/models/sql")[2])["id"] == "sql"
        base = answer(srv, model="base")
        as_model = answer(srv, model="sql")
        assert not same(as_model, base)
        assert same(answer(srv, model="base", lora=[{"id": 0, "scale": 1}]), as_model)
        r = srv.post_ok("/v1/completions", {"model": "sql", "prompt": "x", "max_tokens": 1})
        assert r["model"] == "sql"
        # --lora-init-without-apply: "style" is loaded but off unless asked for
        assert same(answer(srv), base)
        status, _, r = srv.post("/v1/completions", {"model": "style", "prompt": "x"})
        assert status == 404 and r["error"]["code"] == "model_not_found"


def test_prefix_reuse_is_per_adapter(adapters):
    style, _ = adapters
    with Server("--lora", style, "--lora-init-without-apply", "--parallel", "1") as srv:
        base = answer(srv)
        on = answer(srv, lora=[{"id": 0, "scale": 1}])
        assert on[2] == 0  # the base model's snapshot of this prompt is not this state
        again = answer(srv)
        assert again[2] > 0 and same(again, base)  # the base model's, reused
        on_again = answer(srv, lora=[{"id": 0, "scale": 1}])
        assert on_again[2] > 0 and same(on_again, on)
        half = answer(srv, lora=[{"id": 0, "scale": 0.5}])
        assert half[2] == 0 and not same(half, on)
        # the lane's own slot (a continued completion) is not reused under other adapters
        long_prompt = "Another text entirely, of its own. " * 10
        off = answer(srv, prompt=long_prompt)
        srv.settle()
        assert answer(srv, prompt=long_prompt, lora=[{"id": 0, "scale": 1}])[2] == 0
        assert same(answer(srv, prompt=long_prompt), off)


def test_adapters_decoded_together(adapters):
    style, sql = adapters
    with Server("--lora", style, "--lora", sql, "--lora-init-without-apply", "--parallel", "3",
                "--cache-mb", "0", "--debug-step-delay-ms", "20") as srv:
        asks = [[], [{"id": 0, "scale": 1}], [{"id": 1, "scale": 1}]]
        alone = [answer(srv, lora=a) for a in asks]
        assert len({json.dumps(a[:2]) for a in alone}) == 3
        out = [None] * 3
        m0 = srv.metrics()

        def run(i):
            out[i] = answer(srv, lora=asks[i])
        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(3):
            assert same(out[i], alone[i]), i
        # they shared steps: fewer decode calls than tokens decoded
        m1 = srv.metrics()
        calls = m1["tessera_decode_calls_total"] - m0["tessera_decode_calls_total"]
        toks = m1["tessera_completion_tokens_total"] - m0["tessera_completion_tokens_total"]
        assert calls <= 0.7 * toks, (calls, toks)


def test_bad_adapter_stops_the_start(adapters):
    with tempfile.TemporaryDirectory() as tmp:
        bad = os.path.join(tmp, "bad")
        write_adapter(bad, tiny_model(), 3)
        with open(os.path.join(bad, "adapter_config.json")) as f:
            cfg = json.load(f)
        cfg["use_dora"] = True
        with open(os.path.join(bad, "adapter_config.json"), "w") as f:
            json.dump(cfg, f)
        for args, says in [(["--lora", bad], "DoRA"),
                           (["--lora", os.path.join(tmp, "none")], "no such file")]:
            srv = Server(*args, wait_ready=False)
            assert srv.proc.wait(timeout=30) != 0
            srv._drain()
            assert says in srv.stderr(), srv.stderr()
