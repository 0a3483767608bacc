#!/usr/bin/env python3
"""Generate tiny random Qwen3.5 text checkpoints and Hugging Face reference outputs.

The C parity tests (tests/unit/*qwen35*) load these checkpoints with tessera and compare
against the float32 logits and greedy continuations recorded here. Everything is
deterministic: fixed seeds, one CPU thread, eager attention, pure-torch gated-delta code.

Usage (from the repository root):
    python3 tools/gen_qwen35_fixtures.py [--out tests/fixtures/qwen35] [--skip-numpy-check]

Layout written per model (see tools/README.md):
    <model>/config.json, <model>/model.safetensors
    <model>/ref/prompt_<i>.ids|.logits, <model>/ref/greedy_<j>.txt, <model>/ref/meta.json
and VERSIONS.json at the top.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

import transformers
from safetensors import safe_open
from transformers import (
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5TextConfig,
)
from transformers.models.qwen3_5 import modeling_qwen3_5 as mq

from fixture_common import (draw_prompt, forward_logits, fresh_fixture_dir, greedy,
                            greedy_nocache, pick_prompt, print_greedy_summary, top2_gaps,
                            write_ids, write_versions)

SEED = 20260214
PROMPT_LENGTHS = [1, 40, 100, 230]  # 100 and 230 cross the 64-token gated-delta chunk
GREEDY_PROMPT_LENGTHS = [5, 70]  # short (conv state still zero-padded) and > one chunk
GREEDY_NEW_TOKENS = 20
# Prompts are drawn from a seeded generator; a few deterministic re-draws are allowed so
# that no argmax is a near tie (a C run in fp32 must be able to match argmaxes exactly).
# HF float32 itself is ~1e-4..4e-4 (abs) away from a float64 evaluation on the long prompts
# (see numpy_float64_check in meta.json), so demand gaps well above that.
PROMPT_MIN_GAP = 1e-2
GREEDY_MIN_GAP = 5e-2
MAX_DRAWS = 200
MAX_BYTES = 1_500_000

CONFIG_COMMON = dict(
    hidden_act="silu",
    rms_norm_eps=1e-6,
    linear_conv_kernel_dim=4,
    max_position_embeddings=4096,
    attention_bias=False,
    eos_token_id=None,  # never stop early: greedy files always have GREEDY_NEW_TOKENS ids
    bos_token_id=None,
    pad_token_id=None,
)


def rope(theta, factor, section):
    return dict(
        rope_type="default",
        rope_theta=theta,
        partial_rotary_factor=factor,
        mrope_section=section,
        mrope_interleaved=True,
    )


# name -> (form, save dtype, text config kwargs, notes)
# form "text": Qwen3_5ForCausalLM (tensors "model.*"); "composite": Qwen3_5ForConditionalGeneration
# (tensors "model.language_model.*", plus a tiny vision tower that a text loader must skip).
MODELS = [
    (
        "tiny_a_f32_tied_explicit",
        "text",
        "float32",
        dict(
            vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=5,
            layer_types=["linear_attention", "full_attention", "linear_attention",
                         "linear_attention", "full_attention"],
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            linear_num_key_heads=2, linear_num_value_heads=2,
            linear_key_head_dim=16, linear_value_head_dim=24,
            tie_word_embeddings=True,
            rope_parameters=rope(10000000.0, 0.25, [2, 1, 1]),
        ),
        "explicit irregular layer_types; tied lm_head; Hv == Hk; dk != dv; GQA 2; "
        "rotary dims 8 of 32",
    ),
    (
        "tiny_b_bf16_untied_interval3",
        "text",
        "bfloat16",
        dict(
            vocab_size=768, hidden_size=96, intermediate_size=192, num_hidden_layers=6,
            full_attention_interval=3,
            num_attention_heads=4, num_key_value_heads=1, head_dim=32,
            linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=24, linear_value_head_dim=16,
            tie_word_embeddings=False,
            rope_parameters=rope(10000.0, 0.5, [3, 3, 2]),
        ),
        "layer pattern from full_attention_interval=3 (transformers still writes layer_types; "
        "config.interval.json is the same config with layer_types replaced by "
        "full_attention_interval); untied lm_head; Hv = 2*Hk; dk != dv; GQA 4; "
        "partial_rotary_factor 0.5 (16 of 32 dims); rope_theta 1e4; all tensors BF16",
    ),
    (
        "tiny_c_f32_untied_hv2x",
        "text",
        "float32",
        dict(
            vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=4,
            full_attention_interval=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=64,
            linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=32, linear_value_head_dim=32,
            tie_word_embeddings=False,
            rope_parameters=rope(10000000.0, 0.25, [3, 3, 2]),
        ),
        "full_attention_interval=2; untied; Hv = 2*Hk; dk == dv = 32; head_dim 64 "
        "(16 rotary dims); GQA 2",
    ),
    (
        "tiny_d_bf16_composite",
        "composite",
        "bfloat16+f32",
        dict(
            vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
            num_attention_heads=2, num_key_value_heads=1, head_dim=48,
            linear_num_key_heads=4, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=16,
            tie_word_embeddings=True,
            rope_parameters=rope(10000000.0, 0.25, [2, 2, 2]),
        ),
        "composite Qwen3_5ForConditionalGeneration (model_type qwen3_5, text_config, tensors "
        "model.language_model.*, tiny model.visual.* tower present); default interval 4 -> "
        "[L,L,L,F]; tied at both config levels; BF16 tensors except linear_attn.A_log and "
        "linear_attn.norm.weight in F32 (as in the published checkpoints); head_dim 48 "
        "(12 rotary dims)",
    ),
]

TINY_VISION = dict(
    depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4,
    temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
)


def build_config(form, text_kwargs):
    kw = dict(CONFIG_COMMON)
    kw.update(text_kwargs)
    if form == "text":
        return Qwen3_5TextConfig(**kw)
    vision = dict(TINY_VISION, out_hidden_size=kw["hidden_size"])
    return Qwen3_5Config(text_config=kw, vision_config=vision,
                         tie_word_embeddings=kw["tie_word_embeddings"])


def randomize(model, gen):
    """Replace the default (near-identity) init with larger random values so that every
    parameter matters numerically and logits are well separated."""

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean

    def uniform(shape, lo, hi):
        return torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo

    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if ".visual." in name or name.startswith("visual."):
                new = normal(p.shape, 0.05)
            elif name.endswith("embed_tokens.weight") or name == "lm_head.weight":
                new = normal(p.shape, 0.25)
            elif name.endswith("linear_attn.A_log"):
                # A = exp(A_log) in [0.05, 2.7]: some heads remember for a long time,
                # others forget within a few tokens.
                new = uniform(p.shape, -3.0, 1.0)
            elif name.endswith("linear_attn.dt_bias"):
                new = normal(p.shape, 0.7, -0.5)
            elif name.endswith("linear_attn.conv1d.weight"):
                new = normal(p.shape, 0.4)
            elif name.endswith("linear_attn.norm.weight"):
                # Gated RMSNorm uses the plain w form (not 1+w).
                new = uniform(p.shape, 0.5, 1.5)
            elif name.endswith("norm.weight"):
                # input/post-attention/final/q/k norms use the (1 + w) form.
                new = uniform(p.shape, -0.5, 0.5)
            elif p.dim() == 2:
                std = min(0.2, max(0.05, p.shape[1] ** -0.5))
                new = normal(p.shape, std)
            else:
                raise RuntimeError(f"no init rule for {name} {tuple(p.shape)}")
            p.copy_(new)


def to_save_dtype(model, save_dtype):
    if save_dtype == "float32":
        return model
    model.to(torch.bfloat16)
    if save_dtype == "bfloat16+f32":
        # Keep the originals of these two in float32, like the published checkpoints.
        for mod in model.modules():
            if isinstance(mod, mq.Qwen3_5GatedDeltaNet):
                mod.A_log.data = mod.A_log_f32
                mod.norm.weight.data = mod.norm_w_f32
    return model


def remember_f32(model):
    for mod in model.modules():
        if isinstance(mod, mq.Qwen3_5GatedDeltaNet):
            mod.A_log_f32 = mod.A_log.detach().clone()
            mod.norm_w_f32 = mod.norm.weight.detach().clone()


def model_class(form):
    return Qwen3_5ForConditionalGeneration if form == "composite" else Qwen3_5ForCausalLM


def closure_cell(fn, name):
    for cell_name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        if cell_name == name:
            return cell
    raise RuntimeError(f"no closure variable {name} in {fn}")


class CallCounter:
    """Counts the calls of the pure-torch gated-delta / conv functions of modeling_qwen3_5.

    Each entry point is a fallback wrapper (inside a `kernels` Func module when that package is
    installed) whose `implementation` must be the torch function itself (no FLA or
    causal_conv1d package). The counter is put in that very place, so a count only grows when
    the torch code runs: a hub kernel or package taking over would leave it at zero, and the
    generator demands non-zero counts for prefill (chunked) and decode (recurrent)."""

    NAMES = ["torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
             "causal_conv1d_fn", "causal_conv1d_update"]

    def __init__(self):
        self.counts = {n: 0 for n in self.NAMES}
        for n in self.NAMES:
            entry = getattr(mq, n)
            wrapped = closure_cell(type(entry).forward, "func").cell_contents \
                if isinstance(entry, torch.nn.Module) else entry
            cell = closure_cell(wrapped, "implementation")
            if cell.cell_contents is not wrapped.__wrapped__:
                raise RuntimeError(f"{n} resolves to a non-torch kernel: {cell.cell_contents}")
            cell.cell_contents = self._make(n, cell.cell_contents)

    def _make(self, n, fn):
        def counted(*a, **k):
            self.counts[n] += 1
            return fn(*a, **k)
        return counted

    def take(self):
        c = dict(self.counts)
        for n in self.counts:
            self.counts[n] = 0
        return c


def load_reference(form, path):
    model = model_class(form).from_pretrained(path, dtype=torch.float32,
                                              attn_implementation="eager")
    model.eval()
    for name, p in model.named_parameters():
        if p.dtype != torch.float32:
            raise RuntimeError(f"{name} is {p.dtype}, expected float32")
    # The reference must be exactly the stored weights, upcast.
    params = dict(model.named_parameters())
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        for key in f.keys():
            if form == "text_from_composite":
                if not key.startswith("model.language_model."):
                    continue
                key_in_model = "model." + key[len("model.language_model."):]
            else:
                key_in_model = key
            if key_in_model not in params:
                raise RuntimeError(f"stored tensor {key} not in the loaded model")
            if not torch.equal(params[key_in_model].detach(), f.get_tensor(key).float()):
                raise RuntimeError(f"{key}: loaded weights differ from the file")
    return model


def pick_greedy(model, counter, gen, vocab, n):
    best = None
    for draw in range(MAX_DRAWS):
        ids = draw_prompt(gen, vocab, n)
        counter.take()
        new, step_logits, _ = greedy(model, ids, GREEDY_NEW_TOKENS)
        calls = counter.take()
        gap = float(top2_gaps(step_logits).min())
        if best is None or gap > best[3]:
            best = (ids, new, step_logits, gap, draw, calls)
        if gap >= GREEDY_MIN_GAP:
            break
    return best


def text_config_of(model):
    cfg = model.config
    return cfg.text_config if hasattr(cfg, "text_config") and cfg.text_config is not None else cfg


def generate_model(root, counter, spec, idx, check_numpy):
    name, form, save_dtype, text_kwargs, notes = spec
    mdir = os.path.join(root, name)
    refdir = os.path.join(mdir, "ref")
    os.makedirs(refdir)

    torch.manual_seed(SEED + 1000 * idx)  # default init of the throwaway values
    config = build_config(form, text_kwargs)
    model = model_class(form)(config)
    gen = torch.Generator().manual_seed(SEED + 1000 * idx + 1)
    randomize(model, gen)
    remember_f32(model)
    to_save_dtype(model, save_dtype)
    model.save_pretrained(mdir)
    # Only config.json + model.safetensors are part of the fixture.
    gc_path = os.path.join(mdir, "generation_config.json")
    if os.path.exists(gc_path):
        os.remove(gc_path)
    files = sorted(os.listdir(mdir))
    if files != ["config.json", "model.safetensors", "ref"]:
        raise RuntimeError(f"{name}: unexpected files {files}")
    if "full_attention_interval" in text_kwargs:
        write_interval_variant(mdir, text_kwargs["full_attention_interval"])

    ref = load_reference(form, mdir)
    tcfg = text_config_of(ref)
    vocab = tcfg.vocab_size

    pgen = torch.Generator().manual_seed(SEED + 1000 * idx + 2)
    meta_prompts = []
    all_gaps = []
    counter.take()
    for i, n in enumerate(PROMPT_LENGTHS):
        ids, logits, gap, draw = pick_prompt(ref, pgen, vocab, n, PROMPT_MIN_GAP, MAX_DRAWS)
        if logits.shape != (n, vocab):
            raise RuntimeError(f"{name}: logits shape {tuple(logits.shape)}")
        write_ids(os.path.join(refdir, f"prompt_{i}.ids"), ids)
        logits.numpy().astype("<f4").tofile(os.path.join(refdir, f"prompt_{i}.logits"))
        all_gaps.append(gap)
        meta_prompts.append(dict(index=i, length=n, min_top2_gap=gap, redraws=draw,
                                 max_abs_logit=float(logits.abs().max()),
                                 logit_std=float(logits.std())))
    prefill_calls = counter.take()
    if prefill_calls["torch_chunk_gated_delta_rule"] == 0 or \
            prefill_calls["torch_recurrent_gated_delta_rule"] != 0:
        raise RuntimeError(f"{name}: unexpected prefill kernel calls {prefill_calls}")

    ggen = torch.Generator().manual_seed(SEED + 1000 * idx + 3)
    meta_greedy = []
    for j, n in enumerate(GREEDY_PROMPT_LENGTHS):
        ids, new, step_logits, gap, draw, calls = pick_greedy(ref, counter, ggen, vocab, n)
        if len(new) != GREEDY_NEW_TOKENS:
            raise RuntimeError(f"{name}: generated {len(new)} tokens")
        if calls["torch_recurrent_gated_delta_rule"] == 0 or calls["causal_conv1d_update"] == 0:
            raise RuntimeError(f"{name}: decode did not use the recurrent path: {calls}")
        # The cached decode must agree with plain full-sequence recomputation.
        nocache = greedy_nocache(ref, ids, GREEDY_NEW_TOKENS)
        if nocache != new:
            raise RuntimeError(f"{name}: cached greedy {new} != uncached {nocache}")
        full = forward_logits(ref, ids + new)[len(ids) - 1:len(ids) - 1 + GREEDY_NEW_TOKENS]
        cache_vs_full = float((full - step_logits).abs().max())
        with open(os.path.join(refdir, f"greedy_{j}.txt"), "w") as f:
            f.write(" ".join(map(str, ids)) + "\n" + " ".join(map(str, new)) + "\n")
        meta_greedy.append(dict(index=j, prompt_length=n, new_tokens=GREEDY_NEW_TOKENS,
                                min_top2_gap=gap, redraws=draw,
                                max_abs_diff_cached_vs_full_logits=cache_vs_full,
                                kernel_calls=calls))

    numpy_check = None
    if check_numpy:
        numpy_check = run_numpy_check(mdir, refdir)
        for p, d in zip(meta_prompts, numpy_check["per_prompt_max_abs_diff"]):
            p["max_abs_diff_vs_numpy_float64"] = d

    text_class_check = None
    if form == "composite":
        # A text-only loader must see exactly the same model in the composite file.
        text = load_reference("text_from_composite", mdir)
        worst = 0.0
        for i in range(len(PROMPT_LENGTHS)):
            ids = [int(x) for x in open(os.path.join(refdir, f"prompt_{i}.ids")).read().split()]
            ref_logits = np.fromfile(os.path.join(refdir, f"prompt_{i}.logits"), dtype="<f4")
            got = forward_logits(text, ids).numpy().reshape(-1)
            worst = max(worst, float(np.abs(got - ref_logits).max()))
        if worst != 0.0:
            raise RuntimeError(f"{name}: text class on the composite file differs by {worst}")
        text_class_check = "Qwen3_5ForCausalLM.from_pretrained(this dir): bit-identical logits"
    os.chmod(os.path.join(mdir, "model.safetensors"), 0o644)

    size = os.path.getsize(os.path.join(mdir, "model.safetensors"))
    if size > MAX_BYTES:
        raise RuntimeError(f"{name}: model.safetensors is {size} bytes")
    with safe_open(os.path.join(mdir, "model.safetensors"), "pt") as f:
        stored = {}
        for k in f.keys():
            dt = str(f.get_slice(k).get_dtype())
            stored[dt] = stored.get(dt, 0) + 1
    meta = dict(
        model=name,
        form=form,
        architecture=ref.config.architectures[0] if ref.config.architectures else None,
        tensor_prefix="model.language_model." if form == "composite" else "model.",
        vocab_size=vocab,
        layer_types=list(tcfg.layer_types),
        tie_word_embeddings=bool(tcfg.tie_word_embeddings),
        weight_dtype=save_dtype,
        stored_tensor_dtypes=stored,
        safetensors_bytes=size,
        reference_compute_dtype="float32 (stored weights upcast exactly), attn eager, "
                                "torch chunked gated-delta for prefill, recurrent for decode",
        prompt_lengths=PROMPT_LENGTHS,
        logits_format="float32 little-endian, n_ids x vocab_size row-major, every position",
        min_top2_gap=min(all_gaps),
        prompts=meta_prompts,
        greedy_prompt_lengths=GREEDY_PROMPT_LENGTHS,
        greedy_min_top2_gap=min(g["min_top2_gap"] for g in meta_greedy),
        greedy=meta_greedy,
        prefill_kernel_calls=prefill_calls,
        numpy_float64_check=numpy_check,
        text_only_class_check=text_class_check,
        notes=notes,
    )
    with open(os.path.join(refdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return meta


def write_interval_variant(mdir, interval):
    """transformers always writes the expanded layer_types; older/hand-written configs may only
    carry full_attention_interval. Provide that form too, and prove it means the same layers."""
    with open(os.path.join(mdir, "config.json")) as f:
        cfg = json.load(f)
    expanded = cfg.pop("layer_types")
    cfg["full_attention_interval"] = interval
    path = os.path.join(mdir, "config.interval.json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    reread = Qwen3_5TextConfig.from_json_file(path)
    if list(reread.layer_types) != expanded:
        raise RuntimeError(f"interval variant gives {reread.layer_types} != {expanded}")


def run_numpy_check(mdir, refdir):
    sys.dont_write_bytecode = True  # keep tools/ free of __pycache__
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import qwen35_numpy_ref as npref

    m = npref.load(mdir)
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
    j = 0
    while os.path.exists(os.path.join(refdir, f"greedy_{j}.txt")):
        lines = open(os.path.join(refdir, f"greedy_{j}.txt")).read().splitlines()
        ids = [int(x) for x in lines[0].split()]
        new = [int(x) for x in lines[1].split()]
        mine = npref.forward(m, ids + new)
        pred = mine[len(ids) - 1:len(ids) - 1 + len(new)].argmax(-1).tolist()
        if pred != new:
            raise RuntimeError(f"{mdir}: numpy greedy {pred} != {new}")
        j += 1
    if worst > 1e-3:
        raise RuntimeError(f"{mdir}: numpy float64 vs HF float32 max abs diff {worst}")
    return dict(what="tools/qwen35_numpy_ref.py float64 token-by-token forward vs these logits",
                max_abs_logit_diff=worst, per_prompt_max_abs_diff=per_prompt,
                greedy_argmax_match=True)


def reference_setup():
    """One CPU thread, deterministic kernels, quiet transformers; says which fast-kernel
    packages are importable (the CallCounter checks show they are not used)."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    for pkg in ("fla", "causal_conv1d", "kernels"):
        try:
            __import__(pkg)
            print(f"note: {pkg} is importable; the checks below verify it is not used")
        except ImportError:
            pass


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(repo, "tests", "fixtures", "qwen35"))
    ap.add_argument("--skip-numpy-check", action="store_true",
                    help="skip the float64 cross-check against tools/qwen35_numpy_ref.py")
    args = ap.parse_args()

    reference_setup()
    counter = CallCounter()

    root = fresh_fixture_dir(args.out)

    summary = []
    for idx, spec in enumerate(MODELS):
        meta = generate_model(root, counter, spec, idx, not args.skip_numpy_check)
        summary.append(meta)
        nc = meta["numpy_float64_check"]
        pattern = "".join("F" if t == "full_attention" else "L" for t in meta["layer_types"])
        print(f"{meta['model']:32s} {meta['safetensors_bytes']:>9d} B  vocab {meta['vocab_size']}"
              f"  layers {pattern}  min gap {meta['min_top2_gap']:.4g}"
              f"  greedy min gap {meta['greedy_min_top2_gap']:.4g}"
              + (f"  numpy64 max|d| {nc['max_abs_logit_diff']:.2e}" if nc else ""))
        for p in meta["prompts"]:
            print(f"    prompt len {p['length']:4d}: min gap {p['min_top2_gap']:.4g}"
                  f" (redraws {p['redraws']}), max|logit| {p['max_abs_logit']:.2f}")
        print_greedy_summary(meta)

    write_versions(root, "gen_qwen35_fixtures.py", args.skip_numpy_check, SEED, summary)


if __name__ == "__main__":
    main()
