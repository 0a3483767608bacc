#!/usr/bin/env python3
"""Independent float64 numpy forward pass of the Qwen3.5 text decoder.

Written from /work/shared/specs/models.md Part A (not from the transformers code) and used by
gen_qwen35_fixtures.py --check-numpy to cross-check the recorded reference logits. The gated
delta rule runs token by token (the normative recurrence), never chunked, so agreement with
the HF chunked prefill also checks the chunk algebra.

    python3 tools/qwen35_numpy_ref.py tests/fixtures/qwen35/<model>   # compares all prompts
"""

import json
import os
import sys

import numpy as np


def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    tcfg = cfg.get("text_config", cfg)
    prefix = "model.language_model." if "text_config" in cfg else "model."
    return dict(cfg=tcfg, prefix=prefix, w=read_safetensors(os.path.join(model_dir, "model.safetensors")))


def read_safetensors(path):
    """Every tensor of a safetensors file as float64, by its header alone (numpy has no BF16:
    its bits are the top half of a float32's)."""
    kinds = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2"}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    w = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        x = np.frombuffer(data[a:b], dtype=kinds[t["dtype"]])
        if t["dtype"] == "BF16":
            x = (x.astype(np.uint32) << 16).view(np.float32)
        w[name] = x.astype(np.float64).reshape(t["shape"])
    return w


def rms1p(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def rotate_half(x, ang):
    """Rotate-half rotation of the first 2 * half dims of each head by angles ang [T, half]
    (pair (j, j + half) by ang[:, j]); x is [T, H, d]."""
    half = ang.shape[1]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:2 * half]
    out = x.copy()
    out[..., :half] = a * c - b * s
    out[..., half:2 * half] = b * c + a * s
    return out


def rope(x, pos, rot, theta):
    """Rotate-half RoPE on the first `rot` dims of each head; x is [T, H, d]."""
    inv = theta ** (-np.arange(rot // 2, dtype=np.float64) * 2.0 / rot)
    return rotate_half(x, np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :])


def attention(m, L, x, rotate=None):
    """rotate(x, rot, theta): the rotary positions (default: RoPE at positions 0..T-1)."""
    c, w, p = m["cfg"], m["w"], m["prefix"] + f"layers.{L}.self_attn."
    T = x.shape[0]
    nh, nkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]
    rp = c["rope_parameters"]
    rot = int(d * rp.get("partial_rotary_factor", 1.0))
    qg = (x @ w[p + "q_proj.weight"].T).reshape(T, nh, 2 * d)
    q, gate = qg[..., :d], qg[..., d:].reshape(T, nh * d)
    k = (x @ w[p + "k_proj.weight"].T).reshape(T, nkv, d)
    v = (x @ w[p + "v_proj.weight"].T).reshape(T, nkv, d)
    q = rms1p(q, w[p + "q_norm.weight"], eps)
    k = rms1p(k, w[p + "k_norm.weight"], eps)
    if rotate is None:
        def rotate(y, r, theta):
            return rope(y, np.arange(T), r, theta)
    q, k = rotate(q, rot, rp["rope_theta"]), rotate(k, rot, rp["rope_theta"])
    out = np.zeros((T, nh, d))
    group = nh // nkv
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for h in range(nh):
        s = q[:, h] @ k[:, h // group].T / np.sqrt(d) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        out[:, h] = s @ v[:, h // group]
    out = out.reshape(T, nh * d) * sigmoid(gate)
    return out @ w[p + "o_proj.weight"].T


def deltanet(m, L, x):
    c, w, p = m["cfg"], m["w"], m["prefix"] + f"layers.{L}.linear_attn."
    T = x.shape[0]
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    K = c["linear_conv_kernel_dim"]
    mix = x @ w[p + "in_proj_qkv.weight"].T  # [T, 2*hk*dk + hv*dv]
    z = (x @ w[p + "in_proj_z.weight"].T).reshape(T, hv, dv)
    b = x @ w[p + "in_proj_b.weight"].T
    a = x @ w[p + "in_proj_a.weight"].T
    cw = w[p + "conv1d.weight"][:, 0, :]  # [C, K]; cw[:, K-1] multiplies the current token
    padded = np.concatenate([np.zeros((K - 1, mix.shape[1])), mix], axis=0)
    conv = np.zeros_like(mix)
    for t in range(T):
        conv[t] = np.sum(padded[t:t + K].T * cw, axis=1)
    conv = silu(conv)
    q = conv[:, :hk * dk].reshape(T, hk, dk)
    k = conv[:, hk * dk:2 * hk * dk].reshape(T, hk, dk)
    v = conv[:, 2 * hk * dk:].reshape(T, hv, dv)
    q = q / np.sqrt(np.sum(q * q, -1, keepdims=True) + 1e-6) / np.sqrt(dk)
    k = k / np.sqrt(np.sum(k * k, -1, keepdims=True) + 1e-6)
    beta = sigmoid(b)
    g = -np.exp(w[p + "A_log"]) * softplus(a + w[p + "dt_bias"])
    rep = hv // hk
    S = np.zeros((hv, dk, dv))
    o = np.zeros((T, hv, dv))
    for t in range(T):
        for h in range(hv):
            kk, qq = k[t, h // rep], q[t, h // rep]
            S[h] *= np.exp(g[t, h])
            delta = beta[t, h] * (v[t, h] - S[h].T @ kk)
            S[h] += np.outer(kk, delta)
            o[t, h] = S[h].T @ qq
    eps = c["rms_norm_eps"]
    y = o / np.sqrt(np.mean(o * o, -1, keepdims=True) + eps) * w[p + "norm.weight"] * silu(z)
    return y.reshape(T, hv * dv) @ w[p + "out_proj.weight"].T


def layer_types(c):
    """The layers' kinds: listed, or every full_attention_interval-th layer full attention."""
    if "layer_types" in c:
        return c["layer_types"]
    k = c["full_attention_interval"]
    return ["full_attention" if (L + 1) % k == 0 else "linear_attention"
            for L in range(c["num_hidden_layers"])]


def hidden(m, ids):
    """The final norm's output for each token: the output head's input."""
    c, w, pre = m["cfg"], m["w"], m["prefix"]
    eps = c["rms_norm_eps"]
    emb = w[pre + "embed_tokens.weight"]
    h = emb[np.asarray(ids)]
    for L, kind in enumerate(layer_types(c)):
        p = pre + f"layers.{L}."
        x = rms1p(h, w[p + "input_layernorm.weight"], eps)
        h = h + (deltanet(m, L, x) if kind == "linear_attention" else attention(m, L, x))
        x = rms1p(h, w[p + "post_attention_layernorm.weight"], eps)
        mg, mu = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (silu(mg) * mu) @ w[p + "mlp.down_proj.weight"].T
    return rms1p(h, w[pre + "norm.weight"], eps)


def forward(m, ids):
    w, pre = m["w"], m["prefix"]
    head = w.get("lm_head.weight", w[pre + "embed_tokens.weight"])
    return hidden(m, ids) @ head.T


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
