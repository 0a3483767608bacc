#!/usr/bin/env python3
"""Generate a tiny Qwen3.5 text checkpoint with a trained multi-token-prediction (MTP) block and
float32 reference outputs of that block.

The main model is a Qwen3_5ForCausalLM (model_type qwen3_5_text, F32, tied embeddings) trained
for a few hundred steps on a synthetic second-order language, so that its greedy continuations
are long, varied and predictable (random weights of any scale tried give either a chaotic next
token that a trained MTP block guessed at most ~40% of the time, or constant loops). The MTP
block (`mtp.*` tensors, the layout of the published Qwen3.5 checkpoints; transformers ignores
them on load) is then trained with the main model frozen, by distillation: from (h_q, t_{q+1})
it learns the main model's next-token distribution at q+1, on continuations the main model
writes itself. The script measures how often its drafts equal the main model's greedy tokens
and records the MTP logits for the C tests. Everything is deterministic: fixed seeds, one CPU thread, eager attention,
pure-torch gated-delta code (counted, as in gen_qwen35_fixtures.py). About 2.5 minutes.

Usage (from the repository root):
    python3 tools/gen_qwen35_mtp_fixtures.py [--out tests/fixtures/qwen35_mtp] [--skip-numpy-check]

Writes (see tools/README.md):
    tiny_mtp/config.json, tiny_mtp/model.safetensors ("model.*" as save_pretrained writes them,
        plus "mtp.*")
    tiny_mtp/ref/prompt.ids, prompt.logits, main_last.logits, chain.ids, chain.logits,
        greedy.ids, meta.json
and VERSIONS.json at the top.
"""

import argparse
import json
import math
import os
import sys
import time

sys.dont_write_bytecode = True  # keep tools/ free of __pycache__

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5 import modeling_qwen3_5 as mq

from fixture_common import (draw_prompt, fresh_fixture_dir, greedy, greedy_nocache, top2_gaps,
                            write_ids, write_versions)
from gen_qwen35_fixtures import CONFIG_COMMON, CallCounter, reference_setup, rope

SEED = 20260321
MODEL = "tiny_mtp"
MAX_BYTES = 1_500_000  # the whole fixture directory

VOCAB = 1280  # >= 1033: the server tests put tests/fixtures/tokenizer/small (1033 ids) beside it
# The synthetic language writes only the small tokenizer's 1000 ordinary ids: 1000..1032 are
# its added (special) tokens and 1033..1279 have no text, like the padded rows of a real
# checkpoint's vocabulary. Every id may appear in a prompt.
TEXT_IDS = 1000
LANGUAGE_NOISE = 0.1  # share of tokens of the training text replaced by a random id (any id)

TEXT_CONFIG = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_hidden_layers=5,
    layer_types=["linear_attention", "full_attention", "linear_attention",
                 "linear_attention", "full_attention"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=2,
    linear_key_head_dim=16, linear_value_head_dim=24,
    tie_word_embeddings=True,
    rope_parameters=rope(10000000.0, 0.25, [2, 1, 1]),
    mtp_num_hidden_layers=1,
)

# Main model: transformers' own init (initializer_range 0.02), then Adam on the language.
PRETRAIN_STEPS = 300
PRETRAIN_BATCH = 32
PRETRAIN_LEN = 64
PRETRAIN_LR = 3e-3
WARMUP = 30

# MTP block: its own data (prompt + continuation written by the main model), Adam.
MTP_SEQS = 512
MTP_PROMPT = 16
MTP_NEW = 64
MTP_SAMPLED = 0.25  # share of continuations sampled at a temperature in [0.7, 1.0]
MTP_STEPS = 700
MTP_BATCH = 32
MTP_LR = 3e-3
GEN_BATCH = 64

# Held-out measurement: fresh prompts, greedy continuations, chains of CHAIN drafts.
EVAL_SEQS = 64
EVAL_PROMPT = 12
EVAL_NEW = 64

# Reference files.
PROMPT_LEN = 40
CHAIN = 4
GREEDY_PROMPT = 12
GREEDY_NEW = 48
PROMPT_MIN_GAP = 1e-2  # every MTP row, the main model's last row, every chain row
GREEDY_MIN_GAP = 5e-2
MAX_DRAWS = 200


# ----------------------------------------------------------------------------- the language

def make_language(gen):
    """The rule t[n+1] = succ[cls[t[n-1]], t[n]]: two permutations A = succ[0], C = succ[1] of
    the text ids, the earlier token's class choosing between them. C is drawn so that the map
    on states (t[n], cls[t[n-1]]) is a bijection (for every z, A^-1(z) and C^-1(z) are of
    different classes): greedy text never collapses into a fixed point, it runs round a cycle
    of a permutation of 2 * TEXT_IDS states (most states lie on long cycles). Ids >= TEXT_IDS
    get a class and random text successors."""
    T = TEXT_IDS
    A = torch.randperm(T, generator=gen)
    cls = torch.zeros(VOCAB, dtype=torch.long)
    cls[torch.randperm(T, generator=gen)[:T // 2]] = 1
    a_inv = torch.argsort(A)
    c_inv = torch.empty(T, dtype=torch.long)
    for c in (0, 1):
        zs = (cls[a_inv] == c).nonzero()[:, 0]
        ys = (cls[:T] == 1 - c).nonzero()[:, 0]
        c_inv[zs] = ys[torch.randperm(len(ys), generator=gen)]
    C = torch.argsort(c_inv)
    extra = VOCAB - T
    cls[T:] = torch.randint(0, 2, (extra,), generator=gen)
    succ = torch.stack([torch.cat([A, torch.randint(0, T, (extra,), generator=gen)]),
                        torch.cat([C, torch.randint(0, T, (extra,), generator=gen)])])
    return succ, cls


def state_cycles(lang):
    """Lengths of the cycles of the map (t[n], cls[t[n-1]]) -> (t[n+1], cls[t[n]]) on text ids
    (checked to be a permutation), longest first."""
    succ, cls = lang
    step = {(y, c): (int(succ[c, y]), int(cls[y])) for y in range(TEXT_IDS) for c in (0, 1)}
    if len(set(step.values())) != len(step):
        raise RuntimeError("the language's state map is not a permutation")
    seen, lengths = set(), []
    for start in step:
        n, s = 0, start
        while s not in seen:
            seen.add(s)
            s = step[s]
            n += 1
        if n:
            lengths.append(n)
    return sorted(lengths, reverse=True)


def rule(lang, prev, cur):
    succ, cls = lang
    return succ[cls[prev], cur]


def sample_text(lang, gen, n, length):
    x = torch.empty(n, length, dtype=torch.long)
    x[:, :2] = torch.randint(0, VOCAB, (n, 2), generator=gen)
    for t in range(2, length):
        x[:, t] = rule(lang, x[:, t - 2], x[:, t - 1])
        noisy = torch.rand(n, generator=gen) < LANGUAGE_NOISE
        x[noisy, t] = torch.randint(0, VOCAB, (int(noisy.sum()),), generator=gen)
    return x


def cosine_lr(base, step, steps, warmup=0):
    ramp = min(1.0, (step + 1) / warmup) if warmup else 1.0
    return base * ramp * 0.5 * (1.0 + math.cos(math.pi * step / steps))


def randomize_norms(model, gen):
    """transformers starts every norm at the identity; random weights make them matter (the
    final norm's above all: the MTP block takes the hidden state after it)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):  # plain w form
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            elif name.endswith("norm.weight"):  # (1 + w) form
                p.copy_(torch.rand(p.shape, generator=gen) - 0.5)


def pretrain_main(model, lang, gen):
    opt = torch.optim.Adam(model.parameters(), lr=PRETRAIN_LR)
    model.train()
    losses = []
    for step in range(PRETRAIN_STEPS):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(PRETRAIN_LR, step, PRETRAIN_STEPS, WARMUP)
        x = sample_text(lang, gen, PRETRAIN_BATCH, PRETRAIN_LEN)
        logits = model(input_ids=x, use_cache=False).logits[:, 1:-1]  # t[2:] follow the rule
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), x[:, 2:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == PRETRAIN_STEPS - 1:
            print(f"  main step {step:4d}: loss {losses[-1]:.3f}", flush=True)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return losses


# ----------------------------------------------------------------------------- the MTP block

class MTPBlock(nn.Module):
    """Qwen3.5's MTP block. Entry q takes h_q (the main model's hidden state after its final
    norm) and the token t_{q+1}: u = fc([enorm(embed(t_{q+1})), hnorm(h_q)]), one decoder layer
    of the full-attention kind at rotary position q with causal attention over the block's own
    entries, then norm; the main model's lm_head gives the logits of t_{q+2}. Parameter names
    are those of the checkpoint below "mtp."."""

    def __init__(self, config):
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = mq.Qwen3_5RMSNorm(d, eps)
        self.pre_fc_norm_hidden = mq.Qwen3_5RMSNorm(d, eps)
        self.fc = nn.Linear(2 * d, d, bias=False)
        full = config.layer_types.index("full_attention")
        self.layers = nn.ModuleList([mq.Qwen3_5DecoderLayer(config, full)])
        self.norm = mq.Qwen3_5RMSNorm(d, eps)

    def forward(self, main, h, tok, pos=None, swap_fc_halves=False, attend_self_only=False,
                skip_norm=False):
        """h [B, L, D], tok [B, L]; pos: rotary positions [L] (default 0..L-1). The keyword
        flags are the mistakes measured in meta.json's sensitivity list."""
        n = tok.shape[1]
        a = self.pre_fc_norm_embedding(main.model.embed_tokens(tok))
        b = self.pre_fc_norm_hidden(h)
        u = self.fc(torch.cat([b, a] if swap_fc_halves else [a, b], dim=-1))
        if pos is None:
            pos = torch.arange(n)
        position_embeddings = main.model.rotary_emb(u, pos.view(1, 1, n).expand(3, u.shape[0], n))
        mask = torch.full((n, n), torch.finfo(u.dtype).min, dtype=u.dtype)
        if attend_self_only:
            mask.fill_diagonal_(0.0)
        else:
            mask = mask.triu(1)
        x = self.layers[0](u, position_embeddings=position_embeddings,
                           attention_mask=mask[None, None])
        return x if skip_norm else self.norm(x)


def init_mtp(mtp, gen):
    with torch.no_grad():
        for name, p in mtp.named_parameters():
            if p.dim() == 1:
                p.zero_()  # the norms' (1 + w) form: identity until trained
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[1] ** -0.5)


def mtp_logits(main, mtp, h, tok, **kw):
    return main.lm_head(mtp(main, h, tok, **kw))


def main_hidden(main, ids, before_norm=False):
    """The main model's last hidden states [B, L, D] (after the final norm, or its input)."""
    seen = {}
    hook = main.model.norm.register_forward_hook(lambda mod, inp, out: seen.update(x=inp[0]))
    try:
        out = main.model(input_ids=ids, use_cache=False).last_hidden_state
    finally:
        hook.remove()
    return seen["x"] if before_norm else out


def continue_batch(main, prompts, new, temps, gen):
    """prompts [B, P] + `new` tokens from the main model with its cache: greedy where temps is
    0, else sampled at that temperature."""
    out = main(input_ids=prompts, use_cache=True)
    cache, logits = out.cache, out.logits[:, -1]
    seq = [prompts]
    for step in range(new):
        nxt = logits.argmax(-1)
        hot = temps > 0
        if hot.any():
            probs = torch.softmax(logits[hot] / temps[hot, None], dim=-1)
            nxt[hot] = torch.multinomial(probs, 1, generator=gen)[:, 0]
        seq.append(nxt[:, None])
        if step == new - 1:
            break
        out = main(input_ids=nxt[:, None], cache=cache, use_cache=True)
        logits = out.logits[:, -1]
    return torch.cat(seq, dim=1)


def mtp_data(main, gen):
    seqs = []
    for _ in range(MTP_SEQS // GEN_BATCH):
        prompts = torch.randint(0, VOCAB, (GEN_BATCH, MTP_PROMPT), generator=gen)
        temps = torch.zeros(GEN_BATCH)
        hot = int(GEN_BATCH * MTP_SAMPLED)
        temps[:hot] = 0.7 + 0.3 * torch.rand(hot, generator=gen)
        seqs.append(continue_batch(main, prompts, MTP_NEW, temps, gen))
    seqs = torch.cat(seqs)
    hidden = torch.cat([main_hidden(main, seqs[i:i + GEN_BATCH])
                        for i in range(0, len(seqs), GEN_BATCH)])
    return seqs, hidden


def train_mtp(main, mtp, seqs, hidden, gen):
    """Distillation: entry q (h_q, t_{q+1}) learns the main model's next-token distribution at
    q + 1 (cross-entropy through the tied lm_head), every position of every sequence."""
    opt = torch.optim.Adam(mtp.parameters(), lr=MTP_LR)
    mtp.train()
    losses = []
    for step in range(MTP_STEPS):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(MTP_LR, step, MTP_STEPS, WARMUP)
        idx = torch.randint(0, len(seqs), (MTP_BATCH,), generator=gen)
        s, h = seqs[idx], hidden[idx]
        with torch.no_grad():
            target = torch.softmax(main.lm_head(h[:, 1:]), dim=-1)
        logits = mtp_logits(main, mtp, h[:, :-1], s[:, 1:])
        loss = -(target * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == MTP_STEPS - 1:
            print(f"  mtp step {step:4d}: loss {losses[-1]:.3f}", flush=True)
    mtp.eval()
    return losses


def mtp_chain(main, mtp, h, tok, steps):
    """Drafts from the end of a sequence: h [B, n, D] (main hidden states) and tok [B, n+1]
    (the sequence and its next token x). Step 0 is entry n-1 (h_{n-1}, x); step j is entry
    n-1+j (out of step j-1, d_j). Recomputed over the whole growing input each step (causal, so
    earlier entries do not change). Returns drafts [B, steps], logits [B, steps, V] and the
    input of a last pass (h, tokens) that would give every entry at once."""
    hs, ts = h, tok[:, 1:]
    drafts, rows = [], []
    for _ in range(steps):
        out = mtp(main, hs, ts)
        logits = main.lm_head(out[:, -1])
        d = logits.argmax(-1)
        drafts.append(d)
        rows.append(logits)
        hs = torch.cat([hs, out[:, -1:]], dim=1)
        ts = torch.cat([ts, d[:, None]], dim=1)
    return torch.stack(drafts, 1), torch.stack(rows, 1), (hs[:, :-1], ts[:, :-1])


def acceptance(main, mtp, seqs, prompt_len, depth):
    """Over greedy continuations seqs [B, P + new]: for every position q from the prompt's last
    on (so that t_{q+1} is the main model's own token), a chain of `depth` drafts from
    (h_q, t_{q+1}); draft j is right if it equals t_{q+1+j}. Returns the rate of draft 1 and,
    for j > 1, of draft j given drafts 1..j-1 right, and the mean run of right drafts."""
    h = main_hidden(main, seqs)
    n = seqs.shape[1]
    right = torch.zeros(depth, dtype=torch.long)
    tried = torch.zeros(depth, dtype=torch.long)
    runs = []
    for q in range(prompt_len - 1, n - 1 - depth):
        drafts, _, _ = mtp_chain(main, mtp, h[:, :q + 1], seqs[:, :q + 2], depth)
        ok = drafts == seqs[:, q + 2:q + 2 + depth]
        alive = torch.ones(seqs.shape[0], dtype=torch.bool)
        run = torch.zeros(seqs.shape[0], dtype=torch.long)
        for j in range(depth):
            tried[j] += int(alive.sum())
            alive = alive & ok[:, j]
            right[j] += int(alive.sum())
            run += alive.long()
        runs.append(run)
    rates = (right.double() / tried.double()).tolist()
    return dict(positions=int(tried[0]), draft_1=rates[0],
                given_earlier_right={f"draft_{j + 1}": rates[j] for j in range(1, depth)},
                mean_right_run_of_4=float(torch.cat(runs).double().mean()))


# ----------------------------------------------------------------------------- files

def build_config():
    kw = dict(CONFIG_COMMON)
    kw.update(TEXT_CONFIG)
    config = Qwen3_5TextConfig(**kw)
    config._attn_implementation = "eager"
    return config


def save_checkpoint(main, mtp, mdir):
    main.save_pretrained(mdir)
    gc_path = os.path.join(mdir, "generation_config.json")
    if os.path.exists(gc_path):
        os.remove(gc_path)
    path = os.path.join(mdir, "model.safetensors")
    with safe_open(path, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    main_names = sorted(tensors)
    for name, p in mtp.state_dict().items():
        tensors["mtp." + name] = p.detach().clone().contiguous()
    save_file({k: tensors[k] for k in sorted(tensors)}, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)
    with open(os.path.join(mdir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("mtp_num_hidden_layers") != 1 or cfg.get("model_type") != "qwen3_5_text":
        raise RuntimeError(f"config.json: {cfg.get('model_type')}, "
                           f"mtp_num_hidden_layers {cfg.get('mtp_num_hidden_layers')}")
    return main_names


def load_reference(mdir):
    """The main model and the MTP block exactly as stored (float32)."""
    main = Qwen3_5ForCausalLM.from_pretrained(mdir, dtype=torch.float32,
                                              attn_implementation="eager")
    main.eval()
    mtp = MTPBlock(main.config)
    params = dict(main.named_parameters())
    mtp_state = {}
    names = []
    with safe_open(os.path.join(mdir, "model.safetensors"), "pt") as f:
        for key in f.keys():
            t = f.get_tensor(key)
            names.append(key)
            if t.dtype != torch.float32:
                raise RuntimeError(f"{key} is {t.dtype}, expected float32")
            if key.startswith("mtp."):
                mtp_state[key[len("mtp."):]] = t
            elif key not in params or not torch.equal(params[key].detach(), t):
                raise RuntimeError(f"{key}: not in the loaded model or different")
    expected = sorted("mtp." + k for k in mtp.state_dict())
    if sorted(k for k in names if k.startswith("mtp.")) != expected:
        raise RuntimeError("mtp tensors in the file differ from the block's")
    mtp.load_state_dict(mtp_state, strict=True)
    mtp.eval()
    for p in list(main.parameters()) + list(mtp.parameters()):
        p.requires_grad_(False)
    return main, mtp, names


def prompt_outputs(main, mtp, ids):
    """MTP logits over the prompt [n-1, V], the main model's last row [V], and the chain."""
    x = torch.tensor([ids])
    h = main_hidden(main, x)
    logits = mtp_logits(main, mtp, h[:, :-1], x[:, 1:])[0]
    last = main.lm_head(h[0, -1])
    nxt = int(last.argmax())
    drafts, chain, whole = mtp_chain(main, mtp, h, torch.cat([x, torch.tensor([[nxt]])], 1), CHAIN)
    return logits, last, [nxt] + drafts[0].tolist(), chain[0], whole


def pick_prompt(main, mtp, gen):
    best = None
    for draw in range(MAX_DRAWS):
        ids = draw_prompt(gen, VOCAB, PROMPT_LEN)
        logits, last, chain_ids, chain, whole = prompt_outputs(main, mtp, ids)
        gaps = (float(top2_gaps(logits).min()), float(top2_gaps(last)),
                float(top2_gaps(chain).min()))
        if best is None or min(gaps) > min(best[5]):
            best = (ids, logits, last, chain_ids, chain, gaps, draw, whole)
        if min(gaps) >= PROMPT_MIN_GAP:
            break
    return best


def pick_greedy(main, counter, gen):
    best = None
    for draw in range(MAX_DRAWS):
        ids = draw_prompt(gen, TEXT_IDS, GREEDY_PROMPT)
        counter.take()
        new, step_logits, _ = greedy(main, ids, GREEDY_NEW)
        calls = counter.take()
        gap = float(top2_gaps(step_logits).min())
        if best is None or gap > best[3]:
            best = (ids, new, step_logits, gap, draw, calls)
        if gap >= GREEDY_MIN_GAP:
            break
    return best


def numpy_float64_check(mdir, ids, chain_ids, prompt_ref, last_ref, chain_ref):
    """tools/qwen35_numpy_ref.py (float64, token-by-token gated delta) for the main model's
    hidden states, and the MTP block written out here in numpy on the same float64 weights."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import qwen35_numpy_ref as npref

    m = npref.load(mdir)
    c, w = m["cfg"], m["w"]
    eps = c["rms_norm_eps"]
    emb = w["model.embed_tokens.weight"]
    block = dict(cfg=c, prefix="mtp.", w=w)

    def run(hs, toks):
        a = npref.rms1p(emb[np.asarray(toks)], w["mtp.pre_fc_norm_embedding.weight"], eps)
        b = npref.rms1p(hs, w["mtp.pre_fc_norm_hidden.weight"], eps)
        x = np.concatenate([a, b], axis=-1) @ w["mtp.fc.weight"].T
        p = "mtp.layers.0."
        x = x + npref.attention(block, 0, npref.rms1p(x, w[p + "input_layernorm.weight"], eps))
        y = npref.rms1p(x, w[p + "post_attention_layernorm.weight"], eps)
        act = npref.silu(y @ w[p + "mlp.gate_proj.weight"].T) * (y @ w[p + "mlp.up_proj.weight"].T)
        x = x + act @ w[p + "mlp.down_proj.weight"].T
        return npref.rms1p(x, w["mtp.norm.weight"], eps)

    h = npref.hidden(m, ids)
    prompt64 = run(h[:-1], ids[1:]) @ emb.T
    last64 = h[-1] @ emb.T
    hs, toks, rows = h, list(ids[1:]) + [chain_ids[0]], []
    for j in range(CHAIN):
        out = run(hs, toks)
        rows.append(out[-1] @ emb.T)
        hs = np.concatenate([hs, out[-1:]], axis=0)
        if j + 1 < CHAIN:
            toks.append(chain_ids[j + 1])
    chain64 = np.stack(rows)
    for what, mine, ref in (("prompt", prompt64, prompt_ref), ("main_last", last64, last_ref),
                            ("chain", chain64, chain_ref)):
        if not np.array_equal(mine.argmax(-1), ref.argmax(-1)):
            raise RuntimeError(f"numpy float64 {what} argmax differs")
    return dict(
        what="tools/qwen35_numpy_ref.py float64 main model + this script's numpy float64 MTP "
             "block vs the float32 references",
        prompt_logits_max_abs_diff=float(np.abs(prompt64 - prompt_ref).max()),
        main_last_logits_max_abs_diff=float(np.abs(last64 - last_ref).max()),
        chain_logits_max_abs_diff=float(np.abs(chain64 - chain_ref).max()),
        argmax_match=True)


def torch_float64_check(main, mtp, ids, prompt_ref):
    main64 = Qwen3_5ForCausalLM(main.config)
    main64.load_state_dict(main.state_dict())
    main64.double().eval()
    mtp64 = MTPBlock(main.config)
    mtp64.load_state_dict(mtp.state_dict())
    mtp64.double().eval()
    x = torch.tensor([ids])
    h = main_hidden(main64, x)
    logits = mtp_logits(main64, mtp64, h[:, :-1], x[:, 1:])[0].numpy()
    return dict(
        what="the same transformers modules upcast to float64 (their RMSNorm, gated RMSNorm and "
             "gated-delta code still compute in float32 inside)",
        prompt_logits_max_abs_diff=float(np.abs(logits - prompt_ref).max()))


def sensitivity(main, mtp, ids, ref, whole, chain_ref):
    """How far prompt.logits (chain.logits for the chain's positions) move under typical
    mistakes (max abs diff, float32); and the same for a shift of every entry's position,
    which RoPE does not see."""
    x = torch.tensor([ids])
    h = main_hidden(main, x)
    hp = main_hidden(main, x, before_norm=True)
    n = x.shape[1] - 1
    late = torch.arange(whole[1].shape[1])
    late[n:] += 1
    variants = {
        "fc halves swapped (hidden half first)": lambda: mtp_logits(
            main, mtp, h[:, :-1], x[:, 1:], swap_fc_halves=True),
        "h taken before the main model's final norm": lambda: mtp_logits(
            main, mtp, hp[:, :-1], x[:, 1:]),
        "token t_q instead of t_{q+1}": lambda: mtp_logits(main, mtp, h[:, :-1], x[:, :-1]),
        "no attention to earlier entries": lambda: mtp_logits(
            main, mtp, h[:, :-1], x[:, 1:], attend_self_only=True),
        "mtp.norm skipped": lambda: main.lm_head(mtp(main, h[:, :-1], x[:, 1:], skip_norm=True)),
    }
    out = {}
    for name, fn in variants.items():
        out[name] = float((fn()[0] - ref).abs().max())
    shifted = mtp_logits(main, mtp, *whole, pos=late)[0, n:]
    out["chain.logits: chain entries one position late (n instead of n-1 for row 0)"] = \
        float((shifted - chain_ref).abs().max())
    uniform = mtp_logits(main, mtp, h[:, :-1], x[:, 1:], pos=torch.arange(1, n + 1))[0]
    uniform_shift = float((uniform - ref).abs().max())
    zeroed = {}
    for name, p in mtp.named_parameters():
        keep = p.detach().clone()
        with torch.no_grad():
            p.zero_()
        moved = mtp_logits(main, mtp, h[:, :-1], x[:, 1:])[0] - ref
        zeroed["mtp." + name] = float(moved.abs().max())
        with torch.no_grad():
            p.copy_(keep)
    return out, zeroed, uniform_shift


# ----------------------------------------------------------------------------- main

def generate(root, counter, check_numpy):
    t_start = time.time()
    mdir = os.path.join(root, MODEL)
    refdir = os.path.join(mdir, "ref")
    os.makedirs(refdir)

    config = build_config()
    torch.manual_seed(SEED)  # transformers' init draws from the global generator
    main = Qwen3_5ForCausalLM(config)
    randomize_norms(main, torch.Generator().manual_seed(SEED + 9))
    lang = make_language(torch.Generator().manual_seed(SEED + 1))

    print("training the main model on the synthetic language")
    counter.take()
    pre_losses = pretrain_main(main, lang, torch.Generator().manual_seed(SEED + 2))
    train_calls = counter.take()
    if train_calls["torch_chunk_gated_delta_rule"] == 0:
        raise RuntimeError(f"training did not use the torch chunked gated delta: {train_calls}")

    egen = torch.Generator().manual_seed(SEED + 5)
    eval_prompts = torch.randint(0, VOCAB, (EVAL_SEQS, EVAL_PROMPT), generator=egen)
    with torch.no_grad():
        eval_seqs = continue_batch(main, eval_prompts, EVAL_NEW, torch.zeros(EVAL_SEQS), egen)
    new = eval_seqs[:, EVAL_PROMPT:]
    follows = float((new == rule(lang, eval_seqs[:, EVAL_PROMPT - 2:-2],
                                 eval_seqs[:, EVAL_PROMPT - 1:-1])).double().mean())
    distinct = [len(set(r.tolist())) for r in new]
    mean_distinct = sum(distinct) / len(distinct)
    print(f"  held-out greedy continuations ({EVAL_NEW} new ids): follow the rule at "
          f"{follows:.4f} of steps, distinct ids per continuation {min(distinct)}..{max(distinct)}"
          f" (mean {mean_distinct:.1f})")
    for r in new[:3]:
        print("   ", " ".join(map(str, r.tolist())))
    if follows < 0.9 or mean_distinct < 0.75 * EVAL_NEW or int(new.max()) >= TEXT_IDS:
        raise RuntimeError("the main model's greedy text is not the language")

    print("training the MTP block (main model frozen)")
    t0 = time.time()
    dgen = torch.Generator().manual_seed(SEED + 3)
    with torch.no_grad():
        seqs, hidden = mtp_data(main, dgen)
    data_s = time.time() - t0
    print(f"  data: {tuple(seqs.shape)} ids in {data_s:.0f} s")
    mtp = MTPBlock(config)
    init_mtp(mtp, torch.Generator().manual_seed(SEED + 4))
    with torch.no_grad():
        before = acceptance(main, mtp, eval_seqs, EVAL_PROMPT, CHAIN)
    mtp_losses = train_mtp(main, mtp, seqs, hidden, torch.Generator().manual_seed(SEED + 6))
    with torch.no_grad():
        rates = acceptance(main, mtp, eval_seqs, EVAL_PROMPT, CHAIN)
    print(f"  held-out acceptance: draft 1 {rates['draft_1']:.4f}, given the earlier right "
          + ", ".join(f"{k} {v:.4f}" for k, v in rates["given_earlier_right"].items())
          + f"; mean right run of {CHAIN} {rates['mean_right_run_of_4']:.3f}"
          + f" (untrained: draft 1 {before['draft_1']:.4f})")
    if rates["draft_1"] < 0.6:
        raise RuntimeError("the MTP block's drafts are not good enough")

    main_names = save_checkpoint(main, mtp, mdir)
    files = sorted(os.listdir(mdir))
    if files != ["config.json", "model.safetensors", "ref"]:
        raise RuntimeError(f"unexpected files {files}")

    # ---- references from the stored weights
    main, mtp, names = load_reference(mdir)
    counter.take()
    with torch.no_grad():
        ids, logits, last, chain_ids, chain, gaps, redraws, whole = pick_prompt(
            main, mtp, torch.Generator().manual_seed(SEED + 7))
    prompt_calls = counter.take()
    if prompt_calls["torch_chunk_gated_delta_rule"] == 0 or \
            prompt_calls["torch_recurrent_gated_delta_rule"] != 0:
        raise RuntimeError(f"unexpected prefill kernel calls {prompt_calls}")
    write_ids(os.path.join(refdir, "prompt.ids"), ids)
    logits.numpy().astype("<f4").tofile(os.path.join(refdir, "prompt.logits"))
    last.numpy().astype("<f4").tofile(os.path.join(refdir, "main_last.logits"))
    write_ids(os.path.join(refdir, "chain.ids"), chain_ids)
    chain.numpy().astype("<f4").tofile(os.path.join(refdir, "chain.logits"))
    with torch.no_grad():
        # Causality: one pass over all the chain's entries gives the prompt rows and the chain
        # rows again (up to float32 rounding of the longer products).
        once = mtp_logits(main, mtp, *whole)[0]
        causal_diff = max(float((once[:len(ids) - 1] - logits).abs().max()),
                          float((once[len(ids) - 1:] - chain).abs().max()))
        if causal_diff > 1e-4:
            raise RuntimeError(f"one pass over the chain's entries differs by {causal_diff}")

    with torch.no_grad():
        gids, gnew, gsteps, ggap, gredraws, gcalls = pick_greedy(
            main, counter, torch.Generator().manual_seed(SEED + 8))
        if gcalls["torch_recurrent_gated_delta_rule"] == 0 or gcalls["causal_conv1d_update"] == 0:
            raise RuntimeError(f"decode did not use the recurrent path: {gcalls}")
        nocache = greedy_nocache(main, gids, GREEDY_NEW)
        if nocache != gnew:
            raise RuntimeError(f"cached greedy {gnew} != uncached {nocache}")
        full = main(input_ids=torch.tensor([gids + gnew]), use_cache=False).logits[0]
        cache_vs_full = float((full[len(gids) - 1:len(gids) - 1 + GREEDY_NEW] - gsteps).abs().max())
        gx = torch.tensor([gids + gnew])
        gh = main_hidden(main, gx)
        gdraft = mtp_logits(main, mtp, gh[:, :-1], gx[:, 1:])[0].argmax(-1)
        # entry q (from the prompt's last on) drafts t_{q+2}: right if it is the greedy id
        qs = range(len(gids) - 1, len(gids) + GREEDY_NEW - 2)
        greedy_hits = sum(int(gdraft[q]) == int(gx[0, q + 2]) for q in qs)
    with open(os.path.join(refdir, "greedy.ids"), "w") as f:
        f.write(" ".join(map(str, gids)) + "\n" + " ".join(map(str, gnew)) + "\n")

    prompt_ref = logits.numpy().astype(np.float64)
    last_ref = last.numpy().astype(np.float64)
    chain_ref = chain.numpy().astype(np.float64)
    np_check = numpy_float64_check(mdir, ids, chain_ids, prompt_ref, last_ref, chain_ref) \
        if check_numpy else None
    with torch.no_grad():
        t64 = torch_float64_check(main, mtp, ids, prompt_ref)
        sens, zeroed, uniform_shift = sensitivity(main, mtp, ids, logits, whole, chain)
    if min(zeroed.values()) < 1e-2 or min(sens.values()) < 1e-2:
        raise RuntimeError(f"an MTP tensor or mistake barely matters: {sens} {zeroed}")

    size = os.path.getsize(os.path.join(mdir, "model.safetensors"))
    tensor_stats = {}
    for name, p in mtp.named_parameters():
        tensor_stats["mtp." + name] = dict(shape=list(p.shape), rms=float(p.pow(2).mean().sqrt()),
                                           max_abs=float(p.abs().max()))
    tcfg = main.config
    meta = dict(
        model=MODEL,
        architecture="Qwen3_5ForCausalLM + mtp.* (Qwen3.5 MTP block, mtp_num_hidden_layers 1)",
        tensor_prefixes=["model.", "mtp."],
        tensors=len(names),
        main_tensors=len(main_names),
        mtp_tensors=sorted(n for n in names if n.startswith("mtp.")),
        stored_dtype="F32 (every tensor)",
        safetensors_bytes=size,
        vocab_size=VOCAB,
        text_ids=f"0..{TEXT_IDS - 1}: the only ids the language (so the greedy text) uses",
        hidden_size=tcfg.hidden_size,
        intermediate_size=tcfg.intermediate_size,
        layer_types=list(tcfg.layer_types),
        mtp_layer="one decoder layer of the full_attention kind",
        heads=dict(q=tcfg.num_attention_heads, kv=tcfg.num_key_value_heads,
                   head_dim=tcfg.head_dim, rotary_dims=int(tcfg.head_dim * 0.25)),
        tie_word_embeddings=True,
        reference_compute_dtype="float32 (stored weights), attn eager, torch chunked gated-delta",
        mtp_definition=(
            "entry q: a = pre_fc_norm_embedding(embed(t_{q+1})), b = pre_fc_norm_hidden(h_q) "
            "(h_q = the main model's hidden state after model.norm), u = fc([a, b]) (embedding "
            "half first), one full-attention decoder layer at rotary position q, causal over "
            "entries 0..q, then mtp.norm; logits = lm_head (tied); all norms (1 + w)"),
        files=dict(
            prompt_ids=f"one line of {PROMPT_LEN} ids drawn from all {VOCAB}",
            prompt_logits="float32 LE [(n-1) x vocab]: row q = MTP logits of entry q "
                          "(h_q, t_{q+1}, position q), q = 0..n-2",
            main_last_logits="float32 LE [vocab]: the main model's logits at position n-1",
            chain_ids="x d_1 .. d_4: x = argmax main_last, d_j = argmax chain row j-1",
            chain_logits="float32 LE [4 x vocab]: row 0 = entry n-1 (h_{n-1}, x) at position "
                         "n-1; row j = entry n-1+j (MTP output of row j-1 after mtp.norm, d_j) "
                         "at position n-1+j; every entry attends to all earlier entries "
                         "(0..n-2 from the prompt, then the chain's)",
            greedy_ids=f"line 1: {GREEDY_PROMPT} prompt ids drawn from the text ids, line 2: "
                       f"{GREEDY_NEW} greedy ids of the main model (generate() with the cache, "
                       "checked against full recomputation)"),
        language=dict(
            rule="t[n+1] = succ[cls[t[n-1]]][t[n]]: two permutations of the text ids, the "
                 "earlier token's class (half the text ids each) choosing; ids past the text "
                 "ids have a random class and random text successors. The map on states "
                 "(t[n], cls[t[n-1]]) is a permutation of 2 x 1000 states, so greedy text "
                 "never collapses into a fixed point; it runs round one of that permutation's "
                 "cycles (mostly long: different prompts often join the same one)",
            state_cycle_lengths=state_cycles(lang),
            training_noise=LANGUAGE_NOISE),
        main_training=dict(init="transformers' own (initializer_range 0.02), norm weights "
                                "uniform: (1 + w) norms w in [-0.5, 0.5], gated norms in "
                                "[0.5, 1.5]",
                           optimizer="Adam",
                           lr=PRETRAIN_LR, steps=PRETRAIN_STEPS, batch=PRETRAIN_BATCH,
                           length=PRETRAIN_LEN, first_loss=pre_losses[0],
                           last_loss=pre_losses[-1],
                           held_out_greedy_follows_rule=follows,
                           held_out_greedy_distinct_ids=dict(
                               min=min(distinct), mean=mean_distinct, max=max(distinct))),
        mtp_training=dict(
            init="norms 0 ((1 + w) = identity), matrices normal(0, fan_in^-0.5)",
            data=f"{MTP_SEQS} sequences: {MTP_PROMPT} random ids + {MTP_NEW} ids written by the "
                 f"main model ({1 - MTP_SAMPLED:.0%} greedy, {MTP_SAMPLED:.0%} sampled at a "
                 "temperature in [0.7, 1.0])",
            objective="cross-entropy of entry q's logits against the main model's next-token "
                      "distribution at q+1 (every position), main model and embeddings frozen",
            optimizer="Adam", lr=MTP_LR, steps=MTP_STEPS, batch=MTP_BATCH,
            first_loss=mtp_losses[0], last_loss=mtp_losses[-1]),
        acceptance_held_out=dict(
            setup=f"{EVAL_SEQS} fresh prompts of {EVAL_PROMPT} random ids, {EVAL_NEW} greedy ids "
                  "each; every entry q from the prompt's last on drafts a chain of 4 (as "
                  "chain.logits does); a draft is right if it equals the main model's greedy id",
            **rates, untrained_draft_1=before["draft_1"]),
        prompt=dict(length=PROMPT_LEN, redraws=redraws, min_top2_gap_prompt_logits=gaps[0],
                    top2_gap_main_last=gaps[1], min_top2_gap_chain_logits=gaps[2],
                    max_abs_logit=float(logits.abs().max()), chain_ids=chain_ids,
                    max_abs_diff_one_pass_over_all_chain_entries=causal_diff),
        greedy=dict(prompt_length=GREEDY_PROMPT, new_tokens=GREEDY_NEW, min_top2_gap=ggap,
                    redraws=gredraws, max_abs_diff_cached_vs_full_logits=cache_vs_full,
                    kernel_calls=gcalls, distinct_new_ids=len(set(gnew)),
                    mtp_draft_1_right=f"{greedy_hits} of {len(qs)}"),
        prefill_kernel_calls=prompt_calls,
        numpy_float64_check=np_check,
        torch_float64_check=t64,
        sensitivity_prompt_logits_max_abs_diff=sens,
        sensitivity_zeroed_mtp_tensor_max_abs_diff=zeroed,
        every_entry_position_plus_1_max_abs_diff=dict(
            value=uniform_shift,
            note="RoPE is relative: moving every MTP entry (prompt.logits) by the same offset "
                 "changes nothing but rounding, so a consistent offset is no error"),
        mtp_tensor_stats=tensor_stats,
    )
    with open(os.path.join(refdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")

    print(f"{MODEL}: {size} B, prompt min gaps: MTP {gaps[0]:.4g}, main last {gaps[1]:.4g}, "
          f"chain {gaps[2]:.4g} (redraws {redraws}); chain ids {chain_ids}")
    print(f"  greedy: prompt {GREEDY_PROMPT} + {GREEDY_NEW} ids, min gap {ggap:.4g}, "
          f"{len(set(gnew))} distinct, MTP draft 1 right {greedy_hits} of {len(qs)}")
    if np_check:
        print(f"  numpy float64 max|d|: prompt {np_check['prompt_logits_max_abs_diff']:.2e}, "
              f"main last {np_check['main_last_logits_max_abs_diff']:.2e}, "
              f"chain {np_check['chain_logits_max_abs_diff']:.2e}")
    print(f"  torch float64 upcast max|d| prompt {t64['prompt_logits_max_abs_diff']:.2e}")
    print(f"  sensitivity (min {min(sens.values()):.3g}), zeroed tensor (min "
          f"{min(zeroed.values()):.3g}); {time.time() - t_start:.0f} s")
    return meta


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(repo, "tests", "fixtures", "qwen35_mtp"))
    ap.add_argument("--skip-numpy-check", action="store_true",
                    help="skip the float64 cross-check with tools/qwen35_numpy_ref.py")
    args = ap.parse_args()

    reference_setup()
    counter = CallCounter()
    root = fresh_fixture_dir(args.out)
    meta = generate(root, counter, not args.skip_numpy_check)
    write_versions(root, "gen_qwen35_mtp_fixtures.py", args.skip_numpy_check, SEED, [meta])
    total = sum(os.path.getsize(os.path.join(d, fn)) for d, _, fs in os.walk(root) for fn in fs)
    if total > MAX_BYTES:
        raise RuntimeError(f"fixture directory is {total} bytes (> {MAX_BYTES})")


if __name__ == "__main__":
    main()
