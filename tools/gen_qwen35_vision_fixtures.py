#!/usr/bin/env python3
"""Generate tiny random Qwen3.5 vision-language checkpoints and Hugging Face references.

Image -> Qwen2-VL image processor -> vision tower -> merger outputs placed at the image pad
tokens -> text decoder with MRoPE positions: every stage is recorded in float32 so that the C
implementation can be checked stage by stage. Deterministic: fixed seeds, one CPU thread,
eager attention, pure-torch gated-delta code (hub/FLA kernels are refused), float32
references from the stored weights reloaded and upcast.

Usage (from the repository root; needs torch, torchvision, transformers >= 5.2, Pillow):
    python3 tools/gen_qwen35_vision_fixtures.py [--out tests/fixtures/qwen35_vision]
                                                [--skip-numpy-check]

Layout (see tools/README.md):
    images/image_<k>.png                         the test pictures (shared by the models)
    <model>/config.json, model.safetensors, preprocessor_config.json
    <model>/ref/image_<k>.{pixels,grid.json,resized.rgb,embeds}
    <model>/ref/mm_prompt_<i>.{ids,images,pos3,logits}, mm_greedy_<i>.txt, meta.json
    VERSIONS.json
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np
import PIL
import torch
from PIL import Image
from safetensors import safe_open

import transformers
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

sys.dont_write_bytecode = True  # keep tools/ free of __pycache__
from fixture_common import fresh_fixture_dir, top2_gaps, write_ids  # noqa: E402
from gen_qwen35_fixtures import (CONFIG_COMMON, CallCounter, load_reference, remember_f32,  # noqa: E402
                                 to_save_dtype)

SEED = 20260521
GREEDY_NEW_TOKENS = 20
PROMPT_MIN_GAP = 1e-2   # every position of every mm prompt
GREEDY_MIN_GAP = 5e-2   # every greedy step
MAX_DRAWS = 300
MAX_INIT_ATTEMPTS = 20
MAX_TOTAL_BYTES = 1_700_000

# Test pictures, (width, height) as PIL reports them, and why each is there.
IMAGES = [
    ((37, 23), "plain rounding of both sides"),
    ((20, 48), "width 20/8 = 2.5 rounds half to even (to 2)"),
    ((90, 70), "larger than max_pixels: shrunk"),
    ((11, 9), "smaller than min_pixels: enlarged"),
]


def rope(theta, factor, section):
    return dict(rope_type="default", rope_theta=theta, partial_rotary_factor=factor,
                mrope_section=section, mrope_interleaved=True)


def specials(vocab):
    # Inside the small vocabulary, in the published order (start, end, image pad, video pad).
    return dict(vision_start_token_id=vocab - 4, vision_end_token_id=vocab - 3,
                image_token_id=vocab - 2, video_token_id=vocab - 1)


# Prompt layouts: ("text", n random ids) or ("image", k) = vision_start, k's pads, vision_end.
MODELS = [
    dict(
        name="tiny_v_f32",
        save_dtype="float32",
        text=dict(
            vocab_size=512, hidden_size=64, intermediate_size=48, num_hidden_layers=4,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            num_attention_heads=2, num_key_value_heads=1, head_dim=32,
            linear_num_key_heads=2, linear_num_value_heads=2,
            linear_key_head_dim=16, linear_value_head_dim=16,
            tie_word_embeddings=True,
            rope_parameters=rope(10000.0, 0.5, [3, 3, 2]),
        ),
        vision=dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=4,
                    temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16),
        processor=dict(patch_size=4, merge_size=2, temporal_patch_size=2,
                       size=dict(shortest_edge=256, longest_edge=2048),
                       image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]),
        prompts=[
            [("text", 4), ("image", 0), ("text", 5)],
            # 5 + 17 + 30 = 52: image 1's pads are positions 53..64, across the 64-token chunk
            [("text", 5), ("image", 0), ("text", 30), ("image", 1), ("text", 4)],
            [("image", 2), ("text", 3)],
        ],
        notes="vision depth 2, hidden 32, 2 heads (head_dim 16: 4 rotary frequencies per axis), "
              "patch 4, learned 4x4 position grid; text L F L F, head_dim 32, 16 rotary dims "
              "(8 MRoPE slots, section [3,3,2], theta 1e4), tied; processor min/max pixels "
              "256/2048, mean/std 0.5",
    ),
    dict(
        name="tiny_v_bf16",
        save_dtype="bfloat16+f32",
        text=dict(
            vocab_size=192, hidden_size=48, intermediate_size=48, num_hidden_layers=3,
            layer_types=["linear_attention", "linear_attention", "full_attention"],
            num_attention_heads=4, num_key_value_heads=1, head_dim=32,
            linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=16,
            tie_word_embeddings=True,
            rope_parameters=rope(1000000.0, 0.5, [2, 3, 3]),
        ),
        vision=dict(depth=1, hidden_size=32, num_heads=4, intermediate_size=96, patch_size=8,
                    temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=36),
        processor=dict(patch_size=8, merge_size=2, temporal_patch_size=2,
                       size=dict(shortest_edge=512, longest_edge=2048),
                       image_mean=list(OPENAI_CLIP_MEAN), image_std=list(OPENAI_CLIP_STD)),
        prompts=[
            [("text", 4), ("image", 0), ("text", 5)],
            [("text", 5), ("image", 0), ("text", 20), ("image", 1), ("text", 6)],
            [("image", 2), ("text", 3)],
        ],
        notes="BF16 tensors (linear_attn.A_log and linear_attn.norm.weight F32, as published); "
              "vision depth 1, hidden 32, 4 heads (head_dim 8: 2 rotary frequencies per axis), "
              "patch 8, learned 6x6 grid; text hidden 48, L L F, 4q/1kv heads, Hv = 2 Hk, "
              "MRoPE section [2,3,3] (HF still gives T 3 slots: see mrope_slot_axes), theta 1e6; "
              "processor min/max pixels 512/2048, OpenAI CLIP mean/std",
    ),
]


# ---------------------------------------------------------------- kernels

# ---------------------------------------------------------------- pictures

def picture(rng, w, h):
    """Gradients, a ring, a diagonal band, hard-edged blocks and mild noise."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([255 * x / max(w - 1, 1), 255 * y / max(h - 1, 1),
                    127.5 + 127.5 * np.sin((x + 2 * y) / 4.0)], -1)
    ring = np.hypot(x - w * 0.45, y - h * 0.55)
    img[(ring > h / 6) & (ring < h / 3)] = [240, 30, 40]
    img[np.abs(x - y * w / h) < 1.5] = [20, 200, 60]
    img[: max(h // 4, 1), w - max(w // 4, 1):] = [0, 0, 0]
    img[h - max(h // 5, 1):, : max(w // 5, 1)] = [255, 255, 255]
    img += rng.normal(0, 6, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


# ---------------------------------------------------------------- model

def build_config(spec):
    tk = dict(CONFIG_COMMON)
    tk.update(spec["text"])
    vk = dict(spec["vision"], out_hidden_size=tk["hidden_size"])
    return Qwen3_5Config(text_config=tk, vision_config=vk,
                         tie_word_embeddings=tk["tie_word_embeddings"],
                         **specials(tk["vocab_size"]))


def randomize(model, gen):
    """Larger-than-default random values, so that every parameter matters numerically, vision
    activations are far from degenerate and the logits are well separated."""

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean

    def uniform(shape, lo, hi):
        return torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo

    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.startswith("model.visual."):
                if name.endswith("pos_embed.weight"):
                    new = normal(p.shape, 0.6)
                elif ("norm" in name) and name.endswith(".weight"):
                    new = uniform(p.shape, 0.6, 1.4)
                elif name.endswith(".bias"):
                    new = normal(p.shape, 0.1)
                elif name.endswith("patch_embed.proj.weight"):
                    new = normal(p.shape, 1.5 * int(np.prod(p.shape[1:])) ** -0.5)
                elif name.endswith("attn.qkv.weight"):
                    new = normal(p.shape, 1.6 * p.shape[1] ** -0.5)
                elif p.dim() == 2:
                    new = normal(p.shape, 1.0 * p.shape[1] ** -0.5)
                else:
                    raise RuntimeError(f"no init rule for {name} {tuple(p.shape)}")
            elif name.endswith("embed_tokens.weight") or name == "lm_head.weight":
                new = normal(p.shape, 0.25)
            elif name.endswith("linear_attn.A_log"):
                new = uniform(p.shape, -3.0, 1.0)
            elif name.endswith("linear_attn.dt_bias"):
                new = normal(p.shape, 0.7, -0.5)
            elif name.endswith("linear_attn.conv1d.weight"):
                new = normal(p.shape, 0.4)
            elif name.endswith("linear_attn.norm.weight"):
                new = uniform(p.shape, 0.5, 1.5)  # gated RMSNorm: plain w
            elif name.endswith("norm.weight"):
                new = uniform(p.shape, -0.5, 0.5)  # RMSNorm1p: (1 + w)
            elif p.dim() == 2:
                new = normal(p.shape, min(0.2, max(0.05, p.shape[1] ** -0.5)))
            else:
                raise RuntimeError(f"no init rule for {name} {tuple(p.shape)}")
            p.copy_(new)


def hf_slot_axes(ref):
    """Which of T/H/W each MRoPE frequency slot takes, read off HF's own recomposition."""
    rot = ref.model.language_model.rotary_emb
    half = rot.inv_freq.shape[0]
    tagged = torch.arange(3, dtype=torch.float32).view(3, 1, 1, 1).expand(3, 1, 1, half).clone()
    out = rot.recomposition_frequencies(tagged)[0, 0, :half]
    return "".join("THW"[int(v)] for v in out.tolist())


# ---------------------------------------------------------------- processor

def unpatchify(pv, grid, p, mg, tp):
    """Processor patch vectors [N, 3*tp*p*p] -> the resized image [h', w', 3] (frame 0)."""
    _, gh, gw = grid
    x = np.asarray(pv, dtype=np.float64).reshape(gh // mg, gw // mg, mg, mg, 3, tp, p, p)[:, :, :, :, :, 0]
    # (br, bc, ir, ic, ch, y, x) -> (br, ir, y, bc, ic, x, ch)
    return x.transpose(0, 2, 5, 1, 3, 6, 4).reshape(gh * p, gw * p, 3)


def process(proc, img, **kw):
    out = proc(images=img, return_tensors="pt", **kw)
    pv = out["pixel_values"]
    grid = tuple(int(v) for v in out["image_grid_thw"][0].tolist())
    return pv, grid


def pixel_recipes(resized_u8, pre):
    """The exact float32 arithmetic of each backend, from the resized uint8 image (HWC)."""
    u8 = resized_u8.astype(np.uint8)
    mean = np.asarray(pre["image_mean"], dtype=np.float32)
    std = np.asarray(pre["image_std"], dtype=np.float32)
    # PIL backend: float32(p * rescale in float64), then (x - mean) / std in float32
    x = (u8.astype(np.float64) * pre["rescale_factor"]).astype(np.float32)
    pil = ((x - mean) / std).astype(np.float32)
    # torchvision backend (fused): (float32(p) - mean/rescale) / (std/rescale) in float32, the
    # two constants formed in float32 as mean * float32(1/rescale)
    inv = np.float32(1.0 / pre["rescale_factor"])
    tv = ((u8.astype(np.float32) - mean * inv) / (std * inv)).astype(np.float32)
    return pil, tv


def patchify_np(img_hwc, grid, p, mg, tp):
    _, gh, gw = grid
    x = img_hwc.transpose(2, 0, 1).reshape(3, gh // mg, mg, p, gw // mg, mg, p)
    x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # (br, bc, ir, ic, ch, y, x)
    x = np.broadcast_to(x[:, :, :, :, :, None], x.shape[:5] + (tp,) + x.shape[5:])
    return x.reshape(gh * gw, -1)


def record_images(spec, mdir, refdir, imgdir, ref, npm):
    pre = json.load(open(os.path.join(mdir, "preprocessor_config.json")))
    p, mg, tp = pre["patch_size"], pre["merge_size"], pre["temporal_patch_size"]
    pil_proc = Qwen2VLImageProcessorPil.from_pretrained(mdir)
    tv_proc = transformers.AutoImageProcessor.from_pretrained(mdir)
    if tv_proc.backend != "torchvision":
        raise RuntimeError(f"default backend is {tv_proc.backend}")
    hidden = ref.config.text_config.hidden_size
    images = []
    pvs, grids, embeds = [], [], []
    for k, ((w, h), why) in enumerate(IMAGES):
        png = os.path.join(imgdir, f"image_{k}.png")
        img = Image.open(png)
        img.load()
        if img.mode != "RGB" or img.size != (w, h):
            raise RuntimeError(f"{png}: {img.mode} {img.size}")
        pv, grid = process(pil_proc, img)
        pv_tv, grid_tv = process(tv_proc, img)
        if grid != grid_tv:
            raise RuntimeError(f"image {k}: grids differ between backends {grid} {grid_tv}")
        if pv.dtype != torch.float32 or pv.shape != (grid[1] * grid[2], 3 * tp * p * p):
            raise RuntimeError(f"image {k}: pixel_values {pv.dtype} {tuple(pv.shape)}")
        # resized uint8 images of both backends (no rescale / normalise), and plain PIL resize
        raw_pil, _ = process(pil_proc, img, do_rescale=False, do_normalize=False)
        raw_tv, _ = process(tv_proc, img, do_rescale=False, do_normalize=False)
        rs_pil = unpatchify(raw_pil.numpy(), grid, p, mg, tp)
        rs_tv = unpatchify(raw_tv.numpy(), grid, p, mg, tp)
        hh, ww = grid[1] * p, grid[2] * p
        plain = np.asarray(img.resize((ww, hh), Image.BICUBIC), dtype=np.float64)
        if not np.array_equal(rs_pil, np.rint(rs_pil)) or rs_pil.min() < 0 or rs_pil.max() > 255:
            raise RuntimeError(f"image {k}: PIL-backend resize is not uint8 data")
        rs_u8 = rs_pil.astype(np.uint8)
        rs_u8.tofile(os.path.join(refdir, f"image_{k}.resized.rgb"))
        # the exact float32 recipes reproduce both backends' pixel_values bit for bit
        rec_pil = patchify_np(pixel_recipes(rs_u8, pre)[0], grid, p, mg, tp)
        pil_exact = bool(np.array_equal(rec_pil, pv.numpy()))
        # torchvision pixels from its own resize through its own recipe
        rec_tv_own = patchify_np(pixel_recipes(rs_tv.astype(np.uint8), pre)[1], grid, p, mg, tp)
        tv_exact = bool(np.array_equal(rec_tv_own, pv_tv.numpy()))
        if not pil_exact:
            raise RuntimeError(f"image {k}: PIL pixel recipe not bit-exact "
                               f"({np.abs(rec_pil - pv.numpy()).max()})")

        pv.numpy().astype("<f4").tofile(os.path.join(refdir, f"image_{k}.pixels"))
        with open(os.path.join(refdir, f"image_{k}.grid.json"), "w") as f:
            json.dump(dict(t=grid[0], h=grid[1], w=grid[2]), f)
            f.write("\n")
        g = torch.tensor([grid])
        with torch.no_grad():
            emb = ref.model.visual(pv, grid_thw=g).pooler_output.float()
            emb_tv = ref.model.visual(pv_tv, grid_thw=g).pooler_output.float()
        n_tok = grid[1] * grid[2] // (mg * mg)
        if emb.shape != (n_tok, hidden):
            raise RuntimeError(f"image {k}: embeds {tuple(emb.shape)}")
        emb.numpy().astype("<f4").tofile(os.path.join(refdir, f"image_{k}.embeds"))
        pvs.append(pv)
        grids.append(grid)
        embeds.append(emb)

        d_tv = (rs_tv - rs_pil)
        info = dict(
            index=k, png=f"../../images/image_{k}.png", why=why, size_wh=[w, h],
            smart_resize_hw=[hh, ww], grid_thw=list(grid), patches=grid[1] * grid[2],
            merged_hw=[grid[1] // mg, grid[2] // mg], image_tokens=n_tok,
            embeds_std=float(emb.std()), embeds_max_abs=float(emb.abs().max()),
            embeds_min_row_distance=min_row_distance(emb),
            pil_backend_resize_equals_plain_pil_resize=bool(np.array_equal(rs_pil, plain)),
            pil_recipe_bit_exact=pil_exact,
            torchvision=dict(
                resize_max_abs_diff_vs_pil_u8=int(np.abs(d_tv).max()),
                resize_bytes_differing=int((d_tv != 0).sum()),
                resize_bytes_total=int(d_tv.size),
                pixel_values_max_abs_diff_vs_pil=float((pv_tv - pv).abs().max()),
                pixel_values_max_abs_diff_same_resize=float(np.abs(
                    patchify_np(pixel_recipes(rs_u8, pre)[1], grid, p, mg, tp) - pv.numpy()).max()),
                recipe_bit_exact=tv_exact,
                embeds_max_abs_diff_vs_pil_pixels=float((emb_tv - emb).abs().max()),
            ),
        )
        if npm is not None:
            import qwen35_vision_numpy_ref as vref
            mine_pix, mine_grid, mine_rs = vref.preprocess(npm, png)
            mine = vref.vision_forward(npm, pv.numpy(), grid)
            err = float(np.abs(mine - emb.numpy()).max())
            info["numpy_float64"] = dict(
                grid_equal=tuple(mine_grid) == grid,
                resized_equal=bool(np.array_equal(mine_rs, rs_u8)),
                pixels_max_abs_diff=float(np.abs(mine_pix - pv.numpy()).max()),
                embeds_max_abs_diff=err,
                embeds_max_abs_diff_rel=err / float(emb.abs().max()),
            )
            if not info["numpy_float64"]["grid_equal"] or err > 1e-4 * max(1.0, float(emb.abs().max())):
                raise RuntimeError(f"image {k}: numpy vision check failed {info['numpy_float64']}")
        images.append(info)

    # all images through the tower in one call (one attention segment each) == one by one
    with torch.no_grad():
        joint = ref.model.visual(torch.cat(pvs), grid_thw=torch.tensor(grids)).pooler_output.float()
    joint_diff = float((joint - torch.cat(embeds)).abs().max())
    return images, pvs, grids, embeds, joint_diff, pre


def min_row_distance(e):
    d = torch.cdist(e, e) + torch.eye(e.shape[0]) * 1e9
    return float(d.min()) if e.shape[0] > 1 else None


# ---------------------------------------------------------------- prompts

def build_ids(layout, cfg, grids, draw, mg):
    ids, images = [], []
    for kind, v in layout:
        if kind == "text":
            ids += draw(v)
        else:
            _, gh, gw = grids[v]
            ids += [cfg.vision_start_token_id] + [cfg.image_token_id] * (gh * gw // (mg * mg)) \
                + [cfg.vision_end_token_id]
            images.append(v)
    return ids, images


def mm_inputs(ids, images, pvs, grids, cfg):
    t = torch.tensor([ids])
    return dict(
        input_ids=t,
        pixel_values=torch.cat([pvs[k] for k in images]),
        image_grid_thw=torch.tensor([grids[k] for k in images]),
        mm_token_type_ids=(t == cfg.image_token_id).long(),
    )


def mm_logits(ref, ids, images, pvs, grids, cfg):
    with torch.no_grad():
        out = ref(**mm_inputs(ids, images, pvs, grids, cfg), use_cache=False)
    return out.logits[0].float()


def mm_greedy(ref, ids, images, pvs, grids, cfg):
    inp = mm_inputs(ids, images, pvs, grids, cfg)
    with torch.no_grad():
        out = ref.generate(
            **inp, attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False, use_cache=True, max_new_tokens=GREEDY_NEW_TOKENS,
            min_new_tokens=GREEDY_NEW_TOKENS, pad_token_id=0, eos_token_id=None,
            return_dict_in_generate=True, output_logits=True)
    new = out.sequences[0, len(ids):].tolist()
    return new, torch.stack([x[0].float() for x in out.logits])


def pick_prompt(ref, counter, layout, cfg, pvs, grids, gen, mg):
    vocab = cfg.text_config.vocab_size
    banned = {cfg.vision_start_token_id, cfg.vision_end_token_id, cfg.image_token_id,
              cfg.video_token_id}
    n_free = vocab - 4  # the special ids are the last four

    def draw(n):
        return torch.randint(0, n_free, (n,), generator=gen).tolist()

    best = None
    for d in range(MAX_DRAWS):
        ids, images = build_ids(layout, cfg, grids, draw, mg)
        counter.take()
        logits = mm_logits(ref, ids, images, pvs, grids, cfg)
        pcalls = counter.take()
        gap = float(top2_gaps(logits).min())
        new, steps = mm_greedy(ref, ids, images, pvs, grids, cfg)
        gcalls = counter.take()
        ggap = float(top2_gaps(steps).min())
        ok_new = not (set(new) & banned)
        score = min(gap / PROMPT_MIN_GAP, ggap / GREEDY_MIN_GAP) if ok_new else -1.0
        if best is None or score > best["score"]:
            best = dict(ids=ids, images=images, logits=logits, gap=gap, new=new, steps=steps,
                        ggap=ggap, draw=d, score=score, prefill_calls=pcalls, greedy_calls=gcalls)
        if score >= 1.0:
            break
    if best["score"] < 1.0:
        raise RuntimeError(f"no decisive draw in {MAX_DRAWS}: gap {best['gap']}, greedy {best['ggap']}")
    return best


def greedy_full_recompute(ref, ids, images, pvs, grids, cfg, n):
    seq = list(ids)
    for _ in range(n):
        seq.append(int(mm_logits(ref, seq, images, pvs, grids, cfg)[-1].argmax()))
    return seq[len(ids):]


# ---------------------------------------------------------------- per model

def build_and_save(spec, mdir, seed):
    """Random model from seed, saved as the fixture checkpoint, reloaded as the reference."""
    torch.manual_seed(seed)  # default init of the throwaway values
    model = Qwen3_5ForConditionalGeneration(build_config(spec))
    randomize(model, torch.Generator().manual_seed(seed + 1))
    remember_f32(model)
    to_save_dtype(model, spec["save_dtype"])
    for fn in ("model.safetensors", "config.json"):
        if os.path.exists(os.path.join(mdir, fn)):
            os.remove(os.path.join(mdir, fn))
    model.save_pretrained(mdir)
    gc_path = os.path.join(mdir, "generation_config.json")
    if os.path.exists(gc_path):
        os.remove(gc_path)
    files = sorted(os.listdir(mdir))
    if files != ["config.json", "model.safetensors", "preprocessor_config.json", "ref"]:
        raise RuntimeError(f"{mdir}: unexpected files {files}")
    os.chmod(os.path.join(mdir, "model.safetensors"), 0o644)
    ref = load_reference("composite", mdir)
    if ref.model.visual.config._attn_implementation != "eager" or \
            ref.model.language_model.config._attn_implementation != "eager":
        raise RuntimeError(f"{mdir}: not eager attention")
    return ref


def fixed_prefix_gap(ref, spec, pix):
    """Smallest top-2 gap over the positions before the first random text id of every prompt."""
    cfg = ref.config
    mg = cfg.vision_config.spatial_merge_size
    grids = [g for _, g in pix]
    pvs = [p for p, _ in pix]
    worst = None
    for layout in spec["prompts"]:
        head = []
        for kind, v in layout:
            if kind == "text":
                break
            head.append((kind, v))
        if not head:
            continue
        ids, imgs = build_ids(head, cfg, grids, None, mg)
        gap = float(top2_gaps(mm_logits(ref, ids, imgs, pvs, grids, cfg)).min())
        worst = gap if worst is None else min(worst, gap)
    return worst


def generate_model(root, imgdir, counter, spec, idx, check_numpy):
    name = spec["name"]
    mdir = os.path.join(root, name)
    refdir = os.path.join(mdir, "ref")
    os.makedirs(refdir)

    Qwen2VLImageProcessor(**spec["processor"]).save_pretrained(mdir)
    pil_proc = Qwen2VLImageProcessorPil.from_pretrained(mdir)
    pix = [process(pil_proc, Image.open(os.path.join(imgdir, f"image_{k}.png")))
           for k in range(len(IMAGES))]
    # The logits of a prompt that opens with an image do not depend on the random text ids up
    # to its vision_end, so no prompt redraw can widen their gaps: the weights are redrawn
    # instead (a new init seed) until those positions are decisive too.
    for attempt in range(MAX_INIT_ATTEMPTS):
        ref = build_and_save(spec, mdir, SEED + 1000 * idx + 10 * attempt)
        prefix_gap = fixed_prefix_gap(ref, spec, pix)
        if prefix_gap is None or prefix_gap >= PROMPT_MIN_GAP:
            break
    else:
        raise RuntimeError(f"{name}: no init with decisive fixed-prefix gaps")
    cfg = ref.config
    tcfg, vcfg = cfg.text_config, cfg.vision_config
    mg = vcfg.spatial_merge_size

    npm = None
    if check_numpy:
        import qwen35_vision_numpy_ref as vref
        npm = vref.load(mdir)

    images, pvs, grids, embeds, joint_diff, pre = record_images(spec, mdir, refdir, imgdir, ref, npm)

    gen = torch.Generator().manual_seed(SEED + 1000 * idx + 2)
    prompts, greedy_meta = [], []
    for i, layout in enumerate(spec["prompts"]):
        b = pick_prompt(ref, counter, layout, cfg, pvs, grids, gen, mg)
        ids, imgs = b["ids"], b["images"]
        n = len(ids)
        if b["prefill_calls"]["torch_chunk_gated_delta_rule"] == 0 or \
                b["prefill_calls"]["torch_recurrent_gated_delta_rule"] != 0:
            raise RuntimeError(f"{name}: prefill kernel calls {b['prefill_calls']}")
        if b["greedy_calls"]["torch_recurrent_gated_delta_rule"] == 0 or \
                b["greedy_calls"]["causal_conv1d_update"] == 0:
            raise RuntimeError(f"{name}: decode did not use the recurrent path {b['greedy_calls']}")
        inp = mm_inputs(ids, imgs, pvs, grids, cfg)
        pos3, delta = ref.model.get_rope_index(inp["input_ids"], inp["mm_token_type_ids"],
                                               image_grid_thw=inp["image_grid_thw"])
        pos3 = pos3[:, 0, :]
        delta = int(delta[0, 0])
        write_ids(os.path.join(refdir, f"mm_prompt_{i}.ids"), ids)
        write_ids(os.path.join(refdir, f"mm_prompt_{i}.images"), imgs)
        pos3.numpy().astype("<i4").tofile(os.path.join(refdir, f"mm_prompt_{i}.pos3"))
        b["logits"].numpy().astype("<f4").tofile(os.path.join(refdir, f"mm_prompt_{i}.logits"))
        with open(os.path.join(refdir, f"mm_greedy_{i}.txt"), "w") as f:
            f.write(" ".join(map(str, ids)) + "\n" + " ".join(map(str, b["new"])) + "\n")

        # cached greedy vs plain full recomputation; decode positions = cache_len + rope_delta
        full_new = greedy_full_recompute(ref, ids, imgs, pvs, grids, cfg, GREEDY_NEW_TOKENS)
        if full_new != b["new"]:
            raise RuntimeError(f"{name}: cached greedy {b['new']} != full recompute {full_new}")
        full = mm_logits(ref, ids + b["new"], imgs, pvs, grids, cfg)[n - 1:n - 1 + GREEDY_NEW_TOKENS]
        inp_full = mm_inputs(ids + b["new"], imgs, pvs, grids, cfg)
        pos_full, _ = ref.model.get_rope_index(inp_full["input_ids"], inp_full["mm_token_type_ids"],
                                               image_grid_thw=inp_full["image_grid_thw"])
        decode_pos = pos_full[:, 0, n:]
        expect = torch.arange(n, n + GREEDY_NEW_TOKENS) + delta
        if not all(torch.equal(decode_pos[a], expect) for a in range(3)):
            raise RuntimeError(f"{name}: decode positions are not cache_len + rope_delta")
        if int(pos3.max()) + 1 != n + delta:
            raise RuntimeError(f"{name}: rope_delta inconsistent")
        # prompt logits through the joint image run == the per-image embeds placed by hand
        with torch.no_grad():
            emb_in = ref.model.get_input_embeddings()(inp["input_ids"]).clone()
            slots = (inp["input_ids"][0] == cfg.image_token_id).nonzero()[:, 0]
            emb_in[0, slots] = torch.cat([embeds[k] for k in imgs])
            by_hand = ref(inputs_embeds=emb_in, position_ids=pos3[:, None, :],
                          use_cache=False).logits[0].float()
        placed_diff = float((by_hand - b["logits"]).abs().max())

        pm = dict(index=i, length=n, images=imgs,
                  layout=[list(x) for x in layout],
                  image_pad_runs=[[int(s), int(s) + grids[k][1] * grids[k][2] // (mg * mg)]
                                  for s, k in zip(run_starts(ids, cfg.image_token_id), imgs)],
                  rope_delta=delta, next_position=n + delta,
                  min_top2_gap=b["gap"], redraws=b["draw"],
                  max_abs_logit=float(b["logits"].abs().max()), logit_std=float(b["logits"].std()),
                  max_abs_diff_vs_embeds_placed_by_hand=placed_diff)
        gm = dict(index=i, prompt_length=n, new_tokens=GREEDY_NEW_TOKENS,
                  method="model.generate(input_ids, attention_mask, pixel_values, image_grid_thw, "
                         "mm_token_type_ids, do_sample=False, use_cache=True); checked against "
                         "full-sequence recomputation without cache",
                  decode_positions="T = H = W = cache_len + rope_delta "
                                   f"= {n + delta} .. {n + delta + GREEDY_NEW_TOKENS - 1}",
                  min_top2_gap=b["ggap"],
                  max_abs_diff_cached_vs_full_logits=float((full - b["steps"]).abs().max()),
                  kernel_calls=b["greedy_calls"])
        if npm is not None:
            import qwen35_vision_numpy_ref as vref
            np_embeds = [vref.vision_forward(npm, pvs[k].numpy(), grids[k]) for k in imgs]
            mine_pos, counter_next = vref.mrope_positions(npm, ids, [grids[k] for k in imgs])
            mine = vref.mm_forward(npm, ids, np_embeds, mine_pos)
            hf = b["logits"].numpy().astype(np.float64)
            ok_pos = bool(np.array_equal(mine_pos, pos3.numpy()))
            ok_arg = bool(np.array_equal(mine.argmax(-1), hf.argmax(-1)))
            full_np = vref.mm_forward(
                npm, ids + b["new"], np_embeds,
                np.concatenate([mine_pos, np.tile(np.arange(GREEDY_NEW_TOKENS) + counter_next,
                                                  (3, 1))], axis=1))
            pred = full_np[n - 1:n - 1 + GREEDY_NEW_TOKENS].argmax(-1).tolist()
            pm["numpy_float64"] = dict(pos3_equal=ok_pos, next_position_equal=counter_next == n + delta,
                                       logits_max_abs_diff=float(np.abs(mine - hf).max()),
                                       argmax_equal=ok_arg, greedy_argmax_equal=pred == b["new"])
            if not (ok_pos and ok_arg and pred == b["new"] and counter_next == n + delta) or \
                    pm["numpy_float64"]["logits_max_abs_diff"] > 2e-3:
                raise RuntimeError(f"{name}: numpy mm check failed {pm['numpy_float64']}")
        prompts.append(pm)
        greedy_meta.append(gm)

    sens = sensitivity(npm, spec, pvs, grids, embeds, refdir, prompts, cfg) if npm else None

    with safe_open(os.path.join(mdir, "model.safetensors"), "pt") as f:
        stored = {}
        for key in f.keys():
            dt = str(f.get_slice(key).get_dtype())
            stored[dt] = stored.get(dt, 0) + 1
    rp = tcfg.rope_parameters
    rot = int(tcfg.head_dim * rp["partial_rotary_factor"])
    slot_axes = hf_slot_axes(ref)
    meta = dict(
        model=name,
        architecture=cfg.architectures[0],
        weight_dtype=spec["save_dtype"],
        init_seed=SEED + 1000 * idx + 10 * attempt,
        init_redraws=attempt,
        fixed_prefix_min_top2_gap=prefix_gap,
        stored_tensor_dtypes=stored,
        safetensors_bytes=os.path.getsize(os.path.join(mdir, "model.safetensors")),
        special_ids=dict(vision_start=cfg.vision_start_token_id, vision_end=cfg.vision_end_token_id,
                         image_pad=cfg.image_token_id, video_pad=cfg.video_token_id),
        vision=dict(depth=vcfg.depth, hidden_size=vcfg.hidden_size, num_heads=vcfg.num_heads,
                    head_dim=vcfg.hidden_size // vcfg.num_heads,
                    intermediate_size=vcfg.intermediate_size, patch_size=vcfg.patch_size,
                    temporal_patch_size=vcfg.temporal_patch_size, spatial_merge_size=mg,
                    num_position_embeddings=vcfg.num_position_embeddings,
                    position_grid_side=int(round(vcfg.num_position_embeddings ** 0.5)),
                    out_hidden_size=vcfg.out_hidden_size,
                    rope_theta=vcfg.rope_parameters["rope_theta"],
                    rotary_frequencies_per_axis=vcfg.hidden_size // vcfg.num_heads // 4,
                    hidden_act=vcfg.hidden_act),
        text=dict(vocab_size=tcfg.vocab_size, hidden_size=tcfg.hidden_size,
                  layer_types=list(tcfg.layer_types), head_dim=tcfg.head_dim,
                  rotary_dims=rot, mrope_section=list(rp["mrope_section"]),
                  mrope_interleaved=rp["mrope_interleaved"], rope_theta=rp["rope_theta"],
                  mrope_slot_axes=slot_axes,
                  mrope_slot_axes_equal_spec_j_mod_3=slot_axes == "".join(
                      "THW"[j % 3] for j in range(rot // 2)),
                  tie_word_embeddings=bool(tcfg.tie_word_embeddings)),
        processor={k: pre[k] for k in ("patch_size", "merge_size", "temporal_patch_size", "size",
                                       "image_mean", "image_std", "rescale_factor", "resample")},
        reference_compute="float32 (stored weights upcast exactly), eager attention (vision and "
                          "text), torch chunked gated delta for prefill, recurrent for decode; "
                          "pixel_values from the PIL-backend image processor",
        formats=FORMATS,
        pixel_arithmetic=dict(
            pil_backend="x = float32(p * rescale_factor) with the product in float64; "
                        "v = (x - float32(mean[c])) / float32(std[c]) in float32",
            torchvision_backend="v = (float32(p) - m) / s in float32, m = float32(mean[c]) * "
                                "float32(1/rescale_factor), s likewise with std"),
        images=images,
        joint_vision_call_max_abs_diff_vs_per_image=joint_diff,
        prompts=prompts,
        min_top2_gap=min(p["min_top2_gap"] for p in prompts),
        greedy=greedy_meta,
        greedy_min_top2_gap=min(g["min_top2_gap"] for g in greedy_meta),
        sensitivity_numpy_float64=sens,
        notes=spec["notes"],
    )
    with open(os.path.join(refdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return meta


def run_starts(ids, tok):
    return [i for i, t in enumerate(ids) if t == tok and (i == 0 or ids[i - 1] != tok)]


def sensitivity(npm, spec, pvs, grids, embeds, refdir, prompts, cfg):
    """How far typical mistakes move the recorded outputs (float64 numpy): each must be far
    above the float32 noise for the fixtures to catch it."""
    import qwen35_vision_numpy_ref as vref
    variants = dict(
        pos_embed_align_corners_false=dict(align_corners=False),
        vision_rope_row_col_swapped=dict(swap_rope_axes=True),
        merger_gelu_tanh_instead_of_erf=dict(merger_gelu_tanh=True),
        patch_coords_raster_order=dict(raster_coords=True),
    )
    out = {}
    p = max(prompts, key=lambda q: len(q["images"]))
    ids = [int(t) for t in open(os.path.join(refdir, f"mm_prompt_{p['index']}.ids")).read().split()]
    hf = np.fromfile(os.path.join(refdir, f"mm_prompt_{p['index']}.logits"), dtype="<f4").reshape(len(ids), -1)
    pos, _ = vref.mrope_positions(npm, ids, [grids[k] for k in p["images"]])
    for vname, kw in variants.items():
        em = [vref.vision_forward(npm, pvs[k].numpy(), grids[k], **kw) for k in range(len(grids))]
        d_emb = max(float(np.abs(em[k] - embeds[k].numpy()).max()) for k in range(len(grids)))
        lg = vref.mm_forward(npm, ids, [em[k] for k in p["images"]], pos)
        out[vname] = dict(embeds_max_abs_diff=d_emb, prompt_logits_max_abs_diff=float(np.abs(lg - hf).max()))
    good = [vref.vision_forward(npm, pvs[k].numpy(), grids[k]) for k in p["images"]]
    n = len(ids)
    for vname, pp in (("text_positions_1d", np.tile(np.arange(n), (3, 1))),
                      ("image_positions_without_counter_jump", None)):
        if pp is None:  # every token (image ones too) T = running index, H/W offsets kept
            pp = pos.copy()
            off = pp - pp[0:1]
            pp[0] = np.arange(n)
            pp[1:] = np.arange(n) + off[1:]
        lg = vref.mm_forward(npm, ids, good, pp)
        out[vname] = dict(prompt_logits_max_abs_diff=float(np.abs(lg - hf).max()))
    out["prompt"] = p["index"]
    return out


FORMATS = {
    "../../images/image_<k>.png": "the test picture (8-bit RGB PNG), shared by both models",
    "image_<k>.pixels": "float32 LE [N][3*T*p*p], N = grid h*w patches in the processor's order "
                        "(2x2 merge blocks in raster order, the 4 patches of a block consecutive: "
                        "(block_row, block_col, in_row, in_col)); inside a vector "
                        "(channel, frame, y, x), both frames identical; PIL backend",
    "image_<k>.grid.json": '{"t","h","w"}: image_grid_thw (patch grid, not merged)',
    "image_<k>.resized.rgb": "uint8 [h'][w'][3]: the PIL-backend resize (before rescale/normalise)",
    "image_<k>.embeds": "float32 LE [N/4][text hidden]: model.visual(pixels, grid).pooler_output "
                        "(the merger output), merged raster order",
    "mm_prompt_<i>.ids": "text, space-separated token ids (fixture_common.write_ids)",
    "mm_prompt_<i>.images": "text, space-separated image indices k in prompt order",
    "mm_prompt_<i>.pos3": "int32 LE [3][n]: T row, H row, W row (HF get_rope_index)",
    "mm_prompt_<i>.logits": "float32 LE [n][vocab], every position, no cache",
    "mm_greedy_<i>.txt": "line 1 the prompt ids (= mm_prompt_<i>.ids), line 2 the 20 ids "
                         "generated greedily with the cache",
}


def write_versions(root, args, summary, seconds):
    import torchvision
    import safetensors
    cmd = "python3 tools/gen_qwen35_vision_fixtures.py"
    if args.skip_numpy_check:
        cmd += " --skip-numpy-check"
    versions = dict(transformers=transformers.__version__, torch=torch.__version__,
                    torchvision=torchvision.__version__, numpy=np.__version__,
                    Pillow=PIL.__version__, safetensors=safetensors.__version__,
                    python=platform.python_version(),
                    command=cmd + " (run from the repository root)", seed=SEED,
                    models=[m["model"] for m in summary])
    with open(os.path.join(root, "VERSIONS.json"), "w") as f:
        json.dump(versions, f, indent=2)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(d, fn)) for d, _, fs in os.walk(root) for fn in fs)
    print(f"total fixture size: {total} bytes, {seconds:.1f} s")
    if total > MAX_TOTAL_BYTES:
        raise RuntimeError(f"fixtures are {total} bytes")


def main():
    t0 = time.time()
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(repo, "tests", "fixtures", "qwen35_vision"))
    ap.add_argument("--skip-numpy-check", action="store_true",
                    help="skip the float64 cross-check against tools/qwen35_vision_numpy_ref.py")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if torch.cuda.is_available():
        print("note: CUDA is visible; everything here runs on the CPU")
    counter = CallCounter()

    root = fresh_fixture_dir(args.out)
    imgdir = os.path.join(root, "images")
    os.makedirs(imgdir)
    rng = np.random.default_rng(SEED)
    for k, ((w, h), _) in enumerate(IMAGES):
        Image.fromarray(picture(rng, w, h), "RGB").save(
            os.path.join(imgdir, f"image_{k}.png"), "PNG", compress_level=9)

    summary = []
    for idx, spec in enumerate(MODELS):
        meta = generate_model(root, imgdir, counter, spec, idx, not args.skip_numpy_check)
        summary.append(meta)
        print(f"{meta['model']:12s} {meta['safetensors_bytes']:>8d} B  mrope slots "
              f"{meta['text']['mrope_slot_axes']}  min gap {meta['min_top2_gap']:.4g}  greedy min gap "
              f"{meta['greedy_min_top2_gap']:.4g}")
        for im in meta["images"]:
            nf = im.get("numpy_float64", {})
            tv = im["torchvision"]
            print(f"    image {im['index']} {im['size_wh'][0]}x{im['size_wh'][1]} -> "
                  f"{im['smart_resize_hw'][1]}x{im['smart_resize_hw'][0]} grid {im['grid_thw']} "
                  f"tokens {im['image_tokens']}  embeds std {im['embeds_std']:.3f}"
                  f"  numpy64 max|d| {nf.get('embeds_max_abs_diff', float('nan')):.2e}"
                  f"  PIL==plain {im['pil_backend_resize_equals_plain_pil_resize']}"
                  f"  tv resize max|d| {tv['resize_max_abs_diff_vs_pil_u8']}"
                  f" ({tv['resize_bytes_differing']}/{tv['resize_bytes_total']} bytes)"
                  f" pixels {tv['pixel_values_max_abs_diff_vs_pil']:.3g}"
                  f" embeds {tv['embeds_max_abs_diff_vs_pil_pixels']:.3g}")
        for p, g in zip(meta["prompts"], meta["greedy"]):
            nf = p.get("numpy_float64", {})
            print(f"    prompt {p['index']} len {p['length']:3d} images {p['images']} delta "
                  f"{p['rope_delta']:+d}: min gap {p['min_top2_gap']:.4g} (redraws {p['redraws']}),"
                  f" greedy gap {g['min_top2_gap']:.4g}, cached-vs-full {g['max_abs_diff_cached_vs_full_logits']:.1e},"
                  f" numpy64 max|d| {nf.get('logits_max_abs_diff', float('nan')):.2e}")
        if meta["sensitivity_numpy_float64"]:
            for kname, v in meta["sensitivity_numpy_float64"].items():
                if isinstance(v, dict):
                    print(f"    sensitivity {kname}: " + ", ".join(f"{a} {b:.3g}" for a, b in v.items()))

    write_versions(root, args, summary, time.time() - t0)


if __name__ == "__main__":
    main()
