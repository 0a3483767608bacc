#!/usr/bin/env python3
"""Generate tiny random Gemma 3 text checkpoints and Hugging Face reference outputs.

The C parity tests load these checkpoints with tessera and compare against the float32 logits
and greedy continuations recorded here. Everything is deterministic: fixed seeds, one CPU
thread, eager attention.

Usage (from the repository root):
    python3 tools/gen_gemma3_fixtures.py [--out tests/fixtures/gemma3] [--skip-numpy-check]

Layout written per model (see tools/README.md, "Gemma 3"):
    <model>/config.json, <model>/model.safetensors, <model>/config.<variant>.json
    <model>/ref/prompt_<i>.ids|.logits, <model>/ref/greedy_<j>.txt, <model>/ref/meta.json
and VERSIONS.json at the top.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

import transformers
from safetensors import safe_open
from transformers import Gemma3ForCausalLM, Gemma3TextConfig
from transformers.cache_utils import DynamicSlidingWindowLayer
from transformers.models.gemma3 import modeling_gemma3 as mg

from fixture_common import (draw_prompt, forward_logits, fresh_fixture_dir, greedy,
                            greedy_nocache, pick_prompt, print_greedy_summary, top2_gaps,
                            write_ids, write_versions)

SEED = 20260301
PROMPT_LENGTHS = [1, 40, 100, 230]  # all but the first cross every sliding window used below
GREEDY_PROMPT_LENGTHS = [5, 70]  # 5 + 20 crosses the 16-token window during decode
GREEDY_NEW_TOKENS = 20
# Same policy as the Qwen3.5 fixtures: redraw prompts deterministically until no argmax is a
# near tie, so that a float32 C run must match every argmax exactly.
PROMPT_MIN_GAP = 1e-2
GREEDY_MIN_GAP = 5e-2
GREEDY_MIN_DISTINCT = 12
MAX_DRAWS = 200
MAX_BYTES = 1_200_000

CONFIG_COMMON = dict(
    hidden_activation="gelu_pytorch_tanh",
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    attention_bias=False,
    attn_logit_softcapping=None,  # transformers 5.24 Gemma 3 ignores it anyway (see meta.json)
    use_bidirectional_attention=False,
    eos_token_id=None,  # never stop early: greedy files always have GREEDY_NEW_TOKENS ids
    bos_token_id=None,
    pad_token_id=None,
)

# name -> (save dtype, config kwargs, notes). `sliding_window_pattern` and the legacy
# `rope_theta` / `rope_local_base_freq` kwargs are what older config.json files carry;
# transformers turns them into `layer_types` and `rope_parameters` before saving.
MODELS = [
    (
        "tiny_a_f32_tied_mqa_w16_pat3",
        "float32",
        dict(
            vocab_size=512, hidden_size=80, intermediate_size=64, num_hidden_layers=5,
            sliding_window_pattern=3,
            num_attention_heads=2, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
            sliding_window=16, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
            tie_word_embeddings=True, final_logit_softcapping=None,
        ),
        "2:1 pattern from sliding_window_pattern=3 -> S S F S S; MQA (2 q heads, 1 kv); "
        "q width 64 != hidden 80; query_pre_attn_scalar == head_dim; window 16; the 270m rope "
        "bases (1e6 global, 1e4 local); tied; F32",
    ),
    (
        "tiny_b_bf16_tied_gqa_w32_pat6",
        "bfloat16",
        dict(
            vocab_size=640, hidden_size=96, intermediate_size=128, num_hidden_layers=7,
            sliding_window_pattern=6,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
            sliding_window=32, rope_theta=250_000.0, rope_local_base_freq=5_000.0,
            tie_word_embeddings=True, final_logit_softcapping=None,
        ),
        "the real 5:1 pattern from sliding_window_pattern=6 -> S S S S S F S; GQA (4 q heads, "
        "2 kv); head_dim 16 with query_pre_attn_scalar 24 (scale 24^-0.5, not 16^-0.5); window "
        "32; rope 2.5e5 global / 5e3 local; tied; all tensors BF16, sqrt(96) is not a bf16 "
        "value (embed scale matters, see embed_scale in meta.json)",
    ),
    (
        "tiny_c_f32_untied_softcap_w39_explicit",
        "float32",
        dict(
            vocab_size=512, hidden_size=72, intermediate_size=64, num_hidden_layers=5,
            layer_types=["full_attention", "sliding_attention", "sliding_attention",
                         "full_attention", "sliding_attention"],
            num_attention_heads=4, num_key_value_heads=1, head_dim=24, query_pre_attn_scalar=40,
            sliding_window=39, rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 40_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 777.0},
            },
            tie_word_embeddings=False, final_logit_softcapping=30.0,
        ),
        "explicit irregular layer_types F S S F S (first layer global); 4 q heads on 1 kv head "
        "(like 270m); head_dim 24, query_pre_attn_scalar 40; window 39 (odd, not a power of 2; "
        "prompt_1 of 40 tokens crosses it at its last position only); rope 4e4 global / 777 "
        "local given directly as rope_parameters; untied lm_head; final_logit_softcapping 30 "
        "with pre-cap logits well beyond +-30; F32",
    ),
]


def randomize(model, gen, head_std):
    """Replace the default init (zero norm weights, std 0.02) with larger random values so that
    every parameter matters numerically and logits are well separated."""

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean

    def uniform(shape, lo, hi):
        return torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo

    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            # Every RMSNorm is the (1 + w) form; spread w on both sides of 0.
            if name.endswith("self_attn.q_norm.weight") or name.endswith("self_attn.k_norm.weight"):
                new = uniform(p.shape, -0.2, 1.0)  # sharper attention than 1+0
            elif name.endswith("post_attention_layernorm.weight") or \
                    name.endswith("post_feedforward_layernorm.weight"):
                # Branch outputs comparable to the scaled embedding; otherwise a tied model's
                # residual stays close to the input embedding and greedy just repeats a token.
                new = uniform(p.shape, 0.0, 2.0)
            elif name == "model.norm.weight":
                # 1 + w of both signs, small mean: with a tied head, logits of the current
                # token's own embedding would otherwise win every step.
                new = uniform(p.shape, -2.2, 0.8)
            elif name.endswith("norm.weight"):
                new = uniform(p.shape, -0.6, 0.6)
            elif name == "model.embed_tokens.weight":
                new = normal(p.shape, 0.25)
            elif name == "lm_head.weight":
                new = normal(p.shape, head_std)
            elif p.dim() == 2:
                std = min(0.25, max(0.08, 1.3 * p.shape[1] ** -0.5))
                new = normal(p.shape, std)
            else:
                raise RuntimeError(f"no init rule for {name} {tuple(p.shape)}")
            p.copy_(new)


class CallCounter:
    """Wraps the eager attention entry point to prove which code path ran."""

    def __init__(self):
        self.n = 0
        inner = mg.eager_attention_forward

        def counted(*a, **k):
            self.n += 1
            if k.get("softcap") is not None:
                raise RuntimeError("attention softcap passed; not expected")
            return inner(*a, **k)

        mg.eager_attention_forward = counted

    def take(self):
        n, self.n = self.n, 0
        return n


def load_reference(path):
    model = Gemma3ForCausalLM.from_pretrained(path, dtype=torch.float32,
                                              attn_implementation="eager")
    model.eval()
    if model.config._attn_implementation != "eager":
        raise RuntimeError(f"attention implementation {model.config._attn_implementation}")
    for name, p in model.named_parameters():
        if p.dtype != torch.float32:
            raise RuntimeError(f"{name} is {p.dtype}, expected float32")
    # The reference must be exactly the stored weights, upcast.
    params = dict(model.named_parameters())
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        for key in f.keys():
            if key not in params:
                raise RuntimeError(f"stored tensor {key} not in the loaded model")
            if not torch.equal(params[key].detach(), f.get_tensor(key).float()):
                raise RuntimeError(f"{key}: loaded weights differ from the file")
    return model


def cache_shape(cache, window, layer_types, total):
    """Prove the decode used per-layer sliding caches that hold window-1 past tokens."""
    kinds = []
    for L, layer in enumerate(cache.layers):
        sliding = isinstance(layer, DynamicSlidingWindowLayer)
        if sliding != (layer_types[L] == "sliding_attention"):
            raise RuntimeError(f"cache layer {L} is {type(layer).__name__}")
        kept = layer.keys.shape[-2]
        want = min(total - 1, window - 1) if sliding else total - 1
        if kept != want:
            raise RuntimeError(f"cache layer {L} keeps {kept} positions, expected {want}")
        kinds.append(f"{type(layer).__name__}({kept})")
    return kinds


def pick_greedy(model, gen, vocab, n):
    """Also demand a varied continuation: random nets fall into repeating one token, and a
    continuation that repeats cannot reveal a decode bug that sets in after a few steps."""
    best = None
    for draw in range(MAX_DRAWS):
        ids = draw_prompt(gen, vocab, n)
        new, step_logits, cache = greedy(model, ids, GREEDY_NEW_TOKENS)
        gap = float(top2_gaps(step_logits).min())
        score = (len(set(new)) >= GREEDY_MIN_DISTINCT, gap)
        if best is None or score > best[0]:
            best = (score, (ids, new, step_logits, gap, draw, cache))
        if score[0] and gap >= GREEDY_MIN_GAP:
            break
    if not best[0][0] or best[0][1] < GREEDY_MIN_GAP:
        raise RuntimeError(f"no greedy prompt of length {n} reaches gap {GREEDY_MIN_GAP} "
                           f"with {GREEDY_MIN_DISTINCT} distinct tokens")
    return best[1]


def embed_scale_facts(ref, hidden):
    """What HF multiplies the embedding rows by, for this reference and for a bf16 load."""
    emb = ref.model.embed_tokens
    used = emb.embed_scale.to(emb.weight.dtype)
    if used.dtype != torch.float32:
        raise RuntimeError(f"reference embed scale is {used.dtype}")
    # Measure it from the module output rather than trusting the attribute.
    with torch.no_grad():
        row = emb.weight[3]
        measured = (emb(torch.tensor([3]))[0] / row)[row.abs() > 1e-3]
    if not torch.all(measured == used):
        raise RuntimeError("embedding output is not weight * embed_scale")
    f32 = float(torch.tensor(math.sqrt(hidden), dtype=torch.float32))
    bf16 = float(torch.tensor(math.sqrt(hidden), dtype=torch.float32).to(torch.bfloat16))
    if float(used) != f32:
        raise RuntimeError(f"reference embed scale {float(used)!r} != float32 sqrt {f32!r}")
    return dict(
        used_by_reference=float(used),
        used_by_reference_hex=float(used).hex(),
        used_by_reference_float32_bits=f"0x{np.float32(float(used)).view(np.uint32):08x}",
        sqrt_hidden_float64=math.sqrt(hidden),
        bf16_rounded=bf16,
        hf_bfloat16_load_uses=bf16,
        rule="HF multiplies by torch.tensor(hidden_size**0.5) (float32) cast to the embedding "
             "weight's dtype at run time. This reference loads the stored weights upcast to "
             "float32, so it used float32(sqrt(hidden_size)) = used_by_reference, whatever the "
             "stored dtype. Loading this checkpoint with dtype=bfloat16 would use bf16_rounded.",
    )


def logits_with_embed_scale(ref, ids, scale):
    emb = ref.model.embed_tokens
    saved = emb.embed_scale.clone()
    emb.embed_scale.fill_(scale)
    try:
        return forward_logits(ref, ids)
    finally:
        emb.embed_scale.copy_(saved)


def probe_attn_softcap(ref, ids, base):
    """transformers 5.24 Gemma 3 never passes attn_logit_softcapping to the attention kernel;
    show it: a tiny cap (which would change everything) leaves the logits bit-identical."""
    attn = [m for m in ref.modules() if isinstance(m, mg.Gemma3Attention)]
    for m in attn:
        m.attn_logit_softcapping = 0.5
    ref.config.attn_logit_softcapping = 0.5
    try:
        got = forward_logits(ref, ids)
    finally:
        for m in attn:
            m.attn_logit_softcapping = None
        ref.config.attn_logit_softcapping = None
    return bool(torch.equal(got, base))


def probe_softcap_off(ref, ids, base):
    cap = ref.config.final_logit_softcapping
    ref.config.final_logit_softcapping = None
    try:
        raw = forward_logits(ref, ids)
    finally:
        ref.config.final_logit_softcapping = cap
    if not torch.allclose(cap * torch.tanh(raw / cap), base, atol=1e-5, rtol=0):
        raise RuntimeError("final softcap is not cap * tanh(logits / cap)")
    return dict(max_abs_precap_logit=float(raw.abs().max()),
                max_abs_diff_if_softcap_skipped=float((raw - base).abs().max()))


def sensitivity(mdir, cfg, ids, base):
    """How far prompt_3's logits move under plausible implementation mistakes, each expressed
    as a config override on the same weights. Every entry must sit far above the comparison
    tolerance (~1e-3) for the fixture to catch that mistake."""
    W = cfg.sliding_window
    rp = cfg.rope_parameters
    probes = {
        "sliding_window_minus_1": dict(sliding_window=W - 1),
        "sliding_window_plus_1": dict(sliding_window=W + 1),
        "no_sliding_window": dict(sliding_window=100_000),
        "rope_bases_swapped": dict(rope_parameters={
            "full_attention": dict(rp["full_attention"],
                                   rope_theta=rp["sliding_attention"]["rope_theta"]),
            "sliding_attention": dict(rp["sliding_attention"],
                                      rope_theta=rp["full_attention"]["rope_theta"]),
        }),
        "global_rope_base_everywhere": dict(rope_parameters={
            "full_attention": dict(rp["full_attention"]),
            "sliding_attention": dict(rp["sliding_attention"],
                                      rope_theta=rp["full_attention"]["rope_theta"]),
        }),
    }
    if cfg.query_pre_attn_scalar != cfg.head_dim:
        probes["scale_head_dim_not_query_pre_attn_scalar"] = dict(
            query_pre_attn_scalar=cfg.head_dim)
    out = {}
    for pname, override in probes.items():
        alt = Gemma3ForCausalLM.from_pretrained(mdir, dtype=torch.float32,
                                                attn_implementation="eager", **override)
        alt.eval()
        for key, val in override.items():
            if getattr(alt.config, key) != val:
                raise RuntimeError(f"override {key} did not take")
        diff = float((forward_logits(alt, ids) - base).abs().max())
        if diff < 1e-2:
            raise RuntimeError(f"{mdir}: probe {pname} moves the logits by only {diff}")
        out[pname] = diff
    return out


def write_config_variants(mdir, kwargs):
    """transformers writes the expanded `layer_types` and the nested `rope_parameters`; older
    files (the published gemma-3-270m among them) carry top-level `rope_theta` /
    `rope_local_base_freq` / `rope_scaling: null` and `_sliding_window_pattern`, and gemma-3-1b
    era files `sliding_window_pattern` without `layer_types`. Write those forms of the same
    config and prove transformers reads them back to the same model."""
    with open(os.path.join(mdir, "config.json")) as f:
        cfg = json.load(f)
    written = []
    legacy = dict(cfg)
    rp = legacy.pop("rope_parameters")
    legacy["rope_theta"] = rp["full_attention"]["rope_theta"]
    legacy["rope_local_base_freq"] = rp["sliding_attention"]["rope_theta"]
    legacy["rope_scaling"] = None
    written.append(("config.legacy_rope.json", legacy))
    if "sliding_window_pattern" in kwargs:
        pattern = dict(cfg)
        pattern.pop("layer_types")
        pattern.pop("_sliding_window_pattern", None)
        pattern["sliding_window_pattern"] = kwargs["sliding_window_pattern"]
        written.append(("config.pattern.json", pattern))
    want = Gemma3TextConfig.from_json_file(os.path.join(mdir, "config.json"))
    names = []
    for fname, variant in written:
        path = os.path.join(mdir, fname)
        with open(path, "w") as f:
            json.dump(variant, f, indent=2, sort_keys=True)
            f.write("\n")
        got = Gemma3TextConfig.from_json_file(path)
        if list(got.layer_types) != list(want.layer_types) or \
                got.rope_parameters != want.rope_parameters:
            raise RuntimeError(f"{fname}: reads back as {got.layer_types} {got.rope_parameters}")
        names.append(fname)
    return names


def generate_model(root, counter, spec, idx, check_numpy):
    name, save_dtype, kwargs, notes = spec
    mdir = os.path.join(root, name)
    refdir = os.path.join(mdir, "ref")
    os.makedirs(refdir)

    torch.manual_seed(SEED + 1000 * idx)  # default init of the throwaway values
    cfg_kwargs = dict(CONFIG_COMMON)
    cfg_kwargs.update(kwargs)
    config = Gemma3TextConfig(**cfg_kwargs)
    model = Gemma3ForCausalLM(config)
    head_std = 1.0 if kwargs["final_logit_softcapping"] else 0.25
    randomize(model, torch.Generator().manual_seed(SEED + 1000 * idx + 1), head_std)
    if save_dtype == "bfloat16":
        model.to(torch.bfloat16)
    model.save_pretrained(mdir)
    gc_path = os.path.join(mdir, "generation_config.json")
    if os.path.exists(gc_path):
        os.remove(gc_path)
    files = sorted(os.listdir(mdir))
    if files != ["config.json", "model.safetensors", "ref"]:
        raise RuntimeError(f"{name}: unexpected files {files}")
    variants = write_config_variants(mdir, kwargs)

    ref = load_reference(mdir)
    cfg = ref.config
    vocab = cfg.vocab_size
    tied_in_hf = ref.model.embed_tokens.weight.data_ptr() == ref.lm_head.weight.data_ptr()
    if tied_in_hf != bool(kwargs["tie_word_embeddings"]):
        raise RuntimeError(f"{name}: lm_head tying is {tied_in_hf}")
    escale = embed_scale_facts(ref, cfg.hidden_size)

    pgen = torch.Generator().manual_seed(SEED + 1000 * idx + 2)
    meta_prompts = []
    all_gaps = []
    counter.take()
    for i, n in enumerate(PROMPT_LENGTHS):
        ids, logits, gap, draw = pick_prompt(ref, pgen, vocab, n, PROMPT_MIN_GAP, MAX_DRAWS)
        if gap < PROMPT_MIN_GAP:
            raise RuntimeError(f"no prompt of length {n} reaches gap {PROMPT_MIN_GAP}")
        if logits.shape != (n, vocab):
            raise RuntimeError(f"{name}: logits shape {tuple(logits.shape)}")
        write_ids(os.path.join(refdir, f"prompt_{i}.ids"), ids)
        logits.numpy().astype("<f4").tofile(os.path.join(refdir, f"prompt_{i}.logits"))
        all_gaps.append(gap)
        alt = logits_with_embed_scale(ref, ids, escale["bf16_rounded"])
        entry = dict(index=i, length=n, min_top2_gap=gap, redraws=draw,
                     max_abs_logit=float(logits.abs().max()),
                     logit_std=float(logits.std()),
                     max_abs_diff_if_bf16_embed_scale=float((alt - logits).abs().max()))
        if cfg.final_logit_softcapping is not None:
            entry.update(probe_softcap_off(ref, ids, logits))
        meta_prompts.append(entry)
    if counter.take() == 0:
        raise RuntimeError(f"{name}: eager attention was not used")
    long_ids = [int(x) for x in open(os.path.join(refdir, "prompt_3.ids")).read().split()]
    long_logits = torch.from_numpy(np.fromfile(os.path.join(refdir, "prompt_3.logits"),
                                               dtype="<f4").reshape(len(long_ids), vocab))
    sens = sensitivity(mdir, cfg, long_ids, long_logits)
    sens["bf16_embed_scale"] = meta_prompts[3]["max_abs_diff_if_bf16_embed_scale"]
    if cfg.final_logit_softcapping is not None:
        sens["final_softcap_skipped"] = meta_prompts[3]["max_abs_diff_if_softcap_skipped"]
    attn_softcap_ignored = probe_attn_softcap(ref, long_ids, long_logits)
    if not attn_softcap_ignored:
        raise RuntimeError("transformers now applies attn_logit_softcapping; revisit the spec")

    ggen = torch.Generator().manual_seed(SEED + 1000 * idx + 3)
    meta_greedy = []
    for j, n in enumerate(GREEDY_PROMPT_LENGTHS):
        ids, new, step_logits, gap, draw, cache = pick_greedy(ref, ggen, vocab, n)
        if len(new) != GREEDY_NEW_TOKENS:
            raise RuntimeError(f"{name}: generated {len(new)} tokens")
        layers = cache_shape(cache, cfg.sliding_window, cfg.layer_types, n + GREEDY_NEW_TOKENS)
        # The cached decode must agree with plain full-sequence recomputation.
        nocache = greedy_nocache(ref, ids, GREEDY_NEW_TOKENS)
        if nocache != new:
            raise RuntimeError(f"{name}: cached greedy {new} != uncached {nocache}")
        full = forward_logits(ref, ids + new)[len(ids) - 1:len(ids) - 1 + GREEDY_NEW_TOKENS]
        cache_vs_full = float((full - step_logits).abs().max())
        if cache_vs_full > 1e-3:
            raise RuntimeError(f"{name}: cached vs full logits differ by {cache_vs_full}")
        with open(os.path.join(refdir, f"greedy_{j}.txt"), "w") as f:
            f.write(" ".join(map(str, ids)) + "\n" + " ".join(map(str, new)) + "\n")
        meta_greedy.append(dict(index=j, prompt_length=n, new_tokens=GREEDY_NEW_TOKENS,
                                min_top2_gap=gap, redraws=draw,
                                max_abs_diff_cached_vs_full_logits=cache_vs_full,
                                hf_cache_layers_after_generate=layers))

    numpy_check = None
    if check_numpy:
        numpy_check = run_numpy_check(mdir, refdir, ["config.json"] + variants,
                                      escale["used_by_reference"])
        for p, d in zip(meta_prompts, numpy_check["per_prompt_max_abs_diff"]):
            p["max_abs_diff_vs_numpy_float64"] = d
    os.chmod(os.path.join(mdir, "model.safetensors"), 0o644)

    size = os.path.getsize(os.path.join(mdir, "model.safetensors"))
    if size > MAX_BYTES:
        raise RuntimeError(f"{name}: model.safetensors is {size} bytes")
    with safe_open(os.path.join(mdir, "model.safetensors"), "pt") as f:
        stored = {}
        keys = sorted(f.keys())
        for k in keys:
            dt = str(f.get_slice(k).get_dtype())
            stored[dt] = stored.get(dt, 0) + 1
    if ("lm_head.weight" in keys) == bool(kwargs["tie_word_embeddings"]):
        raise RuntimeError(f"{name}: lm_head.weight presence does not match tying")
    with open(os.path.join(mdir, "config.json")) as f:
        saved_cfg = json.load(f)
    meta = dict(
        model=name,
        architecture=cfg.architectures[0] if cfg.architectures else None,
        model_type=cfg.model_type,
        tensor_prefix="model.",
        vocab_size=vocab,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        query_pre_attn_scalar=cfg.query_pre_attn_scalar,
        attention_scale=float(cfg.query_pre_attn_scalar) ** -0.5,
        sliding_window=cfg.sliding_window,
        sliding_window_rule="key j visible to query i iff i - sliding_window < j <= i "
                            "(sliding_window keys including the current one)",
        layer_types=list(cfg.layer_types),
        rope_parameters_resolved=cfg.rope_parameters,
        rope_config_json_keys={
            "full_attention": "rope_parameters.full_attention.rope_theta",
            "sliding_attention": "rope_parameters.sliding_attention.rope_theta",
            "legacy (config.legacy_rope.json)": "rope_theta (global), rope_local_base_freq "
                                                "(sliding)",
        },
        final_logit_softcapping=cfg.final_logit_softcapping,
        final_softcap_formula="logits = cap * tanh(logits / cap), after lm_head, in float32"
                              if cfg.final_logit_softcapping is not None else None,
        attn_logit_softcapping=cfg.attn_logit_softcapping,
        attn_logit_softcapping_ignored_by_transformers=attn_softcap_ignored,
        tie_word_embeddings=bool(cfg.tie_word_embeddings),
        embed_scale=escale,
        weight_dtype=save_dtype,
        stored_tensor_dtypes=stored,
        stored_tensor_count=len(keys),
        lm_head_weight_stored="lm_head.weight" in keys,
        safetensors_bytes=size,
        config_variants=variants,
        config_json_keys=sorted(saved_cfg.keys()),
        reference_compute_dtype="float32 (stored weights upcast exactly), attn eager, "
                                "embedding scale float32(sqrt(hidden_size))",
        prompt_lengths=PROMPT_LENGTHS,
        logits_format="float32 little-endian, n_ids x vocab_size row-major, every position",
        min_top2_gap=min(all_gaps),
        prompts=meta_prompts,
        greedy_prompt_lengths=GREEDY_PROMPT_LENGTHS,
        greedy_min_top2_gap=min(g["min_top2_gap"] for g in meta_greedy),
        greedy=meta_greedy,
        sensitivity_prompt_3_max_abs_logit_diff=sens,
        numpy_float64_check=numpy_check,
        notes=notes,
    )
    with open(os.path.join(refdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return meta


def run_numpy_check(mdir, refdir, config_names, embed_scale):
    sys.dont_write_bytecode = True  # keep tools/ free of __pycache__
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gemma3_numpy_ref as npref

    m = npref.load(mdir, embed_scale=embed_scale)
    for other in config_names[1:]:
        if npref.load(mdir, other, embed_scale)["cfg"] != m["cfg"]:
            raise RuntimeError(f"{mdir}: {other} resolves differently in the numpy reference")
    worst = 0.0
    per_prompt = []
    i = 0
    while os.path.exists(os.path.join(refdir, f"prompt_{i}.ids")):
        ids = [int(x) for x in open(os.path.join(refdir, f"prompt_{i}.ids")).read().split()]
        hf = np.fromfile(os.path.join(refdir, f"prompt_{i}.logits"), dtype="<f4")
        hf = hf.reshape(len(ids), -1).astype(np.float64)
        mine = npref.forward(m, ids)
        diff = float(np.abs(mine - hf).max())
        if not np.array_equal(mine.argmax(-1), hf.argmax(-1)):
            raise RuntimeError(f"{mdir}: numpy argmax differs on prompt {i}")
        worst = max(worst, diff)
        per_prompt.append(diff)
        i += 1
    # Token-by-token with ring buffers must give the same numbers as the masked full pass.
    ids = [int(x) for x in open(os.path.join(refdir, "prompt_2.ids")).read().split()]
    ring_vs_full = float(np.abs(npref.decode(m, ids) - npref.forward(m, ids)).max())
    if ring_vs_full > 1e-9:
        raise RuntimeError(f"{mdir}: numpy ring-buffer decode differs by {ring_vs_full}")
    j = 0
    while os.path.exists(os.path.join(refdir, f"greedy_{j}.txt")):
        lines = open(os.path.join(refdir, f"greedy_{j}.txt")).read().splitlines()
        ids = [int(x) for x in lines[0].split()]
        new = [int(x) for x in lines[1].split()]
        mine = npref.decode(m, ids + new)
        pred = mine[len(ids) - 1:len(ids) - 1 + len(new)].argmax(-1).tolist()
        if pred != new:
            raise RuntimeError(f"{mdir}: numpy greedy {pred} != {new}")
        j += 1
    if worst > 1e-3:
        raise RuntimeError(f"{mdir}: numpy float64 vs HF float32 max abs diff {worst}")
    return dict(what="tools/gemma3_numpy_ref.py float64 forward (explicit window mask) vs these "
                     "logits; greedy checked with its token-by-token ring-buffer decode",
                config_files_resolving_identically=config_names,
                max_abs_logit_diff=worst, per_prompt_max_abs_diff=per_prompt,
                ring_buffer_decode_vs_full_max_abs_diff_prompt_2=ring_vs_full,
                greedy_argmax_match=True)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(repo, "tests", "fixtures", "gemma3"))
    ap.add_argument("--skip-numpy-check", action="store_true",
                    help="skip the float64 cross-check against tools/gemma3_numpy_ref.py")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    try:
        __import__("kernels")
        sys.exit("the `kernels` package is importable; hub kernels could replace eager code")
    except ImportError:
        pass
    counter = CallCounter()

    root = fresh_fixture_dir(args.out)

    summary = []
    for idx, spec in enumerate(MODELS):
        meta = generate_model(root, counter, spec, idx, not args.skip_numpy_check)
        summary.append(meta)
        nc = meta["numpy_float64_check"]
        pattern = "".join("F" if t == "full_attention" else "S" for t in meta["layer_types"])
        print(f"{meta['model']:40s} {meta['safetensors_bytes']:>8d} B  vocab {meta['vocab_size']}"
              f"  layers {pattern}  window {meta['sliding_window']}"
              f"  min gap {meta['min_top2_gap']:.4g}"
              f"  greedy min gap {meta['greedy_min_top2_gap']:.4g}"
              + (f"  numpy64 max|d| {nc['max_abs_logit_diff']:.2e}" if nc else ""))
        for p in meta["prompts"]:
            extra = ""
            if "max_abs_precap_logit" in p:
                extra = (f", pre-cap max|logit| {p['max_abs_precap_logit']:.1f}, no-cap max|d| "
                         f"{p['max_abs_diff_if_softcap_skipped']:.2f}")
            print(f"    prompt len {p['length']:4d}: min gap {p['min_top2_gap']:.4g}"
                  f" (redraws {p['redraws']}), max|logit| {p['max_abs_logit']:.2f},"
                  f" bf16-embed-scale max|d| {p['max_abs_diff_if_bf16_embed_scale']:.2e}{extra}")
        print_greedy_summary(meta)

    write_versions(root, "gen_gemma3_fixtures.py", args.skip_numpy_check, SEED, summary)
    for m in summary:
        sens = m["sensitivity_prompt_3_max_abs_logit_diff"]
        print(f"{m['model']}: " + ", ".join(f"{k} {v:.3g}" for k, v in sens.items()))


if __name__ == "__main__":
    main()
