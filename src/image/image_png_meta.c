/* A PNG's orientation as transformers' load_image gets it: Image.open + ImageOps.exif_transpose,
 * which loads the image first (so the chunks after the image data are read too) and then takes
 * Image.getexif()'s Orientation. For a PNG, getexif reads PngImagePlugin's info dictionary:
 *
 *   - info["exif"]: set by an eXIf chunk ("Exif\0\0" + its bytes) or a tEXt keyed "exif" (its
 *     bytes); a zTXt or iTXt keyed "exif" sets it to a str, which Exif.load cannot read;
 *   - else info["Raw profile type exif"] (ImageMagick's: a tEXt, zTXt or iTXt whose text after
 *     its first three lines is the block in hex), decoded with bytes.fromhex;
 *   - if that EXIF stores no Orientation: the digit of the first tiff:Orientation="d or
 *     tiff:Orientation>d in info["XML:com.adobe.xmp"] (a tEXt, zTXt or iTXt of that key), or if
 *     that is empty in info["xmp"] (the bytes of such an iTXt, set before its UTF-8 check).
 *
 * A later chunk replaces an earlier one's value. The file's chunks are walked here from the raw
 * bytes, with Pillow's rules: before the first IDAT, as Image.open reads them (a bad CRC makes
 * Pillow refuse the file; libpng drops such an ancillary chunk, and so do we); after it, as
 * load_end reads them: no CRC check, up to IEND, a chunk type that is not four word characters,
 * the end of the data or, in an animated PNG, the next frame's fcTL. zTXt and compressed iTXt are
 * inflated as PIL's _safe_zlib_decompress does: a stream cut short gives what it holds; a
 * corrupt one leaves a zTXt's value empty and an iTXt unread.
 *
 * Never an error: where Pillow raises (a chunk cut by the end of the file after the image data,
 * a zTXt compression method other than 0, text inflating past MAX_TEXT_CHUNK, an EXIF header
 * that is not TIFF, a str "exif", hex that bytes.fromhex refuses), the chunk is ignored or the
 * EXIF is taken as storing no Orientation, so the XMP is searched. Past PNG_INFLATE_BUDGET
 * inflated bytes in the whole file, further compressed chunks are ignored, so that a file cannot
 * make us inflate a megabyte per kilobyte of it over and over. */
#include "base/utf8.h"
#include "image/image_int.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* PIL's PngImagePlugin.MAX_TEXT_CHUNK: a zTXt / iTXt inflating to more makes it raise. */
#define PNG_TEXT_MAX ((size_t)1 << 20)
/* Inflated bytes allowed in one file (a real one holds a few kilobytes of text). */
#define PNG_INFLATE_BUDGET ((size_t)16 << 20)

/* Marks a value not set (info has no such key); for the XMP ones, also an empty value. */
#define META_UNSET (-2)

/* What getexif will find, each value reduced as soon as it is set (a later chunk replaces it):
 * the EXIF ones to img_exif_orientation's result, the XMP ones to img_xmp_orientation's or
 * META_UNSET when empty (getexif tests them for truth). */
typedef struct {
    int exif;      /* info["exif"] */
    int raw;       /* info["Raw profile type exif"] */
    int xmp_text;  /* info["XML:com.adobe.xmp"] */
    int xmp;       /* info["xmp"] */
    size_t budget; /* inflated bytes left (PNG_INFLATE_BUDGET) */
    uint8_t *buf;  /* meta_inflate's output, reused chunk after chunk (freed at the end) */
    size_t buf_size;
    long frames;   /* acTL's frame count, -1 without one (PIL's im_n_frames = None) */
    bool bbox;     /* an fcTL came before the image data (PIL's info["bbox"]) */
} png_meta;

/* The keys getexif looks at. */
typedef enum { KEY_OTHER, KEY_EXIF, KEY_RAW, KEY_XMP } meta_key;

static meta_key key_of(const uint8_t *k, size_t n) {
    static const struct {
        const char *name;
        meta_key key;
    } keys[] = {
        {"exif", KEY_EXIF}, {"Raw profile type exif", KEY_RAW}, {"XML:com.adobe.xmp", KEY_XMP}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strlen(keys[i].name) == n && memcmp(keys[i].name, k, n) == 0) return keys[i].key;
    return KEY_OTHER;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Python's bytes.fromhex on the text after the first three '\n'-separated lines with the other
 * '\n's removed (getexif's "".join(text.split("\n")[3:])), then the block's Orientation.
 * fromhex skips ASCII whitespace between byte pairs only and refuses anything else, non-ASCII
 * included: IMG_EXIF_UNREADABLE (PIL raises ValueError). */
static int raw_profile_orientation(const uint8_t *t, size_t n) {
    size_t at = 0;
    for (int lines = 0; lines < 3; at++) {
        if (at == n) return img_exif_orientation(NULL, 0); /* fewer lines: b"" */
        if (t[at] == '\n') lines++;
    }
    uint8_t *out = malloc((n - at) / 2 + 1);
    if (!out) return IMG_EXIF_ABSENT;
    size_t len = 0;
    int half = -1; /* the high nibble read, or -1 between pairs */
    bool bad = false;
    for (; at < n && !bad; at++) {
        uint8_t c = t[at];
        if (c == '\n') continue; /* removed by the join, so it may even split a pair */
        int v = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (v < 0) {
            /* space, \t, \v, \f, \r: Python's Py_ISSPACE */
            bool space = c == ' ' || (c >= '\t' && c <= '\r');
            bad = !space || half >= 0;
        } else if (half < 0) {
            half = v;
        } else {
            out[len++] = (uint8_t)(half << 4 | v);
            half = -1;
        }
    }
    int o = bad || half >= 0 ? IMG_EXIF_UNREADABLE : img_exif_orientation(out, len);
    free(out);
    return o;
}

typedef enum { INFLATE_OK, INFLATE_CORRUPT, INFLATE_REFUSED } inflate_result;

/* PIL's _safe_zlib_decompress: zlib.decompressobj().decompress(z, MAX_TEXT_CHUNK), refused
 * (ValueError) when input is left over at that size. A stream cut short is what it holds; data
 * after its end is ignored; a corrupt one is zlib.error. *out (malloc'd, the caller frees) and
 * *len on INFLATE_OK. INFLATE_REFUSED too when the file's budget is spent or memory is short. */
static inflate_result meta_inflate(png_meta *m, const uint8_t *z, size_t n, uint8_t **out,
                                   size_t *len) {
    size_t cap = PNG_TEXT_MAX < m->budget ? PNG_TEXT_MAX : m->budget;
    if (cap == 0) return INFLATE_REFUSED;
    z_stream s = {0};
    if (inflateInit(&s) != Z_OK) return INFLATE_REFUSED;
    s.next_in = (Bytef *)z;
    s.avail_in = (uInt)n; /* a chunk is under 2^31 bytes */
    size_t got = 0;
    int rc = Z_OK;
    /* one buffer for the file's chunks, grown with what comes out (from a few times the
     * input): a small chunk must not cost a megabyte, nor many chunks many allocations */
    for (;;) {
        size_t room = m->buf_size < cap ? m->buf_size : cap;
        if (got == room) {
            size_t want = got ? 2 * got : 8 * n + 64;
            want = want < cap ? want : cap;
            if (want > m->buf_size) {
                uint8_t *nb = realloc(m->buf, want);
                if (!nb) {
                    inflateEnd(&s);
                    return INFLATE_REFUSED;
                }
                m->buf = nb, m->buf_size = want;
            }
            room = want;
        }
        s.next_out = m->buf + got;
        s.avail_out = (uInt)(room - got);
        rc = inflate(&s, Z_SYNC_FLUSH);
        got = room - s.avail_out;
        if (rc != Z_OK || s.avail_out > 0 || got == cap) break;
    }
    bool full_with_input_left = got == cap && s.avail_in > 0;
    inflateEnd(&s);
    m->budget -= got;
    inflate_result r = rc == Z_STREAM_END                ? INFLATE_OK
                       : rc != Z_OK && rc != Z_BUF_ERROR ? INFLATE_CORRUPT
                       : full_with_input_left            ? INFLATE_REFUSED
                                                         : INFLATE_OK;
    if (r != INFLATE_OK) return r;
    *out = m->buf;
    *len = got;
    return INFLATE_OK;
}

/* A text value v (n bytes) set for key: each reduced as getexif will use it. A str "exif" (from
 * a zTXt or iTXt) is one Exif.load cannot read. */
static void meta_set(png_meta *m, meta_key key, bool str, const uint8_t *v, size_t n) {
    switch (key) {
    case KEY_EXIF: m->exif = str ? IMG_EXIF_UNREADABLE : img_exif_orientation(v, n); break;
    case KEY_RAW: m->raw = raw_profile_orientation(v, n); break;
    case KEY_XMP: m->xmp_text = n ? img_xmp_orientation(v, n) : META_UNSET; break;
    default: break;
    }
}

/* A chunk's key and what follows the NUL after it; no NUL: the whole chunk is the key. */
static void split_key(const uint8_t *d, size_t n, size_t *klen, const uint8_t **rest,
                      size_t *rlen) {
    const uint8_t *z = memchr(d, 0, n);
    *klen = z ? (size_t)(z - d) : n;
    *rest = z ? z + 1 : d + n;
    *rlen = z ? n - *klen - 1 : 0;
}

/* PngStream.chunk_tEXt: latin-1 text; "exif" keeps the bytes. */
static void chunk_text(png_meta *m, const uint8_t *d, size_t n) {
    size_t klen, vlen;
    const uint8_t *v;
    split_key(d, n, &klen, &v, &vlen);
    if (klen) meta_set(m, key_of(d, klen), false, v, vlen);
}

/* PngStream.chunk_zTXt: a compression byte (0, or PIL raises) then a zlib stream; a corrupt
 * stream is an empty text. */
static void chunk_ztext(png_meta *m, const uint8_t *d, size_t n) {
    size_t klen, vlen;
    const uint8_t *v;
    split_key(d, n, &klen, &v, &vlen);
    meta_key key = key_of(d, klen);
    if (!klen || key == KEY_OTHER) return;
    if (vlen && v[0] != 0) return; /* PIL: "Unknown compression method" */
    uint8_t *text = NULL;
    size_t len = 0;
    inflate_result r = vlen ? meta_inflate(m, v + 1, vlen - 1, &text, &len) : INFLATE_OK;
    if (r == INFLATE_REFUSED) return;
    meta_set(m, key, true, text, r == INFLATE_OK ? len : 0);
}

/* PngStream.chunk_iTXt: key, compression flag and method, language and translated key, text
 * (UTF-8, optionally deflated). Any fault leaves the chunk unread; "XML:com.adobe.xmp" also
 * sets info["xmp"] to the raw text before the UTF-8 check. */
static void chunk_itext(png_meta *m, const uint8_t *d, size_t n) {
    size_t klen, rlen;
    const uint8_t *r;
    split_key(d, n, &klen, &r, &rlen);
    if (klen == n || rlen < 2) return;
    meta_key key = key_of(d, klen);
    if (key == KEY_OTHER) return;
    uint8_t flag = r[0], method = r[1];
    const uint8_t *lang = r + 2, *end = r + rlen;
    const uint8_t *z1 = memchr(lang, 0, (size_t)(end - lang));
    const uint8_t *z2 = z1 ? memchr(z1 + 1, 0, (size_t)(end - z1 - 1)) : NULL;
    if (!z2) return;
    const uint8_t *v = z2 + 1;
    size_t vlen = (size_t)(end - v);
    uint8_t *text = NULL;
    if (flag != 0) {
        if (method != 0) return;
        if (meta_inflate(m, v, vlen, &text, &vlen) != INFLATE_OK) return;
        v = text;
    }
    if (key == KEY_XMP) m->xmp = vlen ? img_xmp_orientation(v, vlen) : META_UNSET;
    /* Python's strict UTF-8 decoding of the three */
    if (ts_utf8_valid((const char *)lang, (size_t)(z1 - lang)) &&
        ts_utf8_valid((const char *)z1 + 1, (size_t)(z2 - z1 - 1)) &&
        ts_utf8_valid((const char *)v, vlen))
        meta_set(m, key, true, v, vlen);
}

/* PngStream.chunk_eXIf: info["exif"] = b"Exif\0\0" + data. Exif.load strips up to two such
 * prefixes, so a third one (two in the chunk) is left in front of the TIFF header. */
static void chunk_exif(png_meta *m, const uint8_t *d, size_t n) {
    if (n >= 6 && memcmp(d, "Exif\0\0", 6) == 0) {
        d += 6;
        n -= 6;
        if (n >= 6 && memcmp(d, "Exif\0\0", 6) == 0) {
            m->exif = IMG_EXIF_UNREADABLE;
            return;
        }
    }
    m->exif = img_exif_orientation(d, n);
}

/* PngStream.chunk_acTL (before the image data): a frame count of 1..2^31 is kept, and a second
 * acTL cancels the first. */
static void chunk_actl(png_meta *m, const uint8_t *d, size_t n) {
    if (n < 8) return; /* PIL raises */
    if (m->frames >= 0) {
        m->frames = -1;
        return;
    }
    uint32_t f = be32(d);
    if (f != 0 && f <= 0x80000000u) m->frames = (long)f;
}

static void meta_chunk(png_meta *m, const uint8_t *type, const uint8_t *d, size_t n) {
    if (!memcmp(type, "tEXt", 4))
        chunk_text(m, d, n);
    else if (!memcmp(type, "zTXt", 4))
        chunk_ztext(m, d, n);
    else if (!memcmp(type, "iTXt", 4))
        chunk_itext(m, d, n);
    else if (!memcmp(type, "eXIf", 4))
        chunk_exif(m, d, n);
}

/* PIL's is_cid: four word characters ([A-Za-z0-9_]). */
static bool is_cid(const uint8_t *t) {
    for (int i = 0; i < 4; i++) {
        uint8_t c = t[i];
        bool word =
            (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
        if (!word) return false;
    }
    return true;
}

/* The chunks before the first IDAT, as Image.open reads them; returns where that IDAT starts,
 * or 0 if there is none to reach (then libpng has refused the file). */
static size_t walk_header(png_meta *m, const uint8_t *data, size_t len) {
    size_t pos = 8;
    while (len - pos >= 12) {
        uint32_t n = be32(data + pos);
        const uint8_t *type = data + pos + 4, *body = data + pos + 8;
        if (!is_cid(type) || n > 0x7fffffffu || n > len - pos - 12) return 0; /* libpng refuses */
        if (!memcmp(type, "IDAT", 4)) return pos;
        uLong crc = crc32(crc32(0L, Z_NULL, 0), type, 4 + (uInt)n);
        if (crc == be32(body + n)) {
            if (!memcmp(type, "acTL", 4))
                chunk_actl(m, body, n);
            else if (!memcmp(type, "fcTL", 4))
                m->bbox = true;
            else
                meta_chunk(m, type, body, n);
        }
        pos += 12 + (size_t)n;
    }
    return 0;
}

/* The chunks from the first IDAT on, as load_end reads them (no CRC check). */
static void walk_tail(png_meta *m, const uint8_t *data, size_t len, size_t pos) {
    /* PIL's n_frames: acTL's count, plus the IDAT image when no fcTL precedes it */
    long frames = m->frames < 0 ? 1 : m->frames + !m->bbox;
    while (len - pos >= 8) {
        uint32_t n = be32(data + pos);
        const uint8_t *type = data + pos + 4;
        if (!is_cid(type) || !memcmp(type, "IEND", 4)) return;
        if (frames > 1 && !memcmp(type, "fcTL", 4)) return; /* the next frame starts */
        if (n > 0x7fffffffu || n > len - pos - 8) return;   /* PIL raises: we stop */
        meta_chunk(m, type, data + pos + 8, n);
        pos += 8 + (size_t)n;
        pos += len - pos < 4 ? len - pos : 4; /* the CRC, unchecked, perhaps cut */
    }
}

int img_png_orientation(const uint8_t *data, size_t len) {
    png_meta m = {.exif = META_UNSET,
                  .raw = META_UNSET,
                  .xmp_text = META_UNSET,
                  .xmp = META_UNSET,
                  .budget = PNG_INFLATE_BUDGET,
                  .frames = -1};
    if (len < 8) return 1;
    size_t idat = walk_header(&m, data, len);
    if (idat) walk_tail(&m, data, len, idat);
    free(m.buf);
    int exif = m.exif != META_UNSET ? m.exif : m.raw != META_UNSET ? m.raw : IMG_EXIF_ABSENT;
    if (exif == IMG_EXIF_UNREADABLE) exif = IMG_EXIF_ABSENT; /* PIL raises: we search the XMP */
    if (exif != IMG_EXIF_ABSENT) return exif;
    int digit = m.xmp_text != META_UNSET ? m.xmp_text : m.xmp;
    return digit >= 0 ? digit : 1;
}
