#!/usr/bin/env python3
"""Generate LoRA adapters for the tiny fixture models and PEFT's reference logits.

The C parity test (tests/unit/test_lora.c) loads a fixture model with these adapters and
compares its logits with the ones recorded here: PEFT's own forward (the adapters unmerged,
in float32), so the adapter format, the names of the adapted modules, the scaling rules
(lora_alpha / r, rsLoRA's lora_alpha / sqrt(r), alpha_pattern) and several adapters at once
with their own scales are all checked against the library that wrote the adapters.

Usage (from the repository root; needs torch, transformers, peft and safetensors):
    python3 tools/gen_lora_fixtures.py [--out tests/fixtures/lora]

Layout written:
    <case>/<adapter>/adapter_config.json, <case>/<adapter>/adapter_model.safetensors
    <case>/prompt_<i>.ids                  the base fixture's own prompt ids (text)
    <case>/<run>_<i>.logits                float32, n_ids x vocab, every position
    <case>/meta.json                       the base model, the runs and their adapters' scales
and VERSIONS.json at the top.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch

import peft
import transformers
from peft import LoraConfig, PeftModel, get_peft_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import forward_logits  # noqa: E402

SEED = 20261207
QWEN_ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
            "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"]
GEMMA_ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# case: base fixture, model class, prompts to run, adapters (name -> LoraConfig kwargs),
# runs (name -> {adapter: scale})
CASES = [
    dict(name="qwen35_text", base="tests/fixtures/qwen35/tiny_a_f32_tied_explicit",
         cls="Qwen3_5ForCausalLM", prompts=[1, 2],
         adapters=dict(
             all=dict(r=4, lora_alpha=8, target_modules=QWEN_ALL),
             some=dict(r=3, lora_alpha=4, use_rslora=True, alpha_pattern={"down_proj": 2.0},
                       target_modules=["q_proj", "v_proj", "down_proj", "in_proj_qkv",
                                       "out_proj"])),
         runs={"all": {"all": 1.0}, "some": {"some": 1.0},
               "mix": {"all": 0.5, "some": -1.5}}),
    dict(name="qwen35_composite", base="tests/fixtures/qwen35/tiny_d_bf16_composite",
         cls="Qwen3_5ForConditionalGeneration", prompts=[1],
         adapters=dict(all=dict(r=8, lora_alpha=16, target_modules=QWEN_ALL,
                                # only the language model's layers (a vision tower's names
                                # may look alike)
                                exclude_modules=r".*visual.*")),
         runs={"all": {"all": 1.0}}),
    dict(name="gemma3", base="tests/fixtures/gemma3/tiny_a_f32_tied_mqa_w16_pat3",
         cls="Gemma3ForCausalLM", prompts=[1, 2],
         adapters=dict(all=dict(r=4, lora_alpha=4, target_modules=GEMMA_ALL)),
         runs={"all": {"all": 1.0}, "half": {"all": 0.5}}),
    # a Gemma 3 whose layout llama.cpp's GGUF can hold (every 6th layer global, local rope base
    # 10000), made here: the test converts it to GGUF and puts the adapter on that
    dict(name="gemma3_gguf", base="tests/fixtures/lora/gemma3_gguf/base",
         cls="Gemma3ForCausalLM", prompts=[1], make_base=True,
         adapters=dict(all=dict(r=8, lora_alpha=16, target_modules=GEMMA_ALL)),
         runs={"all": {"all": 1.0}}),
]


def make_gemma_base(path, gen):
    """A tiny random Gemma 3 text model laid out as llama.cpp's gemma3 GGUF expects, with the
    fixture generator's initialisation, and a prompt of 40 ids for it."""
    from gen_gemma3_fixtures import randomize
    cfg = transformers.Gemma3TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
        sliding_window=16, max_position_embeddings=4096, rms_norm_eps=1e-6,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = transformers.Gemma3ForCausalLM(cfg).float()
    randomize(model, gen, 0.25)
    model.save_pretrained(path)
    os.makedirs(os.path.join(path, "ref"))
    ids = torch.randint(0, 512, (40,), generator=gen).tolist()
    with open(os.path.join(path, "ref", "prompt_1.ids"), "w") as f:
        f.write(" ".join(str(i) for i in ids) + "\n")


def load_base(case):
    cls = getattr(transformers, case["cls"])
    model = cls.from_pretrained(case["base"], dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def randomize_lora(model, gen):
    """PEFT starts B at zero (a no-op adapter): draw both factors so that every adapted
    weight changes the logits, by about as much as a trained adapter's would."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.06)


def make_adapters(case, outdir, gen):
    """Writes each adapter of a case with PEFT's save_pretrained; returns their directories."""
    dirs = {}
    for aname, kw in case["adapters"].items():
        model = load_base(case)
        cfg = LoraConfig(lora_dropout=0.0, bias="none", **kw)
        pm = get_peft_model(model, cfg)
        randomize_lora(pm, gen)
        d = os.path.join(outdir, aname)
        pm.save_pretrained(d)
        dirs[aname] = d
    return dirs


def run_logits(case, dirs, scales, ids):
    """PEFT's forward with the adapters of `scales` active together, each LoRA layer's
    scaling multiplied by its adapter's scale."""
    model = load_base(case)
    names = list(scales)
    pm = PeftModel.from_pretrained(model, dirs[names[0]], adapter_name=names[0])
    for n in names[1:]:
        pm.load_adapter(dirs[n], adapter_name=n)
    pm.base_model.set_adapter(names)
    for mod in pm.modules():
        if hasattr(mod, "scaling") and isinstance(mod.scaling, dict):
            for n in names:
                if n in mod.scaling:
                    mod.scaling[n] *= scales[n]
    pm.eval()
    return forward_logits(pm, ids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/lora")
    args = ap.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(SEED)
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    for case in CASES:
        cdir = os.path.join(args.out, case["name"])
        os.makedirs(cdir)
        if case.get("make_base"):
            make_gemma_base(case["base"], gen)
        dirs = make_adapters(case, cdir, gen)
        base = load_base(case)
        meta = dict(base=case["base"], prompts=[], runs={})
        for i in case["prompts"]:
            src = os.path.join(case["base"], "ref", f"prompt_{i}.ids")
            with open(src) as f:
                ids = [int(t) for t in f.read().split()]
            shutil.copy(src, os.path.join(cdir, f"prompt_{i}.ids"))
            plain = forward_logits(base, ids)
            meta["prompts"].append(dict(index=i, n_ids=len(ids)))
            for rname, scales in case["runs"].items():
                lg = run_logits(case, dirs, scales, ids)
                lg.numpy().astype("<f4").tofile(os.path.join(cdir, f"{rname}_{i}.logits"))
                rel = float((lg - plain).norm() / plain.norm())
                meta["runs"].setdefault(rname, dict(scales=scales, rel_change={}))
                meta["runs"][rname]["rel_change"][str(i)] = rel
                print(f"{case['name']} {rname} prompt {i}: |adapted - base| / |base| = {rel:.3f}")
                if rel < 0.05:
                    raise RuntimeError("the adapters barely change the logits")
        with open(os.path.join(cdir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
    with open(os.path.join(args.out, "VERSIONS.json"), "w") as f:
        json.dump(dict(torch=torch.__version__, transformers=transformers.__version__,
                       peft=peft.__version__, numpy=np.__version__,
                       command="python3 tools/gen_lora_fixtures.py (run from the repository "
                               "root)", seed=SEED), f, indent=1)


if __name__ == "__main__":
    main()
