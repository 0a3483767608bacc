"""Hugging Face transformers doing the work of `tessera bench` on the same checkpoint, for a
side-by-side on one machine: prefill P tokens (one forward pass, median of the repetitions),
then N greedy decode steps with the KV cache through `generate`, and aggregate decode with B
sequences at once (`--parallel`).

    python3 bench/hf_compare.py MODEL_DIR [-p 512] [-n 128] [-r 3] [--parallel 1,8,64]
        [--device cuda] [--dtype bfloat16]

MODEL_DIR is any Hugging Face checkpoint tessera also reads, e.g. `tessera synth --preset 0.8b
-o q08` (random weights, the real Qwen3.5-0.8B shapes). For Gemma 3 270M, whose real weights
come as a 253 MB GGUF, `--make-gemma3-270m DIR` writes random weights with the real 270M
configuration (the hyper-parameters in that GGUF's metadata) as a BF16 checkpoint that both
transformers and `tessera quantize` read:

    python3 bench/hf_compare.py --make-gemma3-270m g270
    tessera quantize g270 g270-q4_k_m.gguf --type q4_k_m

Decode figures include generate()'s per-step Python and sampling overhead, as tessera's
include its own (the argmax of each step's logits)."""
import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def make_gemma3_270m(out):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=512, sliding_window_pattern=6, rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0, rms_norm_eps=1e-6, max_position_embeddings=32768,
        tie_word_embeddings=True, final_logit_softcapping=None, attn_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh", bos_token_id=2, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")


def timed(fn, device, reps):
    times = []
    for _ in range(reps + 1):  # the first round warms up
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--parallel", default="")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--make-gemma3-270m", metavar="DIR")
    a = ap.parse_args()
    if a.make_gemma3_270m:
        make_gemma3_270m(a.make_gemma3_270m)
        return
    if not a.model:
        ap.error("a model directory is needed")
    dtype = getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).to(a.device).eval()
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(12345)
    print(f"transformers, {a.model}, {a.dtype} on {a.device}"
          f" ({torch.cuda.get_device_name() if a.device.startswith('cuda') else 'cpu'}),"
          f" attention {model.config._attn_implementation}")
    with torch.inference_mode():
        if a.p > 0:
            ids = torch.randint(0, vocab, (1, a.p), generator=gen).to(a.device)
            t = timed(lambda: model(ids, use_cache=True), a.device, a.r)
            print(f"| pp{a.p} | {a.p / t:.2f} t/s | time to first token {t * 1e3:.1f} ms |")
        batches = [1] + [int(b) for b in a.parallel.split(",") if b and int(b) != 1]
        for b in batches:
            if a.n <= 0:
                break
            start = torch.randint(0, vocab, (b, 1), generator=gen).to(a.device)

            def decode():
                model.generate(start, max_new_tokens=a.n, min_new_tokens=a.n, do_sample=False,
                               use_cache=True, pad_token_id=0)

            t = timed(decode, a.device, a.r)
            label = f"tg{a.n}" + (f" x {b} seqs" if b > 1 else "")
            print(f"| {label} | {b * a.n / t:.2f} t/s |")


if __name__ == "__main__":
    main()
