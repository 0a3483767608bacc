#!/usr/bin/env python3
"""Independent float64 numpy reference of the Qwen3.5 vision input path.

Written from /work/shared/specs/models.md Part C (preprocessing C.3, vision encoder C.4,
placement C.6, MRoPE positions C.7) and A.5.3 (interleaved MRoPE), not from the transformers
code. gen_qwen35_vision_fixtures.py runs it on every fixture image and prompt and records the
errors against Hugging Face's float32 outputs in meta.json. Only PIL's BICUBIC resampling is
borrowed (the C side has its own PIL-compatible resize, checked by tests/fixtures/image/); the
text decoder layers come from qwen35_numpy_ref.py (Part A), with the MRoPE attention here.

    python3 tools/qwen35_vision_numpy_ref.py tests/fixtures/qwen35_vision/tiny_v_f32

The variant flags of vision_forward() / mm_forward() are deliberate mistakes, used by the
generator to show that the fixtures tell them apart from the right answer.
"""

import json
import math
import os
import sys

import numpy as np
from safetensors import safe_open

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen35_numpy_ref as text_ref  # noqa: E402  (Part A layers: RMSNorm1p, DeltaNet, MLP)

VISUAL = "model.visual."


def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(model_dir, "preprocessor_config.json")) as f:
        pre = json.load(f)
    w = {}
    # torch is only used to read BF16, which numpy cannot represent.
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        for k in f.keys():
            w[k] = f.get_tensor(k).double().numpy()
    return dict(cfg=cfg, vcfg=cfg["vision_config"], tcfg=cfg["text_config"], pre=pre, w=w,
                prefix="model.language_model.")


# ---------------------------------------------------------------- C.3 preprocessing

def smart_resize(h, w, factor, min_pixels, max_pixels):
    hb = round(h / factor) * factor  # Python round: half to even
    wb = round(w / factor) * factor
    if hb * wb > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        hb = max(factor, math.floor(h / beta / factor) * factor)
        wb = max(factor, math.floor(w / beta / factor) * factor)
    elif hb * wb < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        hb = math.ceil(h * beta / factor) * factor
        wb = math.ceil(w * beta / factor) * factor
    return hb, wb


def preprocess(m, png_path):
    """PNG -> (pixel vectors [N, C*T*p*p] float64, (t, gh, gw), resized uint8 [h', w', 3])."""
    from PIL import Image

    pre = m["pre"]
    p, mg, tp = pre["patch_size"], pre["merge_size"], pre["temporal_patch_size"]
    img = Image.open(png_path).convert("RGB")
    w, h = img.size
    hh, ww = smart_resize(h, w, p * mg, pre["size"]["shortest_edge"], pre["size"]["longest_edge"])
    resized = np.asarray(img.resize((ww, hh), Image.BICUBIC), dtype=np.uint8)
    x = resized.astype(np.float64) * pre["rescale_factor"]
    x = (x - np.asarray(pre["image_mean"])) / np.asarray(pre["image_std"])  # [h', w', 3]
    gh, gw = hh // p, ww // p
    vecs = []
    for br in range(gh // mg):
        for bc in range(gw // mg):
            for ir in range(mg):
                for ic in range(mg):
                    r, c = br * mg + ir, bc * mg + ic
                    patch = x[r * p:(r + 1) * p, c * p:(c + 1) * p, :]  # [y, x, ch]
                    patch = np.transpose(patch, (2, 0, 1))  # [ch, y, x]
                    frames = np.stack([patch] * tp, axis=1)  # [ch, frame, y, x]
                    vecs.append(frames.reshape(-1))
    return np.stack(vecs), (1, gh, gw), resized


# ---------------------------------------------------------------- C.4 vision encoder

def layer_norm(x, w, b, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


_erf = np.vectorize(math.erf)


def gelu_erf(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def patch_coords(gh, gw, mg, raster=False):
    """(row, col) of every patch in the processor's order: merge blocks (block_row, block_col),
    then (in_row, in_col) inside the block."""
    if raster:
        return [(r, c) for r in range(gh) for c in range(gw)]
    out = []
    for br in range(gh // mg):
        for bc in range(gw // mg):
            for ir in range(mg):
                for ic in range(mg):
                    out.append((br * mg + ir, bc * mg + ic))
    return out


def vision_forward(m, pixels, grid, align_corners=True, swap_rope_axes=False,
                   merger_gelu_tanh=False, raster_coords=False, rope_theta=None):
    """One image: pixel vectors [N, C*T*p*p] (processor order) -> merger output [N/mg^2, out]."""
    vc, w = m["vcfg"], m["w"]
    t, gh, gw = grid
    assert t == 1
    hid, nh = vc["hidden_size"], vc["num_heads"]
    d = hid // nh
    mg = vc["spatial_merge_size"]
    pix = np.asarray(pixels, dtype=np.float64)
    n = pix.shape[0]
    # 1. patch embedding: Conv3d with stride = kernel is a linear map of the flattened patch
    wp = w[VISUAL + "patch_embed.proj.weight"].reshape(hid, -1)
    x = pix @ wp.T + w[VISUAL + "patch_embed.proj.bias"]
    coords = patch_coords(gh, gw, mg, raster_coords)
    # 2. learned position embedding, bilinear, align_corners=True, from a side x side table
    table = w[VISUAL + "pos_embed.weight"]
    side = int(round(math.sqrt(table.shape[0])))
    assert side * side == table.shape[0]

    def axis(i, size):
        if align_corners:
            s = i * (side - 1) / (size - 1) if size > 1 else 0.0
        else:  # the half-pixel-centre mistake
            s = min(max((i + 0.5) * side / size - 0.5, 0.0), side - 1)
        i0 = int(math.floor(s))
        i1 = min(i0 + 1, side - 1)
        return i0, i1, s - i0

    pos = np.zeros((n, hid))
    for k, (r, c) in enumerate(coords):
        r0, r1, dr = axis(r, gh)
        c0, c1, dc = axis(c, gw)
        pos[k] = ((1 - dr) * (1 - dc) * table[r0 * side + c0] + (1 - dr) * dc * table[r0 * side + c1]
                  + dr * (1 - dc) * table[r1 * side + c0] + dr * dc * table[r1 * side + c1])
    x = x + pos
    # 3. 2-D rotary: d/4 frequencies per axis; angle j < d/4 uses the row, d/4 <= j < d/2 the
    #    column; rotate-half pairs (j, j + d/2) over the whole head.
    theta = rope_theta if rope_theta is not None else \
        (vc.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    nf = d // 4
    inv = theta ** (-np.arange(nf, dtype=np.float64) / nf)
    rows = np.array([rc[0] for rc in coords], dtype=np.float64)
    cols = np.array([rc[1] for rc in coords], dtype=np.float64)
    if swap_rope_axes:
        rows, cols = cols, rows
    ang = np.concatenate([rows[:, None] * inv[None], cols[:, None] * inv[None]], axis=1)  # [n, d/2]

    def rot(v):  # v [n, heads, d]
        return text_ref.rotate_half(v, ang)

    # 4. pre-LN blocks, bidirectional attention over this image's patches
    for j in range(vc["depth"]):
        p = VISUAL + f"blocks.{j}."
        y = layer_norm(x, w[p + "norm1.weight"], w[p + "norm1.bias"])
        qkv = y @ w[p + "attn.qkv.weight"].T + w[p + "attn.qkv.bias"]
        q = rot(qkv[:, :hid].reshape(n, nh, d))
        k = rot(qkv[:, hid:2 * hid].reshape(n, nh, d))
        v = qkv[:, 2 * hid:].reshape(n, nh, d)
        o = np.zeros((n, nh, d))
        for h in range(nh):
            s = q[:, h] @ k[:, h].T / math.sqrt(d)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o[:, h] = s @ v[:, h]
        x = x + o.reshape(n, hid) @ w[p + "attn.proj.weight"].T + w[p + "attn.proj.bias"]
        y = layer_norm(x, w[p + "norm2.weight"], w[p + "norm2.bias"])
        y = gelu_tanh(y @ w[p + "mlp.linear_fc1.weight"].T + w[p + "mlp.linear_fc1.bias"])
        x = x + y @ w[p + "mlp.linear_fc2.weight"].T + w[p + "mlp.linear_fc2.bias"]
    # 5. merger: LayerNorm per patch, concatenate each run of mg^2 patches, fc1, erf-GELU, fc2
    p = VISUAL + "merger."
    y = layer_norm(x, w[p + "norm.weight"], w[p + "norm.bias"]).reshape(n // (mg * mg), -1)
    y = y @ w[p + "linear_fc1.weight"].T + w[p + "linear_fc1.bias"]
    y = gelu_tanh(y) if merger_gelu_tanh else gelu_erf(y)
    return y @ w[p + "linear_fc2.weight"].T + w[p + "linear_fc2.bias"]


# ---------------------------------------------------------------- C.7 positions, C.6 placement

def mrope_positions(m, ids, grids):
    """[3, n] (T, H, W) positions; grids: (t, gh, gw) of each image in prompt order."""
    image_id = m["cfg"]["image_token_id"]
    mg = m["vcfg"]["spatial_merge_size"]
    pos = np.zeros((3, len(ids)), dtype=np.int64)
    p, i, g = 0, 0, 0
    while i < len(ids):
        if ids[i] != image_id:
            pos[:, i] = p
            p += 1
            i += 1
            continue
        _, gh, gw = grids[g]
        g += 1
        mh, mw = gh // mg, gw // mg
        for r in range(mh):
            for c in range(mw):
                if i >= len(ids) or ids[i] != image_id:
                    raise ValueError("image pad run shorter than its grid")
                pos[:, i] = (p, p + r, p + c)
                i += 1
        p += max(mh, mw)
    if g != len(grids):
        raise ValueError("more grids than image pad runs")
    return pos, p  # p: the counter for the next (decoded) token


def mrope(x, pos3, rot, theta):
    """Interleaved MRoPE (A.5.3): slot j takes its position from axis j % 3 (T, H, W);
    rotate-half over the first `rot` dims. x [n, heads, d], pos3 [3, n]."""
    half = rot // 2
    inv = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rot)
    sel = np.arange(half) % 3
    ang = np.asarray(pos3, dtype=np.float64)[sel, :].T * inv[None, :]  # [n, half]
    return text_ref.rotate_half(x, ang)


def mm_forward(m, ids, image_embeds, pos3):
    """Logits [n, V]: token embeddings with the image pad rows replaced, in order, by the
    concatenated merger outputs; decoder with MRoPE positions pos3 [3, n]."""
    c, w, pre = m["tcfg"], m["w"], m["prefix"]
    eps = c["rms_norm_eps"]
    emb = w[pre + "embed_tokens.weight"]
    h = emb[np.asarray(ids)].copy()
    slots = np.nonzero(np.asarray(ids) == m["cfg"]["image_token_id"])[0]
    feats = np.concatenate(image_embeds, axis=0) if image_embeds else np.zeros((0, h.shape[1]))
    if len(slots) != feats.shape[0]:
        raise ValueError(f"{len(slots)} image pad tokens but {feats.shape[0]} image embeddings")
    h[slots] = feats
    tm = dict(cfg=c, prefix=pre, w=w)
    for L, kind in enumerate(c["layer_types"]):
        p = pre + f"layers.{L}."
        x = text_ref.rms1p(h, w[p + "input_layernorm.weight"], eps)
        h = h + (text_ref.deltanet(tm, L, x) if kind == "linear_attention"
                 else text_ref.attention(tm, L, x, lambda y, r, th: mrope(y, pos3, r, th)))
        x = text_ref.rms1p(h, w[p + "post_attention_layernorm.weight"], eps)
        mg_, mu = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (text_ref.silu(mg_) * mu) @ w[p + "mlp.down_proj.weight"].T
    h = text_ref.rms1p(h, w[pre + "norm.weight"], eps)
    return h @ w.get("lm_head.weight", emb).T


def main():
    for d in sys.argv[1:]:
        m = load(d)
        ref = os.path.join(d, "ref")
        meta = json.load(open(os.path.join(ref, "meta.json")))
        images = os.path.join(os.path.dirname(os.path.abspath(d)), "images")
        embeds = []
        for im in meta["images"]:
            k = im["index"]
            grid = json.load(open(os.path.join(ref, f"image_{k}.grid.json")))
            grid = (grid["t"], grid["h"], grid["w"])
            pix = np.fromfile(os.path.join(ref, f"image_{k}.pixels"), dtype="<f4").reshape(
                grid[1] * grid[2], -1)
            mine_pix, mine_grid, _ = preprocess(m, os.path.join(images, f"image_{k}.png"))
            hf = np.fromfile(os.path.join(ref, f"image_{k}.embeds"), dtype="<f4").reshape(
                -1, m["vcfg"]["out_hidden_size"])
            mine = vision_forward(m, pix, grid)
            embeds.append(mine)
            print(f"{d} image_{k} grid {grid}: grid equal {mine_grid == grid}, pixels max|d| "
                  f"{np.abs(mine_pix - pix).max():.2e}, embeds max|d| {np.abs(mine - hf).max():.2e}")
        for pm in meta["prompts"]:
            i = pm["index"]
            ids = [int(t) for t in open(os.path.join(ref, f"mm_prompt_{i}.ids")).read().split()]
            grids = [tuple(meta["images"][k]["grid_thw"]) for k in pm["images"]]
            pos, _ = mrope_positions(m, ids, grids)
            hf_pos = np.fromfile(os.path.join(ref, f"mm_prompt_{i}.pos3"), dtype="<i4").reshape(3, -1)
            hf = np.fromfile(os.path.join(ref, f"mm_prompt_{i}.logits"), dtype="<f4").reshape(len(ids), -1)
            mine = mm_forward(m, ids, [embeds[k] for k in pm["images"]], pos)
            print(f"{d} mm_prompt_{i} len {len(ids)}: pos3 equal {np.array_equal(pos, hf_pos)}, "
                  f"logits max|d| {np.abs(mine - hf).max():.2e}, "
                  f"argmax equal {np.array_equal(mine.argmax(-1), hf.argmax(-1))}")


if __name__ == "__main__":
    main()
