#!/usr/bin/env python3
"""Hugging Face references for videos on the tiny Qwen3.5 vision checkpoints.

Run after tools/gen_qwen35_vision_fixtures.py (which makes the checkpoints and wipes the
directory): this adds to tests/fixtures/qwen35_vision/
    videos/video_<k>.rgb           the source frames (8-bit RGB, frame after frame)
    videos/video_<k>.resized.rgb   the frames the processor sampled and resized (the last one
                                   repeated to fill the last step), read back from its pixels
    videos/videos.json             each video's size, frames, frame rate and the processor's
                                   sampled indices, grid and step timestamps
    video_chat.json                prompts of the small test tokenizer
                                   (tests/fixtures/tokenizer/small) with videos and an image, and
                                   the ids Qwen3VLProcessor gives them
    <model>/video_preprocessor_config.json
    <model>/ref/video_<k>.embeds   the tower's rows for the video (float32)
    <model>/ref/video_prompt.{ids,pos3,logits}, video_greedy.txt
and records the versions in videos/VERSIONS.json.

The frames are made here (no video file is decoded): the decoding is src/image's own test.
Deterministic: fixed seeds, one CPU thread, eager attention.

Usage (from the repository root; needs torch, torchvision, transformers >= 5.2):
    python3 tools/gen_qwen35_video_fixtures.py
"""

import json
import os
import platform
import sys

import numpy as np
import torch

import transformers
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
from transformers.video_utils import VideoMetadata

sys.dont_write_bytecode = True  # keep tools/ free of __pycache__
from fixture_common import top2_gaps, write_ids  # noqa: E402
from gen_qwen35_fixtures import load_reference  # noqa: E402

ROOT = os.path.join("tests", "fixtures", "qwen35_vision")
MODELS = ["tiny_v_f32"]  # patch 4: the videos below are sized for its 8-pixel factor
SEED = 20261207
GREEDY_NEW_TOKENS = 10
MIN_GAP = 1e-2
MAX_DRAWS = 200

# The video processor of the tiny checkpoints: the tower's patch sizes, a pixel range small
# enough for a test (frames x height x width in all), the Qwen3-VL processor's sampling.
VIDEO_PROCESSOR = dict(patch_size=4, temporal_patch_size=2, merge_size=2,
                       size={"shortest_edge": 4096, "longest_edge": 8192},
                       fps=2, min_frames=4, max_frames=768,
                       image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])

# (width, height, frames, frames a second or None) and why each is there
VIDEOS = [
    ((40, 32, 5, 2.0), "5 frames sampled: the last step repeats its frame; step times on .x5 ties"),
    ((50, 30, 7, None), "no frame rate: 24 assumed; 4 frames sampled; resized 50x30 -> 48x32"),
    ((24, 16, 30, 10.0), "6 of 30 frames sampled; enlarged to the pixel floor"),
]


def frames_of(rng, w, h, n):
    """A moving pattern: each frame shifts a random picture and adds noise."""
    base = rng.integers(0, 256, size=(h, w, 3), dtype=np.int64)
    out = []
    for t in range(n):
        f = np.roll(base, shift=(t, 2 * t), axis=(0, 1)) + rng.integers(-20, 21, size=(h, w, 3))
        out.append(np.clip(f, 0, 255).astype(np.uint8))
    return np.stack(out)


def metadata(w, h, n, fps):
    return VideoMetadata(total_num_frames=n, fps=fps, width=w, height=h,
                         duration=n / fps if fps else None)


def unpatchify(pv, grid, p, mg, tp):
    """pixel_values_videos back to [t * tp][h][w][3] uint8 (the inverse of the processor's
    normalisation with mean = std = 0.5 and rescale 1/255; exact after rounding)."""
    gt, gh, gw = grid
    x = pv.reshape(gt, gh // mg, gw // mg, mg, mg, 3, tp, p, p)
    x = x.permute(0, 6, 1, 3, 7, 2, 4, 8, 5).reshape(gt * tp, gh * p, gw * p, 3)
    return np.rint((x.numpy().astype(np.float64) * 0.5 + 0.5) * 255.0).clip(0, 255).astype(np.uint8)


def process_videos(vp, videos):
    """Each video through the processor: its pixels, grid, sampled indices and timestamps."""
    out = []
    for (w, h, n, fps), frames in videos:
        r = vp(videos=[frames], video_metadata=[metadata(w, h, n, fps)], do_sample_frames=True,
               return_metadata=True, return_tensors="pt")
        md = r["video_metadata"][0]
        indices = [int(i) for i in md.frames_indices]
        rate = fps if fps else 24
        # the processor's _calculate_timestamps, through its own code
        stamps = transformers.models.qwen3_vl.processing_qwen3_vl.Qwen3VLProcessor._calculate_timestamps(
            None, list(indices), rate, VIDEO_PROCESSOR["temporal_patch_size"])
        out.append(dict(pv=r["pixel_values_videos"], grid=[int(g) for g in r["video_grid_thw"][0]],
                        indices=indices, seconds=[float(s) for s in stamps]))
    return out


def step_tokens(grid):
    return grid[1] * grid[2] // VIDEO_PROCESSOR["merge_size"] ** 2


def build_ids(cfg, processed, text):
    """text[0] + video 0's steps + text[1] + video 1's steps + ... + text[-1]; each step's
    timestamp is stood for by two text ids (the model does not read them as time)."""
    ids = list(text[0])
    for k, v in enumerate(processed):
        for s in range(v["grid"][0]):
            ids += list(text[len(text) - 1 - (s % 2)][:2])
            ids += [cfg.vision_start_token_id] + [cfg.video_token_id] * step_tokens(v["grid"]) + \
                [cfg.vision_end_token_id]
        ids += list(text[k + 1])
    return ids


def mm_inputs(ids, processed, cfg):
    t = torch.tensor([ids])
    return dict(input_ids=t,
                pixel_values_videos=torch.cat([v["pv"] for v in processed]),
                video_grid_thw=torch.tensor([v["grid"] for v in processed]),
                mm_token_type_ids=(t == cfg.video_token_id).long() * 2)


def logits_of(ref, ids, processed, cfg):
    with torch.no_grad():
        return ref(**mm_inputs(ids, processed, cfg), use_cache=False).logits[0].float()


def greedy(ref, ids, processed, cfg):
    with torch.no_grad():
        out = ref.generate(**mm_inputs(ids, processed, cfg),
                           attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           do_sample=False, use_cache=True, max_new_tokens=GREEDY_NEW_TOKENS,
                           min_new_tokens=GREEDY_NEW_TOKENS, pad_token_id=0, eos_token_id=None,
                           return_dict_in_generate=True, output_logits=True)
    return out.sequences[0, len(ids):].tolist(), torch.stack([x[0].float() for x in out.logits])


def video_embeds(ref, v):
    with torch.no_grad():
        o = ref.model.get_video_features(v["pv"], torch.tensor([v["grid"]]))
    rows = o.pooler_output if hasattr(o, "pooler_output") else o
    if isinstance(rows, (list, tuple)):
        rows = torch.cat(list(rows))
    return rows.float()


def chat_cases(mdir, processed, videos, rng):
    """Prompts of the small tokenizer through Qwen3VLProcessor: the ids it gives. The prompt
    text is the chat template's rendering of one user message without a generation prompt (the
    template trims a message's content: no case starts or ends with white space)."""
    from transformers import AutoImageProcessor, PreTrainedTokenizerFast
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(
        "tests", "fixtures", "tokenizer", "small", "tokenizer.json"))
    vp = Qwen3VLVideoProcessor(**VIDEO_PROCESSOR)
    proc = Qwen3VLProcessor(image_processor=AutoImageProcessor.from_pretrained(mdir),
                            tokenizer=tok, video_processor=vp)
    wrap_v = "<|vision_start|><|video_pad|><|vision_end|>"
    wrap_i = "<|vision_start|><|image_pad|><|vision_end|>"
    image = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    cases = [
        dict(parts=[["text", "Look at this: "], ["video", 0], ["text", " What happens?"]]),
        dict(parts=[["video", 2], ["text", "Describe."], ["video", 1]]),
        dict(parts=[["image", None], ["text", "and then "], ["video", 0], ["text", "?"]]),
    ]
    out = []
    for c in cases:
        text = "<|im_start|>user\n" + "".join(
            p[1] if p[0] == "text" else wrap_v if p[0] == "video" else wrap_i
            for p in c["parts"]) + "<|im_end|>\n"
        vids = [p[1] for p in c["parts"] if p[0] == "video"]
        kw = dict(text=[text], return_tensors="pt")
        if vids:
            kw["videos"] = [videos[k][1] for k in vids]
            kw["video_metadata"] = [metadata(*videos[k][0]) for k in vids]
        if any(p[0] == "image" for p in c["parts"]):
            kw["images"] = [image]
        r = proc(**kw)
        grids = r["video_grid_thw"].tolist() if vids else []
        for g, k in zip(grids, vids):
            if g != processed[k]["grid"]:
                raise RuntimeError(f"video {k}: grid {g} in a prompt, {processed[k]['grid']} alone")
        out.append(dict(parts=c["parts"], text=text, ids=r["input_ids"][0].tolist()))
    return out


def main():
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    rng = np.random.default_rng(SEED)
    vdir = os.path.join(ROOT, "videos")
    os.makedirs(vdir, exist_ok=True)
    videos = [(spec, frames_of(rng, *spec[:3])) for spec, _ in VIDEOS]
    vp = Qwen3VLVideoProcessor(**VIDEO_PROCESSOR)
    processed = process_videos(vp, videos)
    pm = VIDEO_PROCESSOR["patch_size"], VIDEO_PROCESSOR["merge_size"], \
        VIDEO_PROCESSOR["temporal_patch_size"]
    manifest = []
    for k, (((w, h, n, fps), frames), p, (_, why)) in enumerate(zip(videos, processed, VIDEOS)):
        frames.tofile(os.path.join(vdir, f"video_{k}.rgb"))
        resized = unpatchify(p["pv"], p["grid"], *pm)
        resized.tofile(os.path.join(vdir, f"video_{k}.resized.rgb"))
        manifest.append(dict(width=w, height=h, frames=n, fps=fps, why=why, indices=p["indices"],
                             grid_thw=p["grid"], seconds=p["seconds"],
                             resized=[int(resized.shape[2]), int(resized.shape[1])],
                             step_tokens=step_tokens(p["grid"])))
    with open(os.path.join(vdir, "videos.json"), "w") as f:
        json.dump(dict(video_processor=VIDEO_PROCESSOR, videos=manifest), f, indent=1)

    for name in MODELS:
        mdir = os.path.join(ROOT, name)
        vp.save_pretrained(mdir)  # video_preprocessor_config.json
        ref = load_reference("composite", mdir)
        cfg = ref.config
        refdir = os.path.join(mdir, "ref")
        for k, p in enumerate(processed):
            video_embeds(ref, p).numpy().astype("<f4").tofile(
                os.path.join(refdir, f"video_{k}.embeds"))
        # a prompt of videos 0 and 1 between random text ids, drawn until the logits' top-2
        # gaps (every prompt position and every greedy step) are wide enough to be decisive
        gen = torch.Generator().manual_seed(SEED)
        vocab = cfg.text_config.vocab_size
        best = None
        for draw in range(MAX_DRAWS):
            text = [torch.randint(0, cfg.vision_start_token_id, (3,), generator=gen).tolist()
                    for _ in range(4)]
            ids = build_ids(cfg, processed[:2], text)
            lg = logits_of(ref, ids, processed[:2], cfg)
            new, steps = greedy(ref, ids, processed[:2], cfg)
            gap = min(float(top2_gaps(lg).min()), float(top2_gaps(steps).min()))
            if best is None or gap > best["gap"]:
                best = dict(ids=ids, logits=lg, new=new, gap=gap, draws=draw + 1)
            if gap >= MIN_GAP:
                break
        ids = best["ids"]
        inp = mm_inputs(ids, processed[:2], cfg)
        pos3, delta = ref.model.get_rope_index(inp["input_ids"], inp["mm_token_type_ids"],
                                               video_grid_thw=inp["video_grid_thw"])
        write_ids(os.path.join(refdir, "video_prompt.ids"), ids)
        pos3[:, 0, :].numpy().astype("<i4").tofile(os.path.join(refdir, "video_prompt.pos3"))
        best["logits"].numpy().astype("<f4").tofile(os.path.join(refdir, "video_prompt.logits"))
        with open(os.path.join(refdir, "video_greedy.txt"), "w") as f:
            f.write(" ".join(map(str, ids)) + "\n" + " ".join(map(str, best["new"])) + "\n")
        with open(os.path.join(refdir, "video_meta.json"), "w") as f:
            json.dump(dict(videos_in_prompt=[0, 1], prompt_length=len(ids), rope_delta=int(delta[0, 0]),
                           min_top2_gap=best["gap"], draws=best["draws"], vocab=vocab), f, indent=1)
        print(f"{name}: prompt of {len(ids)} ids, min top-2 gap {best['gap']:.4g} "
              f"after {best['draws']} draws")
        if name == MODELS[0]:
            cases = chat_cases(mdir, processed, videos, rng)
            with open(os.path.join(ROOT, "video_chat.json"), "w") as f:
                json.dump(dict(tokenizer="tests/fixtures/tokenizer/small/tokenizer.json",
                               image_size=[16, 16], cases=cases), f, indent=1)
    versions = dict(transformers=transformers.__version__, torch=torch.__version__,
                    numpy=np.__version__, python=platform.python_version(),
                    command="python3 tools/gen_qwen35_video_fixtures.py (from the repository root)",
                    seed=SEED)
    with open(os.path.join(vdir, "VERSIONS.json"), "w") as f:
        json.dump(versions, f, indent=1)


if __name__ == "__main__":
    main()
