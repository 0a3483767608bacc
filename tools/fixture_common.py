"""What the fixture generators (gen_qwen35_fixtures.py, gen_gemma3_fixtures.py) share: the
reference forward pass, the choice of prompts whose top-1/top-2 logit gap is wide enough for a
float32 comparison to be decisive, greedy continuation with and without the cache, the id
files and VERSIONS.json. Deterministic: every draw comes from the caller's torch.Generator."""

import json
import os
import platform
import shutil
import sys

import numpy as np
import torch

import transformers


def forward_logits(model, ids):
    """Float32 logits of every position of one prompt, no cache."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float()


def top2_gaps(logits):
    top = torch.topk(logits, 2, dim=-1).values
    return top[..., 0] - top[..., 1]


def draw_prompt(gen, vocab, n):
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def pick_prompt(model, gen, vocab, n, min_gap, max_draws):
    """Draws prompts of n ids until the smallest top-2 gap over all positions reaches min_gap;
    returns (ids, logits, gap, draws before it) of the best draw."""
    best = None
    for draw in range(max_draws):
        ids = draw_prompt(gen, vocab, n)
        logits = forward_logits(model, ids)
        gap = float(top2_gaps(logits).min())
        if best is None or gap > best[2]:
            best = (ids, logits, gap, draw)
        if gap >= min_gap:
            break
    return best


def greedy(model, ids, new_tokens):
    """generate() with the cache: exactly new_tokens ids, each step's logits, and the cache."""
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False, use_cache=True, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, pad_token_id=0, eos_token_id=None,
            return_dict_in_generate=True, output_logits=True,
        )
    new = out.sequences[0, len(ids):].tolist()
    step_logits = torch.stack([x[0].float() for x in out.logits])
    return new, step_logits, out.past_key_values


def greedy_nocache(model, ids, steps):
    """The same continuation by full forward passes, the cross-check of the cached one."""
    seq = list(ids)
    for _ in range(steps):
        seq.append(int(forward_logits(model, seq)[-1].argmax()))
    return seq[len(ids):]


def write_ids(path, ids):
    with open(path, "w") as f:
        f.write(" ".join(str(i) for i in ids) + "\n")


def print_greedy_summary(meta):
    for g in meta["greedy"]:
        print(f"    greedy prompt len {g['prompt_length']:3d}: min gap {g['min_top2_gap']:.4g}"
              f" (redraws {g['redraws']}), cached-vs-full max|d| "
              f"{g['max_abs_diff_cached_vs_full_logits']:.2e}")


def write_versions(root, script, skip_numpy_check, seed, summary):
    """VERSIONS.json (what made the fixtures, and how to make them again); prints their size."""
    cmd = f"python3 tools/{script}"
    if skip_numpy_check:
        cmd += " --skip-numpy-check"
    versions = dict(
        transformers=transformers.__version__,
        torch=torch.__version__,
        numpy=np.__version__,
        python=platform.python_version(),
        command=cmd + " (run from the repository root)",
        seed=seed,
        models=[m["model"] for m in summary],
    )
    with open(os.path.join(root, "VERSIONS.json"), "w") as f:
        json.dump(versions, f, indent=2)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(d, fn)) for d, _, fs in os.walk(root) for fn in fs)
    print(f"total fixture size: {total} bytes")


def fresh_fixture_dir(path):
    """An empty output directory: an old fixture directory (it has VERSIONS.json) is deleted so
    that no stale file survives a regeneration; anything else is refused."""
    root = os.path.abspath(path)
    if os.path.isdir(root):
        if os.listdir(root) and not os.path.exists(os.path.join(root, "VERSIONS.json")):
            sys.exit(f"refusing to delete {root}: not a fixture directory (no VERSIONS.json)")
        shutil.rmtree(root)
    os.makedirs(root)
    return root
