#!/usr/bin/env python3
"""Independent float64 numpy forward pass of the Gemma 3 text decoder (`gemma3_text`).

Written from /work/shared/specs/models.md Part D (not from the transformers code) and used by
gen_gemma3_fixtures.py to cross-check the recorded reference logits. Two evaluation paths:
`forward` runs the whole sequence with an explicit window mask, `decode` feeds one token at a
time through per-layer KV stores where sliding layers keep only a ring buffer of `window` slots
(the layout a C engine would use), so agreement of the two checks the mask boundary as well.

    python3 tools/gemma3_numpy_ref.py tests/fixtures/gemma3/<model> [...]   # compares all prompts
"""

import json
import math
import os
import sys

import numpy as np
from qwen35_numpy_ref import read_safetensors


def resolve_config(cfg):
    """The fields the forward pass needs, from any of the config.json forms seen in the wild:
    rope bases either in `rope_parameters.{full_attention,sliding_attention}.rope_theta`
    (transformers >= 5) or top-level `rope_theta` / `rope_local_base_freq` (older files);
    layer kinds either in `layer_types` or from `sliding_window_pattern` (every n-th layer,
    counting from 1, is global; default 6). The `_sliding_window_pattern` key that
    transformers also writes is not read back by transformers (5.24), so it is ignored here
    too: with explicit irregular `layer_types` it can even disagree with them."""
    if cfg.get("model_type") != "gemma3_text":
        raise ValueError(f"model_type {cfg.get('model_type')!r}, expected gemma3_text")
    n_layers = cfg["num_hidden_layers"]
    kinds = cfg.get("layer_types")
    if kinds is None:
        pattern = cfg.get("sliding_window_pattern", 6)
        kinds = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                 for i in range(n_layers)]
    if len(kinds) != n_layers or not set(kinds) <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"bad layer_types {kinds}")
    rp = cfg.get("rope_parameters")
    if rp is not None and "full_attention" in rp:
        for sub in rp.values():
            if sub.get("rope_type", "default") != "default":
                raise ValueError(f"rope_type {sub['rope_type']} not supported")
        theta = {k: float(rp[k]["rope_theta"]) for k in ("full_attention", "sliding_attention")}
    else:
        if cfg.get("rope_scaling") is not None:
            raise ValueError("rope_scaling not supported")
        theta = {"full_attention": float(cfg.get("rope_theta", 1_000_000.0)),
                 "sliding_attention": float(cfg.get("rope_local_base_freq", 10_000.0))}
    if cfg.get("attn_logit_softcapping") is not None:
        raise ValueError("attn_logit_softcapping is set; not covered by the spec")
    if cfg.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ValueError(f"activation {cfg['hidden_activation']}")
    return dict(
        n_layers=n_layers, kinds=list(kinds), theta=theta,
        hidden=cfg["hidden_size"], n_heads=cfg["num_attention_heads"],
        n_kv=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
        qpas=float(cfg["query_pre_attn_scalar"]), window=cfg["sliding_window"],
        eps=cfg["rms_norm_eps"], final_softcap=cfg.get("final_logit_softcapping"),
        tied=cfg.get("tie_word_embeddings", True),
        # an encoder (EmbeddingGemma): no causal mask; a sliding layer sees |i - j| < this
        encoder=bool(cfg.get("use_bidirectional_attention")),
        enc_window=cfg["sliding_window"] // 2 + 1,
    )


def load(model_dir, config_name="config.json", embed_scale=None):
    """embed_scale: None = sqrt(hidden_size) in float64; otherwise the given value."""
    with open(os.path.join(model_dir, config_name)) as f:
        c = resolve_config(json.load(f))
    w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    if "embed_tokens.weight" in w:  # a bare Gemma3TextModel (EmbeddingGemma): no "model."
        w = {"model." + k: v for k, v in w.items()}
    if c["tied"] and "lm_head.weight" in w:
        raise ValueError("tied model carries lm_head.weight")
    if not c["tied"] and "lm_head.weight" not in w:
        raise ValueError("untied model lacks lm_head.weight")
    c["embed_scale"] = math.sqrt(c["hidden"]) if embed_scale is None else float(embed_scale)
    return dict(cfg=c, w=w)


def rms1p(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope(x, pos, theta):
    """Rotate-half RoPE over all head dims; x is [T, H, d], pos is [T]."""
    d = x.shape[-1]
    half = d // 2
    inv = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / d)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def qkv(m, L, x, pos):
    c, w, p = m["cfg"], m["w"], f"model.layers.{L}.self_attn."
    T = x.shape[0]
    nh, nkv, d = c["n_heads"], c["n_kv"], c["head_dim"]
    q = (x @ w[p + "q_proj.weight"].T).reshape(T, nh, d)
    k = (x @ w[p + "k_proj.weight"].T).reshape(T, nkv, d)
    v = (x @ w[p + "v_proj.weight"].T).reshape(T, nkv, d)
    q = rms1p(q, w[p + "q_norm.weight"], c["eps"])
    k = rms1p(k, w[p + "k_norm.weight"], c["eps"])
    theta = c["theta"][c["kinds"][L]]
    return rope(q, pos, theta), rope(k, pos, theta), v


def attend(m, q, keys, vals, bias):
    """q [T, nh, d]; keys/vals [S, nkv, d]; bias [T, S] (0 or -inf). Returns [T, nh*d]."""
    c = m["cfg"]
    nh, d = c["n_heads"], c["head_dim"]
    group = nh // c["n_kv"]
    out = np.zeros((q.shape[0], nh, d))
    for h in range(nh):
        s = q[:, h] @ keys[:, h // group].T / math.sqrt(c["qpas"]) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        out[:, h] = s @ vals[:, h // group]
    return out.reshape(q.shape[0], nh * d)


def window_bias(m, L, T):
    """Key j is visible to query i iff j <= i, and for sliding layers also i - window < j. An
    encoder's: every key, and for sliding layers |i - j| < sliding_window // 2 + 1."""
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    if m["cfg"]["encoder"]:
        ok = np.ones((T, T), dtype=bool)
        if m["cfg"]["kinds"][L] == "sliding_attention":
            ok &= np.abs(i - j) < m["cfg"]["enc_window"]
        return np.where(ok, 0.0, -np.inf)
    ok = j <= i
    if m["cfg"]["kinds"][L] == "sliding_attention":
        ok &= j > i - m["cfg"]["window"]
    return np.where(ok, 0.0, -np.inf)


def mlp_block(m, L, h):
    c, w, p = m["cfg"], m["w"], f"model.layers.{L}."
    x = rms1p(h, w[p + "pre_feedforward_layernorm.weight"], c["eps"])
    g, u = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
    y = (gelu_tanh(g) * u) @ w[p + "mlp.down_proj.weight"].T
    return h + rms1p(y, w[p + "post_feedforward_layernorm.weight"], c["eps"])


def embed(m, ids):
    return m["w"]["model.embed_tokens.weight"][np.asarray(ids)] * m["cfg"]["embed_scale"]


def final_norm(m, h):
    """The output head's input: what embeddings are pooled from."""
    return rms1p(h, m["w"]["model.norm.weight"], m["cfg"]["eps"])


def head(m, h):
    c, w = m["cfg"], m["w"]
    h = final_norm(m, h)
    logits = h @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
    cap = c["final_softcap"]
    if cap is not None:
        logits = cap * np.tanh(logits / cap)
    return logits


def forward(m, ids):
    """Logits [T, vocab] for every position, whole sequence at once."""
    return head(m, body(m, ids))


def body(m, ids):
    """The residual stream after the last layer [T, hidden], whole sequence at once."""
    c, w = m["cfg"], m["w"]
    T = len(ids)
    h = embed(m, ids)
    pos = np.arange(T)
    for L in range(c["n_layers"]):
        p = f"model.layers.{L}."
        x = rms1p(h, w[p + "input_layernorm.weight"], c["eps"])
        q, k, v = qkv(m, L, x, pos)
        a = attend(m, q, k, v, window_bias(m, L, T)) @ w[p + "self_attn.o_proj.weight"].T
        h = h + rms1p(a, w[p + "post_attention_layernorm.weight"], c["eps"])
        h = mlp_block(m, L, h)
    return h


def decode(m, ids):
    """Same logits, one token at a time. Sliding layers keep a ring buffer of `window` slots
    (slot = position mod window), global layers keep everything."""
    c, w = m["cfg"], m["w"]
    W = c["window"]
    stores = []
    for kind in c["kinds"]:
        n = W if kind == "sliding_attention" else len(ids)
        stores.append(dict(k=np.zeros((n, c["n_kv"], c["head_dim"])),
                           v=np.zeros((n, c["n_kv"], c["head_dim"]))))
    out = []
    for t, tok in enumerate(ids):
        h = embed(m, [tok])
        for L, st in enumerate(stores):
            p = f"model.layers.{L}."
            x = rms1p(h, w[p + "input_layernorm.weight"], c["eps"])
            q, k, v = qkv(m, L, x, [t])
            slot = t % W if c["kinds"][L] == "sliding_attention" else t
            st["k"][slot], st["v"][slot] = k[0], v[0]
            n_valid = min(t + 1, st["k"].shape[0])
            a = attend(m, q, st["k"][:n_valid], st["v"][:n_valid], np.zeros((1, n_valid)))
            a = a @ w[p + "self_attn.o_proj.weight"].T
            h = h + rms1p(a, w[p + "post_attention_layernorm.weight"], c["eps"])
            h = mlp_block(m, L, h)
        out.append(head(m, h)[0])
    return np.stack(out)


def main():
    for d in sys.argv[1:]:
        m = load(d)
        i = 0
        while os.path.exists(os.path.join(d, "ref", f"prompt_{i}.ids")):
            ids = [int(t) for t in open(os.path.join(d, "ref", f"prompt_{i}.ids")).read().split()]
            hf = np.fromfile(os.path.join(d, "ref", f"prompt_{i}.logits"), dtype="<f4")
            hf = hf.reshape(len(ids), -1)
            mine = forward(m, ids)
            print(f"{d} prompt_{i} len {len(ids)}: max|diff| {np.abs(mine - hf).max():.3e}, "
                  f"argmax equal {np.array_equal(mine.argmax(-1), hf.argmax(-1))}")
            i += 1


if __name__ == "__main__":
    main()
