#!/usr/bin/env python3
"""Writes tests/fixtures/image/: small PNG, JPEG and WebP files, what PIL decodes them to after
Hugging Face's convert-to-RGB rule (transformers.image_transforms.convert_to_rgb: grey and
palette expanded, alpha composited over white; the orientation applied first, as
transformers.image_utils.load_image applies it with ImageOps.exif_transpose: EXIF in a JPEG's APP1,
a PNG's eXIf / tEXt / zTXt / iTXt or a WebP's EXIF chunk, else XMP's tiff:Orientation), and PIL
BICUBIC resizes of two of them, as raw RGB (.rgb: height rows of width pixels, 3 bytes each), with
manifest.json saying what is what (the orientation fixtures also say which orientation PIL
applied: the script checks that it did). tests/unit/test_image.c checks src/image/ against them
byte for byte.

Needs Pillow and numpy (torchvision and transformers optional: with them, the Qwen2-VL image
processor's torchvision resize is measured against PIL's and the difference recorded; without
torchvision the measurement already in manifest.json and VERSIONS.json is kept).
Deterministic: the pictures are drawn from a fixed seed, and the encoders run single-threaded.

    python3 tools/gen_image_fixtures.py            # from the repository root
"""
import io
import json
import os
import platform
import shutil
import struct
import sys
import zlib

import numpy as np
from PIL import Image, ImageOps, features

OUT = "tests/fixtures/image"
SEED = 20260514


def picture(rng, w, h):
    """A deterministic RGB test picture: gradients, a ring, hard edges and some noise, so both
    smooth areas and sharp transitions (where bicubic overshoots and JPEG rings) are present."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 255 * x / max(w - 1, 1)
    g = 255 * y / max(h - 1, 1)
    b = 127.5 + 127.5 * np.sin((x + 2 * y) / 3.0)
    ring = np.hypot(x - w / 2, y - h / 2)
    img = np.stack([r, g, b], -1)
    img[(ring > h / 5) & (ring < h / 3)] = [250, 20, 30]
    img[: h // 4, w - w // 4:] = [0, 0, 0]
    img[h - h // 5:, : w // 5] = [255, 255, 255]
    img += rng.normal(0, 12, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def alpha_plane(w, h):
    """Alpha with every kind of value: 0, 255 and a ramp in between."""
    y, x = np.mgrid[0:h, 0:w]
    a = (x * 255 // max(w - 1, 1)).astype(np.uint8)
    a[: h // 3] = 255
    a[h - h // 4:, : w // 3] = 0
    return a


# ---- PNG files PIL does not write (16-bit colour, 2/4-bit, interlaced): written by hand ----

def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
         (0, 1, 1, 2)]


def pack_row(samples, depth):
    """One scanline's bytes from its samples (integers), at depth 1/2/4/8/16 bits."""
    if depth == 16:
        return struct.pack(f">{len(samples)}H", *samples)
    if depth == 8:
        return bytes(samples)
    per = 8 // depth
    out = bytearray()
    for i in range(0, len(samples), per):
        byte = 0
        for j, s in enumerate(samples[i:i + per]):
            byte |= s << (8 - depth * (j + 1))
        out.append(byte)
    return bytes(out)


def png_file(arr, depth, ctype, extra=b"", interlace=False):
    """arr: (h, w, channels) integers at the given depth; filter type 0 on every row."""
    h, w = arr.shape[:2]
    flat = arr.reshape(h, w, -1)
    raw = bytearray()
    passes = ADAM7 if interlace else [(0, 0, 1, 1)]
    for x0, y0, dx, dy in passes:
        sub = flat[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        for row in sub:
            raw += b"\0" + pack_row([int(v) for v in row.reshape(-1)], depth)
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 1 if interlace else 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra +
            png_chunk(b"IDAT", zlib.compress(bytes(raw), 9)) + png_chunk(b"IEND", b""))


def encoded(im, fmt, **kw):
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def sources(rng):
    """(name, file bytes, what it is) for every decode fixture."""
    pic = picture(rng, 64, 48)
    small = picture(rng, 40, 30)
    odd = picture(rng, 45, 31)
    tiny = picture(rng, 24, 16)
    a40 = alpha_plane(40, 30)
    grey = (small.astype(np.uint16) @ np.array([77, 150, 29]) >> 8).astype(np.uint8)
    out = []

    out.append(("png_rgb.png", encoded(Image.fromarray(pic), "PNG"), "PNG RGB 8-bit"))
    out.append(("png_rgba.png", encoded(Image.fromarray(np.dstack([small, a40]), "RGBA"), "PNG"),
                "PNG RGBA 8-bit, partial alpha"))
    out.append(("png_grey.png", encoded(Image.fromarray(grey, "L"), "PNG"), "PNG grey 8-bit"))
    out.append(("png_la.png", encoded(Image.fromarray(np.dstack([grey, a40]), "LA"), "PNG"),
                "PNG grey + alpha 8-bit"))
    out.append(("png_rgb_trns.png",
                encoded(Image.fromarray(small), "PNG", transparency=tuple(int(v) for v in small[0, 0])),
                "PNG RGB with a tRNS colour"))
    # palette: 16 colours, tRNS with several alpha levels and shorter than the palette
    pal_idx = (np.arange(40 * 30).reshape(30, 40) * 7 // 11 % 16).astype(np.uint8)
    pal_im = Image.fromarray(pal_idx, "P")
    pal_im.putpalette([int(v) for v in tiny.reshape(-1, 3)[::24][:16].reshape(-1)])
    out.append(("png_palette_trns.png",
                encoded(pal_im, "PNG", transparency=bytes([0, 64, 128, 200, 255, 10]), bits=8),
                "PNG palette 8-bit with a tRNS of 6 alphas"))
    # 4-bit palette of 5 colours: index 15 lies past the palette (PIL reads it as black)
    idx4 = (np.arange(24 * 16).reshape(16, 24) % 6).astype(np.uint8)
    idx4[0, 0] = 15
    plte = bytes([255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30, 200, 200, 0])
    out.append(("png_palette4.png",
                png_file(idx4[..., None], 4, 3, png_chunk(b"PLTE", plte) + png_chunk(b"tRNS", b"\x00\x80")),
                "PNG palette 4-bit, short tRNS, an index past the palette"))
    # 2-bit grey with tRNS 2: PIL compares the raw tRNS value with the 0/85/170/255 samples, so
    # nothing becomes transparent (a PIL quirk the decoder follows)
    g2 = (np.arange(24 * 16).reshape(16, 24) // 5 % 4).astype(np.uint8)
    out.append(("png_grey2_trns.png", png_file(g2[..., None], 2, 0, png_chunk(b"tRNS", b"\x00\x02")),
                "PNG grey 2-bit with tRNS"))
    # 16-bit: colour samples keep their high byte; grey (PIL mode I;16) is clipped to 255
    rgb16 = tiny.astype(np.uint16) * 256 + rng.integers(0, 256, tiny.shape)
    out.append(("png_rgb16_interlaced.png", png_file(rgb16, 16, 2, interlace=True),
                "PNG RGB 16-bit, Adam7 interlaced"))
    rgba16 = np.dstack([rgb16, alpha_plane(24, 16).astype(np.uint16) * 256 + 100])
    out.append(("png_rgba16.png", png_file(rgba16, 16, 6), "PNG RGBA 16-bit"))
    grey16 = (np.arange(24 * 16).reshape(16, 24) * 7 % 700).astype(np.uint16)
    out.append(("png_grey16.png", png_file(grey16[..., None], 16, 0),
                "PNG grey 16-bit (values 0-699: clipped at 255 by PIL)"))

    out.append(("jpeg_baseline.jpg", encoded(Image.fromarray(odd), "JPEG", quality=88, subsampling=2),
                "JPEG baseline 4:2:0, odd size"))
    out.append(("jpeg_444.jpg", encoded(Image.fromarray(small), "JPEG", quality=92, subsampling=0),
                "JPEG baseline 4:4:4"))
    out.append(("jpeg_progressive.jpg",
                encoded(Image.fromarray(pic), "JPEG", quality=80, subsampling=1, progressive=True),
                "JPEG progressive 4:2:2"))
    out.append(("jpeg_grey.jpg", encoded(Image.fromarray(grey, "L"), "JPEG", quality=85),
                "JPEG grey"))
    cmyk = Image.fromarray(small).convert("CMYK")
    out.append(("jpeg_cmyk.jpg", encoded(cmyk, "JPEG", quality=90), "JPEG CMYK (Adobe, inverted)"))

    out.append(("webp_lossy.webp", encoded(Image.fromarray(small), "WEBP", quality=80, method=4),
                "WebP lossy"))
    out.append(("webp_lossless_alpha.webp",
                encoded(Image.fromarray(np.dstack([tiny, alpha_plane(24, 16)]), "RGBA"), "WEBP",
                        lossless=True, method=4),
                "WebP lossless with alpha"))
    out.append(("webp_lossy_alpha.webp",
                encoded(Image.fromarray(np.dstack([small, a40]), "RGBA"), "WEBP", quality=75,
                        alpha_quality=100, method=4),
                "WebP lossy with alpha"))

    # EXIF orientation (transformers' load_image applies ImageOps.exif_transpose): 24x16, not
    # square, so a wrong rotation changes the size or the bytes
    for k in range(2, 9):
        exif = Image.Exif()
        exif[0x0112] = k
        out.append((f"jpeg_exif_orient{k}.jpg",
                    encoded(Image.fromarray(tiny), "JPEG", quality=90, exif=exif),
                    f"JPEG with EXIF orientation {k}"))
    # Pillow writes big-endian ("MM") EXIF; the same orientation 6 little-endian ("II"), with a
    # second IFD0 entry before it
    le = b"II*\0" + struct.pack("<IH", 8, 2) + struct.pack("<HHI4s", 0x010F, 2, 4, b"Cam\0") \
        + struct.pack("<HHIHH", 0x0112, 3, 1, 6, 0) + struct.pack("<I", 0)
    out.append(("jpeg_exif_orient6_le.jpg",
                exif_replaced(encoded(Image.fromarray(tiny), "JPEG", quality=90, exif=exif),
                              b"Exif\0\0" + le),
                "JPEG with a little-endian EXIF block, orientation 6"))
    out.append(("jpeg_exif_bad.jpg", exif_garbled(encoded(Image.fromarray(tiny), "JPEG",
                                                          quality=90, exif=exif)),
                "JPEG with a damaged EXIF block (IFD0 cut before its Orientation entry): "
                "orientation 1"))
    out += orientation_sources(tiny)
    return out


# ---- orientation from other places than a JPEG's EXIF: (name, bytes, what, orientation PIL
# applies); all 24x16, so a wrong rotation changes the size or the bytes ----

def exif_tiff(k=None, make=False):
    """An EXIF block as Pillow writes it (b"Exif\0\0" + big-endian TIFF): IFD0 with an
    Orientation k (None: none) and, with make, a Make entry."""
    e = Image.Exif()
    if make:
        e[0x010F] = "Cam"
    if k is not None:
        e[0x0112] = k
    return e.tobytes()


def xmp_packet(k, element=False):
    """An XMP packet with tiff:Orientation k, as an attribute (Adobe's usual form) or an
    element; both are what PIL's getexif searches for."""
    orient = (f"<tiff:Orientation>{k}</tiff:Orientation>" if element
              else f'tiff:Orientation="{k}"')
    desc = (f'<rdf:Description rdf:about="" xmlns:tiff="http://ns.adobe.com/tiff/1.0/">{orient}'
            "</rdf:Description>" if element else
            f'<rdf:Description rdf:about="" xmlns:tiff="http://ns.adobe.com/tiff/1.0/" {orient}/>')
    return ('<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>'
            '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF '
            'xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            f"{desc}</rdf:RDF></x:xmpmeta><?xpacket end=\"w\"?>").encode()


def raw_profile(block):
    """ImageMagick's "Raw profile type exif" text: a blank line, the type, the length, then the
    block in hex, 72 digits a line."""
    h = block.hex()
    return (f"\nexif\n{len(block):8}\n" +
            "\n".join(h[i:i + 72] for i in range(0, len(h), 72)) + "\n").encode()


def text_chunk(kind, key, value, compress=False):
    """A tEXt, zTXt or iTXt chunk (iTXt: compressed or not, no language)."""
    if kind == b"tEXt":
        return png_chunk(kind, key + b"\0" + value)
    if kind == b"zTXt":
        return png_chunk(kind, key + b"\0\0" + zlib.compress(value, 9))
    body = zlib.compress(value, 9) if compress else value
    return png_chunk(kind, key + b"\0" + bytes([int(compress), 0]) + b"\0\0" + body)


def png_with(png, before=b"", after=b""):
    """png (as Pillow writes it: one IDAT, IEND last) with chunks put before its first IDAT and
    after its last one."""
    at = png.index(b"IDAT") - 4
    end = len(png) - 12
    assert png[end + 4:end + 8] == b"IEND"
    return png[:at] + before + png[at:end] + after + png[end:]


def webp_chunk(kind, data):
    return kind + struct.pack("<I", len(data)) + data + b"\0" * (len(data) & 1)


def webp_with(webp, chunks=b"", clear_flags=0):
    """webp (an extended file) with chunks appended and VP8X flags cleared, sizes fixed."""
    assert webp[12:16] == b"VP8X"
    body = bytearray(webp[12:] + chunks)
    body[8] &= ~clear_flags & 0xFF
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + bytes(body)


def jpeg_app1(jpg, body):
    """jpg with an APP1 segment holding body put right after its SOI."""
    return jpg[:2] + b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body + jpg[2:]


def orientation_sources(tiny):
    im = Image.fromarray(tiny)
    png = encoded(im, "PNG")
    xmp_ns = b"http://ns.adobe.com/xap/1.0/\0"
    out = []

    def add(name, data, what, k):
        out.append((name, data, what, k))

    # PNG: eXIf (Pillow writes it before the image data), wherever it is, the last one wins
    add("png_exif_orient6.png", encoded(im, "PNG", exif=exif_tiff(6)), "PNG eXIf orientation 6", 6)
    add("png_exif_after_idat.png",
        png_with(png, png_chunk(b"eXIf", exif_tiff(3)[6:]), png_chunk(b"eXIf", exif_tiff(8)[6:])),
        "PNG eXIf 3 before the image data, eXIf 8 after it (the last wins)", 8)
    add("png_text_exif.png",
        png_with(png, png_chunk(b"eXIf", exif_tiff(3)[6:]),
                 text_chunk(b"tEXt", b"exif", exif_tiff(5)[6:])),
        "PNG eXIf 3, then a tEXt keyed exif (raw TIFF) holding 5 (also info['exif']: it wins)", 5)
    add("png_rawprofile_ztxt.png",
        png_with(png, text_chunk(b"zTXt", b"Raw profile type exif", raw_profile(exif_tiff(7)))),
        "PNG zTXt 'Raw profile type exif' (ImageMagick's hex) orientation 7", 7)
    add("png_exif_vs_rawprofile.png",
        png_with(png, png_chunk(b"eXIf", exif_tiff(2)[6:]),
                 text_chunk(b"tEXt", b"Raw profile type exif", raw_profile(exif_tiff(4)))),
        "PNG eXIf 2, a later tEXt raw profile 4 (read only without info['exif']): 2", 2)
    add("png_xmp_itxt.png",
        png_with(png, text_chunk(b"iTXt", b"XML:com.adobe.xmp", xmp_packet(6, element=True),
                                 compress=True)),
        "PNG compressed iTXt XMP <tiff:Orientation>6</tiff:Orientation>, no EXIF", 6)
    add("png_exif_noorient_xmp.png",
        png_with(png, png_chunk(b"eXIf", exif_tiff(None, make=True)[6:]),
                 text_chunk(b"tEXt", b"XML:com.adobe.xmp", xmp_packet(8))),
        "PNG eXIf without an Orientation (a Make only), tEXt XMP tiff:Orientation=\"8\": 8", 8)
    add("png_exif1_xmp.png",
        png_with(png, png_chunk(b"eXIf", exif_tiff(1)[6:]),
                 text_chunk(b"iTXt", b"XML:com.adobe.xmp", xmp_packet(6))),
        "PNG eXIf orientation 1 and iTXt XMP 6: the XMP is not read, 1", 1)
    bad = bytearray(text_chunk(b"zTXt", b"Raw profile type exif", raw_profile(exif_tiff(3))))
    bad[8 + 23:8 + 27] = b"\xff\xff\xff\xff"  # zlib header and all: after IDAT, no CRC check
    add("png_ztxt_bad.png",
        png_with(png, text_chunk(b"tEXt", b"Raw profile type exif", raw_profile(exif_tiff(4))),
                 bytes(bad) + text_chunk(b"iTXt", b"XML:com.adobe.xmp", xmp_packet(2))),
        "PNG raw profile 4, then (after the image data) a zTXt raw profile with corrupt zlib "
        "(PIL: an empty text, so no EXIF) and iTXt XMP 2: 2", 2)

    # WebP: the demuxer's first EXIF / XMP chunk, stored only when VP8X's flag says so
    add("webp_lossy_exif3.webp",
        encoded(im, "WEBP", quality=80, method=4, exif=exif_tiff(3)), "WebP lossy, EXIF 3", 3)
    add("webp_lossless_exif8.webp",
        encoded(im, "WEBP", lossless=True, method=4, exif=exif_tiff(8)),
        "WebP lossless, EXIF 8", 8)
    add("webp_xmp6.webp", encoded(im, "WEBP", quality=80, method=4, xmp=xmp_packet(6)),
        "WebP lossy, XMP tiff:Orientation=\"6\" only", 6)
    lossy6 = encoded(im, "WEBP", quality=80, method=4, exif=exif_tiff(6))
    add("webp_exif_two.webp", webp_with(lossy6, webp_chunk(b"EXIF", exif_tiff(3)[6:])),
        "WebP with two EXIF chunks, 6 then 3: the first wins", 6)
    add("webp_exif_noflag.webp", webp_with(lossy6, clear_flags=0x08),
        "WebP with an EXIF chunk (6) but VP8X's EXIF flag clear: not read, 1", 1)

    # JPEG: XMP in APP1 when the EXIF stores no Orientation; the last XMP segment wins
    add("jpeg_xmp6.jpg", encoded(im, "JPEG", quality=90, xmp=xmp_packet(6, element=True)),
        "JPEG with XMP <tiff:Orientation>6</tiff:Orientation> only", 6)
    add("jpeg_exif1_xmp6.jpg", encoded(im, "JPEG", quality=90, exif=exif_tiff(1),
                                       xmp=xmp_packet(6)),
        "JPEG with EXIF orientation 1 and XMP 6: the XMP is not read, 1", 1)
    add("jpeg_exif_noorient_xmp8.jpg",
        encoded(im, "JPEG", quality=90, exif=exif_tiff(None, make=True), xmp=xmp_packet(8)),
        "JPEG with EXIF without an Orientation (a Make only) and XMP 8: 8", 8)
    add("jpeg_exif_notiff_xmp6.jpg",
        exif_replaced(encoded(im, "JPEG", quality=90, exif=exif_tiff(6), xmp=xmp_packet(6)),
                      b"Exif\0\0" + b"not a TIFF header"),
        "JPEG whose EXIF block is not TIFF, with XMP 6: PIL's failed EXIF read at open keeps an "
        "empty Exif, XMP unsearched: 1", 1)
    add("jpeg_xmp_two.jpg",
        jpeg_app1(encoded(im, "JPEG", quality=90, xmp=xmp_packet(6)), xmp_ns + xmp_packet(3)),
        "JPEG with two XMP segments, 3 then 6: the last wins", 6)
    return out


def exif_replaced(jpg, body):
    """jpg with its APP1 segment's contents replaced by body."""
    at = jpg.index(b"\xff\xe1")
    n = struct.unpack(">H", jpg[at + 2:at + 4])[0]
    return jpg[:at + 2] + struct.pack(">H", len(body) + 2) + body + jpg[at + 2 + n:]


def exif_garbled(jpg):
    """jpg (with an APP1 Exif block whose IFD0 holds one entry, Orientation) with that block
    cut inside the entry (the marker length adjusted, so the JPEG itself stays well-formed) and
    a stray 0xFF byte: PIL reads no orientation from it."""
    at = jpg.index(b"\xff\xe1")
    n = struct.unpack(">H", jpg[at + 2:at + 4])[0]
    body = jpg[at + 4:at + 2 + n]
    assert body[:16] == b"Exif\0\0MM\0*\0\0\0\x08\0\x01" and body[16:18] == b"\x01\x12", body[:20]
    return exif_replaced(jpg, body[:6 + 8 + 2 + 7] + b"\xff")


def hf_rgb(data):
    """What a Hugging Face image processor sees: PIL's decode, then convert_to_rgb's rule
    (written out here so transformers is not needed: alpha composited over opaque white with
    PIL's alpha_composite, otherwise convert("RGB"))."""
    im = Image.open(io.BytesIO(data))
    im.load()
    # transformers.image_utils.load_image: every image it loads is made upright
    im = ImageOps.exif_transpose(im)
    if "A" in im.getbands() or im.info.get("transparency") is not None:
        bg = Image.new("RGBA", im.size, (255, 255, 255, 255))
        rgb = Image.alpha_composite(bg, im.convert("RGBA")).convert("RGB")
    else:
        rgb = im.convert("RGB")
    try:  # the rule above is transformers' own: check it against the installed one
        from transformers.image_transforms import convert_to_rgb
        ref = convert_to_rgb(ImageOps.exif_transpose(Image.open(io.BytesIO(data))),
                             return_numpy=True)
        assert np.array_equal(np.asarray(rgb), ref), "convert_to_rgb disagrees"
        if "A" not in im.getbands() and im.info.get("transparency") is None:  # load_image too
            import base64
            from transformers.image_utils import load_image
            url = "data:image/x;base64," + base64.b64encode(data).decode()
            assert np.array_equal(np.asarray(rgb), np.asarray(load_image(url))), "load_image"
    except ImportError:
        pass
    return rgb, im.mode


# (source fixture, sizes): down by non-integer factors, up, one axis at a time, both ways at once;
# 150x31, 60x20 and 40x9 shrink the height by more than twice as many pixels as the width, so
# Pillow 13 runs its vertical pass first (54x28 is the boundary: horizontal first)
RESIZES = [
    ("png_rgb.png", [(27, 19), (13, 7), (100, 75), (64, 20), (29, 48), (150, 31), (60, 20),
                     (54, 28), (1, 1)]),
    ("jpeg_baseline.jpg", [(17, 12), (90, 62), (45, 100), (7, 3), (44, 30), (40, 9)]),
]


def torchvision_check(src_rgb):
    """The Qwen2-VL image processor's torchvision backend (bicubic, antialias) against PIL's
    resize for one image, at the size its smart_resize picks; None without torchvision."""
    try:
        import torch
        from transformers.image_utils import PILImageResampling, SizeDict
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import (
            Qwen2VLImageProcessor, smart_resize)
        import torchvision
    except Exception as e:  # noqa: BLE001 - optional
        print(f"torchvision check skipped: {e}", file=sys.stderr)
        return None
    proc = Qwen2VLImageProcessor()
    h, w = src_rgb.shape[:2]
    factor = proc.patch_size * proc.merge_size
    min_px, max_px = factor * factor * 4, factor * factor * 64
    th, tw = smart_resize(h, w, factor=factor, min_pixels=min_px, max_pixels=max_px)
    t = torch.from_numpy(src_rgb.copy()).permute(2, 0, 1)[None].contiguous()
    tv = proc.resize(t, size=SizeDict(shortest_edge=min_px, longest_edge=max_px),
                     resample=PILImageResampling.BICUBIC, factor=factor)
    tv = tv[0].permute(1, 2, 0).numpy().astype(np.int16)
    pil = np.asarray(Image.fromarray(src_rgb).resize((tw, th), Image.BICUBIC)).astype(np.int16)
    d = np.abs(tv - pil)
    return dict(source="png_rgb.png", width=tw, height=th, max_abs_diff=int(d.max()),
                values_differing=int((d > 0).sum()), values=int(d.size),
                torchvision=torchvision.__version__, torch=torch.__version__)


# exif_transpose's transposes, by orientation (1: none)
TRANSPOSE = {1: lambda im: im.copy()} | {
    k: (lambda m: lambda im: im.transpose(m))(m) for k, m in {
        2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
        4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
        6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_90}.items()}


def previous_torchvision():
    """The torchvision measurement of the fixtures being replaced (manifest entry, VERSIONS.json),
    or (None, {})."""
    try:
        with open(os.path.join(OUT, "manifest.json")) as f:
            tv = json.load(f).get("torchvision_vs_pil")
        with open(os.path.join(OUT, "VERSIONS.json")) as f:
            return tv, json.load(f)
    except (OSError, ValueError):
        return None, {}


def main():
    if not os.path.isdir("tests/fixtures"):
        sys.exit("run from the repository root")
    import PIL
    if int(PIL.__version__.split(".")[0]) < 13:  # its resize pass order is what src/image follows
        sys.exit(f"Pillow {PIL.__version__}: the fixtures are made with Pillow 13 or later")
    old_tv, old_versions = previous_torchvision()
    if os.path.exists(OUT):
        if os.listdir(OUT) and not os.path.exists(os.path.join(OUT, "VERSIONS.json")):
            sys.exit(f"refusing to delete {OUT}: not a fixture directory (no VERSIONS.json)")
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    rng = np.random.default_rng(SEED)
    manifest = {"decode": [], "resize": []}
    decoded = {}
    for name, data, what, *orient in sources(rng):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        rgb, mode = hf_rgb(data)
        if name == "jpeg_exif_bad.jpg":
            plain = Image.open(io.BytesIO(data)).convert("RGB")
            assert np.array_equal(np.asarray(rgb), np.asarray(plain)), "damaged EXIF applied"
        if orient:  # PIL applied the orientation the fixture is meant to exercise
            plain = Image.open(io.BytesIO(data)).convert("RGB")
            assert np.array_equal(np.asarray(rgb), np.asarray(TRANSPOSE[orient[0]](plain))), name
        arr = np.asarray(rgb)
        decoded[name] = arr
        raw = name.rsplit(".", 1)[0] + ".rgb"
        with open(os.path.join(OUT, raw), "wb") as f:
            f.write(arr.tobytes())
        manifest["decode"].append(dict(file=name, rgb=raw, width=rgb.width, height=rgb.height,
                                       pil_mode=mode, what=what))
        if orient:
            manifest["decode"][-1]["orientation"] = orient[0]
    for name, sizes in RESIZES:
        src = decoded[name]
        for w, h in sizes:
            out = np.asarray(Image.fromarray(src).resize((w, h), Image.BICUBIC))
            raw = f"resize_{name.rsplit('.', 1)[0]}_{w}x{h}.rgb"
            with open(os.path.join(OUT, raw), "wb") as f:
                f.write(out.tobytes())
            manifest["resize"].append(dict(source=name, width=w, height=h, rgb=raw))
    tv = torchvision_check(decoded["png_rgb.png"])
    if tv:
        manifest["torchvision_vs_pil"] = tv
    elif old_tv:  # measured on a machine with torchvision: keep it
        manifest["torchvision_vs_pil"] = old_tv
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    versions = dict(Pillow=PIL.__version__, numpy=np.__version__, python=platform.python_version(),
                    libjpeg_turbo=features.version("libjpeg_turbo"), webp=features.version("webp"),
                    zlib=features.version("zlib"), seed=SEED,
                    command="python3 tools/gen_image_fixtures.py (run from the repository root)")
    if tv:
        versions.update(torchvision=tv["torchvision"], torch=tv["torch"])
    elif old_tv:
        versions.update({k: old_versions[k] for k in ("torchvision", "torch") if k in old_versions})
    with open(os.path.join(OUT, "VERSIONS.json"), "w") as f:
        json.dump(versions, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT, p)) for p in os.listdir(OUT))
    print(f"{OUT}: {len(os.listdir(OUT))} files, {total / 1024:.0f} KiB")
    if tv:
        print(f"torchvision vs PIL ({tv['width']}x{tv['height']}): max |diff| {tv['max_abs_diff']}, "
              f"{tv['values_differing']} of {tv['values']} values differ")


if __name__ == "__main__":
    main()
