"""Hugging Face transformers running the vision tower of a Qwen3.5 checkpoint on an image, for
a side-by-side with `tessera run --image` on one machine (which prints "encoded in N ms").
The processor's work (resize, patches) is timed apart from the tower's.

    python3 bench/hf_vision_compare.py MODEL_DIR IMAGE [-r 3] [--dtype float32|bfloat16]
        [--threads N] [--max-pixels N]

MODEL_DIR: a composite checkpoint with the tower, e.g. `tessera synth --preset 0.8b-vl -o
q08vl` (random weights, the real shapes). --max-pixels as `tessera serve --image-max-pixels`
(default 1048576; `tessera run` uses the model's own range, 16777216). Needs torch,
torchvision and Pillow."""
import argparse
import statistics
import time

import torch
from PIL import Image
from transformers import Qwen3_5ForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("image")
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--max-pixels", type=int, default=16777216)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(a.model, dtype=dtype)
    model.eval()
    proc = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2,
                                    size={"shortest_edge": 65536, "longest_edge": a.max_pixels})
    img = Image.open(a.image).convert("RGB")
    t0 = time.perf_counter()
    inp = proc(images=[img], return_tensors="pt")
    t_proc = time.perf_counter() - t0
    grid = inp["image_grid_thw"]
    times = []
    with torch.inference_mode():
        for _ in range(a.r + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            model.model.visual(inp["pixel_values"].to(dtype), grid_thw=grid)
            times.append(time.perf_counter() - t0)
    n = int(grid[0].prod())
    print(f"{a.image}: grid {tuple(grid[0].tolist())} = {n} patches, {n // 4} tokens; "
          f"processor {t_proc * 1e3:.1f} ms, tower {statistics.median(times[1:]) * 1e3:.1f} ms "
          f"(median of {a.r}, {a.dtype}, {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
