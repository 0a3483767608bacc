#!/usr/bin/env python3
"""Writes tests/fixtures/video/: small video files made with Debian's ffmpeg CLI, and what
Hugging Face's load_video (PyAV) makes of them: the first video stream's size, its packets
counted by demuxing, its average rate, and the RGB of a few frames, numbered as
container.decode(video=0) yields them and converted with VideoFrame.to_ndarray(format="rgb24"),
as raw .rgb files (height rows of width pixels, 3 bytes each). manifest.json says what is what;
VERSIONS.json records the tools. tests/unit/test_video.c checks src/image/video_*.c against them.

Needs the ffmpeg CLI (apt-get install ffmpeg: libx264, libvpx), PyAV (pip install av) and numpy.
The encoders run single-threaded with bit-exact flags; the pictures are ffmpeg's testsrc2
pattern (moving, so frames differ).

    python3 tools/make_video_fixtures.py            # from the repository root
"""
import json
import os
import platform
import shutil
import subprocess
import sys

import av
import numpy as np

OUT = "tests/fixtures/video"
COMMON = ["-fflags", "+bitexact", "-flags:v", "+bitexact", "-map_metadata", "-1"]


def src(w, h, rate):
    """testsrc2 drawn at twice the size and scaled down, so any size (odd ones too) is exact"""
    return ["-f", "lavfi", "-i", f"testsrc2=size={2 * w}x{2 * h}:rate={rate},scale={w}:{h}"]


X264 = ["-c:v", "libx264", "-threads", "1", "-preset", "medium", "-crf", "30"]
VPX9 = ["-c:v", "libvpx-vp9", "-threads", "1", "-row-mt", "0", "-b:v", "0", "-crf", "40",
        "-deadline", "good", "-cpu-used", "4"]

# name, ffmpeg arguments, frame indices kept, what it covers, tolerance (0: PyAV's bytes exactly;
# else the largest difference allowed, for the one case swscale 6 cannot be made to match)
VIDEOS = [
    ("h264_bframes.mp4", src(48, 32, 10) + ["-frames:v", "12"] + X264 +
     ["-bf", "2", "-g", "12", "-pix_fmt", "yuv420p"], [0, 3, 11],
     "H.264 4:2:0 in MP4 with B-frames (presentation order is not decode order)", 0),
    ("vp9.webm", src(48, 32, 12) + ["-frames:v", "10"] + VPX9 +
     ["-pix_fmt", "yuv420p", "-colorspace", "bt709", "-color_range", "tv",
      "-color_primaries", "bt709", "-color_trc", "bt709"], [0, 9],
     "VP9 in WebM (no frame count in the header), tagged BT.709", 0),
    ("h264_34x26.mp4", src(34, 26, 25) + ["-frames:v", "8"] + X264 + ["-pix_fmt", "yuv420p"],
     [2, 7], "H.264, a size that is not a multiple of 8 or 16", 0),
    ("vp9_10bit.webm", src(48, 32, 10) + ["-frames:v", "6"] + VPX9 +
     ["-pix_fmt", "yuv420p10le"], [0, 5],
     "VP9 profile 2, 10-bit 4:2:0 (swscale's general path, chroma blended as swscale 9 does)", 0),
    ("vp9_34x25.webm", src(34, 25, 25) + ["-frames:v", "6"] + VPX9 + ["-pix_fmt", "yuv420p"],
     [1, 5], "VP9, odd height (8-bit 4:2:0 on the general path)", 0),
    ("vp9_33x25.webm", src(33, 25, 25) + ["-frames:v", "6"] + VPX9 + ["-pix_fmt", "yuv420p"],
     [4], "VP9, odd width and height (the general path with horizontal chroma interpolation)", 1),
    ("mjpeg_422.mkv", src(32, 24, 5) + ["-frames:v", "4", "-c:v", "mjpeg", "-q:v", "8",
                                         "-pix_fmt", "yuvj422p"], [3],
     "Motion JPEG in Matroska, full-range 4:2:2", 0),
    ("h264_interlaced.mkv", ["-f", "lavfi", "-i", "testsrc2=size=48x64:rate=10",
                             "-frames:v", "4"] + X264 +
     ["-pix_fmt", "yuv420p", "-x264-params", "interlaced=1:tff=1:pic-struct=1"], [1],
     "H.264 MBAFF in Matroska: interlaced frames, converted field by field", 0),
]


def make(name, args):
    path = os.path.join(OUT, name)
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", *args, *COMMON, path], check=True)
    return path


def describe(path):
    """What load_video sees: PyAV's stream fields, packets counted, frames decoded."""
    with av.open(path) as c:
        st = c.streams.video[0]
        rate = st.average_rate
        info = {"width": st.codec_context.width, "height": st.codec_context.height,
                "fps": float(rate) if rate else 0.0,
                "fps_rational": [rate.numerator, rate.denominator] if rate else [0, 1],
                "header_frames": st.frames}
        pts = [p.pts for p in c.demux(video=0) if p.size]
        info["frames"] = len(pts)
        info["reordered"] = any(b < a for a, b in zip(pts, pts[1:]))
    with av.open(path) as c:
        frames = list(c.decode(video=0))
    info["decoded"] = len(frames)
    info["pix_fmt"] = frames[0].format.name
    info["interlaced"] = any(f.interlaced_frame for f in frames)
    return info, frames


def main():
    if not shutil.which("ffmpeg"):
        sys.exit("make_video_fixtures.py: the ffmpeg CLI is needed (apt-get install ffmpeg)")
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    manifest = {"videos": []}
    for name, args, keep, what, tolerance in VIDEOS:
        path = make(name, args)
        info, frames = describe(path)
        # the properties each file is there for
        if name == "h264_bframes.mp4":
            assert info["reordered"], "no B-frames: decode order is presentation order"
        if name.endswith(".webm"):
            assert info["header_frames"] == 0, "a WebM with a frame count in its header"
        if name == "h264_interlaced.mkv":
            assert info["interlaced"], "the frames are not flagged interlaced"
        assert info["frames"] == info["decoded"], f"{name}: packets and frames differ"
        entry = {"file": name, "what": what, "tolerance": tolerance, "size": os.path.getsize(path),
                 **{k: info[k] for k in ("width", "height", "frames", "fps", "fps_rational",
                                         "header_frames", "pix_fmt", "interlaced")},
                 "rgb": []}
        for i in keep:
            rgb = frames[i].to_ndarray(format="rgb24")
            assert rgb.shape == (info["height"], info["width"], 3)
            raw = f"{os.path.splitext(name)[0]}_f{i}.rgb"
            with open(os.path.join(OUT, raw), "wb") as f:
                f.write(np.ascontiguousarray(rgb).tobytes())
            entry["rgb"].append({"index": i, "file": raw})
        manifest["videos"].append(entry)
        print(f"{name}: {info['width']}x{info['height']} {info['pix_fmt']}, {info['frames']} "
              f"frames, {info['fps']:g} fps, {entry['size']} bytes")
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    ffmpeg = subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True).stdout
    versions = {"av": av.__version__, "av_ffmpeg": av.ffmpeg_version_info,
                "av_libswscale": ".".join(map(str, av.library_versions["libswscale"])),
                "numpy": np.__version__, "python": platform.python_version(),
                "ffmpeg_cli": ffmpeg.split("\n")[0],
                "command": "python3 tools/make_video_fixtures.py (run from the repository root)"}
    with open(os.path.join(OUT, "VERSIONS.json"), "w") as f:
        json.dump(versions, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
