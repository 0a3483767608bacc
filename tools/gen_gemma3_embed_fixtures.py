#!/usr/bin/env python3
"""Generate tiny random Gemma 3 *encoder* checkpoints (EmbeddingGemma's layout) and their
Hugging Face reference outputs.

EmbeddingGemma is a Gemma3TextModel with `use_bidirectional_attention: true` (every full
layer sees the whole input; a sliding layer sees keys within sliding_window // 2 positions on
either side) saved as a sentence-transformers directory: modules.json, a Pooling module, Dense
modules (their own model.safetensors) and a Normalize module. These fixtures have that layout
with random weights; the tests compare tessera's final hidden states and pooled embeddings with
the ones recorded here. Deterministic: fixed seeds, one CPU thread, eager attention, float32.

Usage (from the repository root; needs torch and transformers):
    python3 tools/gen_gemma3_embed_fixtures.py [--out tests/fixtures/gemma3_embed]

Written per model:
    <model>/config.json, model.safetensors, modules.json, 1_Pooling/config.json,
    <k>_Dense/{config.json,model.safetensors}, [<k>_Normalize/]
    <model>/ref/prompt_<i>.ids          the input ids, one line
    <model>/ref/prompt_<i>.hidden       [n][hidden] float32: last_hidden_state (after the final norm)
    <model>/ref/prompt_<i>.embedding    [out] float32: pooled, through the Dense modules, normalized
    <model>/ref/meta.json               shapes, the rules, and how far the probes move the outputs
and VERSIONS.json at the top.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import Gemma3TextConfig, Gemma3TextModel

SEED = 20261206
PROMPT_LENGTHS = [1, 9, 40, 100]
MAX_BYTES = 1_200_000

# Vocabularies of more than the 1033 tokens of tests/fixtures/tokenizer/small, which the server
# tests give these models (a server needs a tokenizer; the ids that matter are given as ids).
MODELS = [
    dict(
        name="tiny_a_f32_mqa_w16_mean_dense2",
        dtype="float32",
        config=dict(vocab_size=1040, hidden_size=48, intermediate_size=96, num_hidden_layers=6,
                    layer_types=["sliding_attention"] * 5 + ["full_attention"],
                    num_attention_heads=3, num_key_value_heads=1, head_dim=32,
                    query_pre_attn_scalar=32, sliding_window=16),
        pooling="mean",
        dense=[(48, 96, False, "torch.nn.modules.linear.Identity"),
               (96, 48, False, "torch.nn.modules.linear.Identity")],
        normalize=True,
        notes="EmbeddingGemma's shape in small: its 5:1 layer pattern (which llama.cpp's "
              "gemma-embedding GGUF fixes), MQA (3 q heads on 1 kv head), window 16 (a "
              "sliding layer sees |i - j| <= 8), mean pooling, Dense 48->96->48 without bias "
              "(Identity), Normalize; F32",
    ),
    dict(
        name="tiny_b_bf16_gqa_w14_last_tanh",
        dtype="bfloat16",
        config=dict(vocab_size=1100, hidden_size=48, intermediate_size=64, num_hidden_layers=5,
                    layer_types=["full_attention", "sliding_attention", "sliding_attention",
                                 "sliding_attention", "full_attention"],
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    query_pre_attn_scalar=24, sliding_window=14),
        pooling="lasttoken",
        dense=[(48, 40, True, "torch.nn.modules.activation.Tanh")],
        normalize=False,
        notes="GQA (4 q heads on 2), window 14 (|i - j| <= 7), query_pre_attn_scalar 24, "
              "last-token pooling, one Dense 48->40 with bias and Tanh, no Normalize module "
              "(the embedding recorded here is normalized all the same: the server's are); "
              "all tensors BF16",
    ),
]

CONFIG_COMMON = dict(
    hidden_activation="gelu_pytorch_tanh",
    rms_norm_eps=1e-6,
    max_position_embeddings=512,
    attention_bias=False,
    use_bidirectional_attention=True,
    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
    tie_word_embeddings=True,
    final_logit_softcapping=None,
    attn_logit_softcapping=None,
    bos_token_id=2, eos_token_id=1, pad_token_id=0,
)

ACTS = {"torch.nn.modules.linear.Identity": lambda x: x,
        "torch.nn.modules.activation.Tanh": np.tanh}


def randomize(model, gen):
    """Every parameter random and large enough to matter (the default init leaves the (1 + w)
    norms at 1 and the projections tiny)."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
                new = torch.rand(p.shape, generator=gen) * 1.2 - 0.2
            elif name.endswith("post_attention_layernorm.weight") or \
                    name.endswith("post_feedforward_layernorm.weight"):
                new = torch.rand(p.shape, generator=gen) * 2.0
            elif name.endswith("norm.weight"):
                new = torch.rand(p.shape, generator=gen) * 1.2 - 0.6
            elif name == "embed_tokens.weight":
                new = torch.randn(p.shape, generator=gen) * 0.25
            elif p.dim() == 2:
                new = torch.randn(p.shape, generator=gen) * min(0.25, max(0.08, 1.3 * p.shape[1] ** -0.5))
            else:
                raise RuntimeError(f"no init rule for {name}")
            p.copy_(new)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def write_modules(mdir, spec, gen):
    """The sentence-transformers modules after the transformer; returns the Dense layers'
    float32 numpy weights and biases for the reference."""
    mods = [dict(idx=0, name="0", path="", type="sentence_transformers.models.Transformer")]
    pool = spec["pooling"]
    os.makedirs(os.path.join(mdir, "1_Pooling"))
    write_json(os.path.join(mdir, "1_Pooling", "config.json"), {
        "word_embedding_dimension": spec["config"]["hidden_size"],
        "pooling_mode_cls_token": pool == "cls",
        "pooling_mode_mean_tokens": pool == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": pool == "lasttoken",
        "include_prompt": True,
    })
    mods.append(dict(idx=1, name="1", path="1_Pooling", type="sentence_transformers.models.Pooling"))
    dense = []
    for i, (fin, fout, bias, act) in enumerate(spec["dense"]):
        k = len(mods)
        d = os.path.join(mdir, f"{k}_Dense")
        os.makedirs(d)
        w = torch.randn((fout, fin), generator=gen) * (1.5 * fin ** -0.5)
        tensors = {"linear.weight": w.contiguous()}
        b = None
        if bias:
            b = torch.randn((fout,), generator=gen) * 0.3
            tensors["linear.bias"] = b
        if spec["dtype"] == "bfloat16":
            tensors = {n: t.to(torch.bfloat16) for n, t in tensors.items()}
        save_file(tensors, os.path.join(d, "model.safetensors"))
        write_json(os.path.join(d, "config.json"), {"in_features": fin, "out_features": fout,
                                                     "bias": bias, "activation_function": act})
        mods.append(dict(idx=k, name=str(k), path=f"{k}_Dense",
                         type="sentence_transformers.models.Dense"))
        dense.append((tensors["linear.weight"].float().numpy(),
                      None if b is None else tensors["linear.bias"].float().numpy(), act))
    if spec["normalize"]:
        k = len(mods)
        os.makedirs(os.path.join(mdir, f"{k}_Normalize"))
        mods.append(dict(idx=k, name=str(k), path=f"{k}_Normalize",
                         type="sentence_transformers.models.Normalize"))
    write_json(os.path.join(mdir, "modules.json"), mods)
    return dense


def sentence(hidden, pooling, dense):
    """sentence-transformers' pipeline after the transformer, in float64: pool, Dense layers,
    then to unit length (the server always normalizes)."""
    h = hidden.astype(np.float64)
    v = {"mean": lambda: h.mean(axis=0), "lasttoken": lambda: h[-1], "cls": lambda: h[0]}[pooling]()
    for w, b, act in dense:
        v = w.astype(np.float64) @ v
        if b is not None:
            v = v + b
        v = ACTS[act](v)
    return v / np.linalg.norm(v)


def last_hidden(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.last_hidden_state[0].float()


def probe(mdir, ids, base, **override):
    alt = Gemma3TextModel.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager",
                                          **override)
    alt.eval()
    return float((last_hidden(alt, ids) - base).abs().max())


def generate(root, spec, idx):
    name = spec["name"]
    mdir = os.path.join(root, name)
    refdir = os.path.join(mdir, "ref")
    torch.manual_seed(SEED + 1000 * idx)
    cfg = Gemma3TextConfig(**dict(CONFIG_COMMON, **spec["config"]))
    model = Gemma3TextModel(cfg)
    randomize(model, torch.Generator().manual_seed(SEED + 1000 * idx + 1))
    if spec["dtype"] == "bfloat16":
        model.to(torch.bfloat16)
    model.save_pretrained(mdir)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(mdir, extra)):
            os.remove(os.path.join(mdir, extra))
    with open(os.path.join(mdir, "config.json")) as f:
        saved = json.load(f)
    W = spec["config"]["sliding_window"]
    if saved.get("sliding_window") != W or saved.get("use_bidirectional_attention") is not True:
        raise RuntimeError(f"{name}: config.json keeps sliding_window {saved.get('sliding_window')}")
    dense = write_modules(mdir, spec, torch.Generator().manual_seed(SEED + 1000 * idx + 2))
    os.makedirs(refdir)

    ref = Gemma3TextModel.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    if ref.config.sliding_window != W // 2 + 1:
        raise RuntimeError(f"{name}: transformers' window {ref.config.sliding_window}, "
                           f"expected {W // 2 + 1}")
    gen = torch.Generator().manual_seed(SEED + 1000 * idx + 3)
    prompts = []
    for i, n in enumerate(PROMPT_LENGTHS):
        ids = torch.randint(3, cfg.vocab_size, (n,), generator=gen).tolist()
        hidden = last_hidden(ref, ids)
        emb = sentence(hidden.numpy(), spec["pooling"], dense)
        with open(os.path.join(refdir, f"prompt_{i}.ids"), "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        hidden.numpy().astype("<f4").tofile(os.path.join(refdir, f"prompt_{i}.hidden"))
        emb.astype("<f4").tofile(os.path.join(refdir, f"prompt_{i}.embedding"))
        prompts.append(dict(index=i, length=n, max_abs_hidden=float(hidden.abs().max())))
    # What the fixture catches: each plausible mistake must move the longest prompt's hidden
    # states far beyond the tests' tolerance (1e-4 relative on the CPU).
    ids = [int(x) for x in open(os.path.join(refdir, "prompt_3.ids")).read().split()]
    base = last_hidden(ref, ids)
    probes = {
        "causal": probe(mdir, ids, base, use_bidirectional_attention=False),
        "sliding_window_doubled": probe(mdir, ids, base, sliding_window=2 * W),
        "window_minus_2": probe(mdir, ids, base, sliding_window=W - 2),
        "window_plus_2": probe(mdir, ids, base, sliding_window=W + 2),
    }
    for k, v in probes.items():
        if v < 1e-2:
            raise RuntimeError(f"{name}: probe {k} moves the hidden states by only {v}")
    size = os.path.getsize(os.path.join(mdir, "model.safetensors"))
    if size > MAX_BYTES:
        raise RuntimeError(f"{name}: model.safetensors is {size} bytes")
    meta = dict(
        model=name, notes=spec["notes"], weight_dtype=spec["dtype"],
        architecture=saved.get("architectures"), hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers, layer_types=list(cfg.layer_types),
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, query_pre_attn_scalar=cfg.query_pre_attn_scalar,
        sliding_window_in_config=W, sliding_window_in_transformers=ref.config.sliding_window,
        mask_rule="full layers: every key; sliding layers: key j visible to query i iff "
                  "|i - j| < sliding_window // 2 + 1",
        pooling=spec["pooling"], dense=[dict(in_features=a, out_features=b, bias=c, activation=d)
                                        for a, b, c, d in spec["dense"]],
        normalize_module=spec["normalize"],
        embedding_rule="pool the last_hidden_state rows (mean / last / first), each Dense: "
                       "act(W v + b), then v / |v|",
        prompts=prompts, probes_max_abs_hidden_diff=probes, safetensors_bytes=size,
    )
    write_json(os.path.join(refdir, "meta.json"), meta)
    print(f"{name}: probes {probes}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/gemma3_embed")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if os.path.exists(a.out):
        shutil.rmtree(a.out)
    os.makedirs(a.out)
    for i, spec in enumerate(MODELS):
        generate(a.out, spec, i)
    write_json(os.path.join(a.out, "VERSIONS.json"), dict(
        transformers=transformers.__version__, torch=torch.__version__, numpy=np.__version__,
        python=sys.version.split()[0],
        command="python3 tools/gen_gemma3_embed_fixtures.py (run from the repository root)",
        seed=SEED, models=[m["name"] for m in MODELS]))


if __name__ == "__main__":
    main()
