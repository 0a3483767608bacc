/* Images (src/image/): every fixture of tests/fixtures/image/ decodes to exactly the bytes PIL
 * + Hugging Face's convert_to_rgb give, resizes equal PIL's Image.resize(BICUBIC) byte for byte,
 * and hostile input is refused with the right status: empty and unknown data, every truncation
 * of a PNG, a JPEG and a WebP, headers declaring huge images, damaged bytes; JPEG EXIF
 * orientations 2..8 applied (and a damaged EXIF block read as none); the orientation of PNG
 * (eXIf, text chunks), WebP (EXIF, XMP chunks) and XMP in all three as exif_transpose takes it,
 * and hostile metadata (cut and huge chunk lengths, bad CRCs, corrupt or oversized zlib, bad hex,
 * bad UTF-8) never failing a decode. Every buffer given to ts_image_decode is an exact-size heap
 * copy, so an ASan build catches a read past the end. */
#include "fixture_util.h"
#include "tessera.h"
#include "testutil.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static char fixdir[1024];

static uint8_t *read_file(const char *name, size_t *n) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", fixdir, name);
    return fx_read_file(path, n);
}

/* Decodes an exact-size heap copy of the first n bytes of data. */
static ts_status decode_copy(const uint8_t *data, size_t n, ts_image **img) {
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, data, n);
    *img = NULL;
    ts_status st = ts_image_decode(copy, n, img);
    free(copy);
    return st;
}

/* Compares an image with raw RGB; returns the number of differing bytes (and the largest
 * difference in *max), or -1 when the sizes differ. */
static long compare(const ts_image *img, const uint8_t *rgb, size_t n, int *max) {
    *max = 0;
    if (!img || (size_t)img->width * img->height * 3 != n) return -1;
    long diff = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)img->rgb[i] - (int)rgb[i]);
        if (d) diff++;
        if (d > *max) *max = d;
    }
    return diff;
}

/* ---- against PIL --------------------------------------------------------------------------- */

static void test_decode_fixtures(json_t *manifest) {
    json_t *list = json_object_get(manifest, "decode"), *e;
    size_t i;
    CHECK(json_array_size(list) >= 10);
    json_array_foreach(list, i, e) {
        const char *file = json_string_value(json_object_get(e, "file"));
        const char *raw = json_string_value(json_object_get(e, "rgb"));
        int w = (int)json_integer_value(json_object_get(e, "width"));
        int h = (int)json_integer_value(json_object_get(e, "height"));
        size_t n, nr;
        uint8_t *data = read_file(file, &n), *want = read_file(raw, &nr);
        CHECKF(data && want, "%s: fixture missing", file);
        if (!data || !want) {
            free(data);
            free(want);
            continue;
        }
        ts_image *img;
        ts_status st = decode_copy(data, n, &img);
        CHECKF(st == TS_OK, "%s: %s", file, ts_last_error());
        if (st == TS_OK) {
            CHECKF(img->width == w && img->height == h, "%s: %dx%d, PIL %dx%d", file, img->width,
                   img->height, w, h);
            int max;
            long d = compare(img, want, nr, &max);
            CHECKF(d == 0, "%s: %ld bytes differ from PIL's (max %d)", file, d, max);
        }
        ts_image_free(img);
        free(data);
        free(want);
    }
}

static void test_resize_fixtures(json_t *manifest) {
    json_t *list = json_object_get(manifest, "resize"), *e,
           *dec = json_object_get(manifest, "decode");
    size_t i, j;
    CHECK(json_array_size(list) >= 8);
    json_array_foreach(list, i, e) {
        const char *srcname = json_string_value(json_object_get(e, "source"));
        int w = (int)json_integer_value(json_object_get(e, "width"));
        int h = (int)json_integer_value(json_object_get(e, "height"));
        const char *raw = json_string_value(json_object_get(e, "rgb"));
        /* the source is PIL's decode of the fixture (its .rgb), so only the resize is tested */
        ts_image src = {0};
        const char *srcraw = NULL;
        json_t *d;
        json_array_foreach(dec, j, d) {
            if (strcmp(json_string_value(json_object_get(d, "file")), srcname) == 0) {
                srcraw = json_string_value(json_object_get(d, "rgb"));
                src.width = (int)json_integer_value(json_object_get(d, "width"));
                src.height = (int)json_integer_value(json_object_get(d, "height"));
            }
        }
        size_t ns = 0, nw = 0;
        src.rgb = srcraw ? read_file(srcraw, &ns) : NULL;
        uint8_t *want = read_file(raw, &nw);
        CHECKF(src.rgb && want && ns == (size_t)src.width * src.height * 3, "%s: fixture", raw);
        if (src.rgb && want) {
            ts_image *out = NULL;
            ts_status st = ts_image_resize(&src, w, h, &out);
            CHECKF(st == TS_OK, "%s: %s", raw, ts_last_error());
            int max;
            long diff = st == TS_OK ? compare(out, want, nw, &max) : -1;
            CHECKF(diff == 0, "%s: %dx%d -> %dx%d: %ld bytes differ from PIL's (max %d)", raw,
                   src.width, src.height, w, h, diff, max);
            ts_image_free(out);
        }
        free(src.rgb);
        free(want);
    }
}

/* ---- resize arguments and invariants -------------------------------------------------------- */

static void test_resize_args(void) {
    uint8_t px[2 * 3 * 3];
    for (int i = 0; i < (int)sizeof px; i++)
        px[i] = (uint8_t)(i * 13);
    ts_image src = {.width = 3, .height = 2, .rgb = px}, *out = (ts_image *)1;
    CHECK(ts_image_resize(NULL, 4, 4, &out) == TS_ERR_INVALID);
    CHECK(ts_image_resize(&src, 0, 4, &out) == TS_ERR_INVALID);
    CHECK(ts_image_resize(&src, 4, -1, &out) == TS_ERR_INVALID);
    CHECK(ts_image_resize(&src, TS_IMAGE_MAX_SIDE + 1, 1, &out) == TS_ERR_RANGE);
    CHECK(ts_image_resize(&src, 8192, 8192, &out) == TS_ERR_RANGE); /* 64M pixels */
    CHECK(out == (ts_image *)1);                                    /* untouched on failure */
    ts_image bad = {.width = 0, .height = 2, .rgb = px};
    CHECK(ts_image_resize(&bad, 4, 4, &out) == TS_ERR_INVALID);
    CHECK(ts_image_resize(&src, 4, 4, NULL) == TS_ERR_INVALID);
    /* the same size is a copy */
    CHECK(ts_image_resize(&src, 3, 2, &out) == TS_OK);
    CHECK(out->width == 3 && out->height == 2 && memcmp(out->rgb, px, sizeof px) == 0);
    ts_image_free(out);
    /* a flat image stays flat whatever the scale (the weights of each window sum to one) */
    uint8_t *flat = malloc(37 * 23 * 3);
    memset(flat, 77, 37 * 23 * 3);
    ts_image f = {.width = 37, .height = 23, .rgb = flat};
    const int sizes[][2] = {{1, 1}, {5, 3}, {36, 23}, {37, 50}, {200, 7}, {1000, 1}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        CHECK(ts_image_resize(&f, sizes[k][0], sizes[k][1], &out) == TS_OK);
        bool same = true;
        for (size_t i = 0; i < (size_t)out->width * out->height * 3; i++)
            same &= out->rgb[i] == 77;
        CHECKF(same, "flat image resized to %dx%d", sizes[k][0], sizes[k][1]);
        ts_image_free(out);
    }
    free(flat);
    ts_image_free(NULL);
}

/* ---- hostile input ------------------------------------------------------------------------ */

static void expect(const uint8_t *data, size_t n, ts_status want, const char *frag,
                   const char *what) {
    ts_image *img;
    ts_status st = decode_copy(data, n, &img);
    CHECKF(st == want, "%s: status %d, want %d (%s)", what, st, want, ts_last_error());
    if (st != TS_OK)
        CHECKF(!frag || strstr(ts_last_error(), frag), "%s: message '%s' lacks '%s'", what,
               ts_last_error(), frag);
    ts_image_free(st == TS_OK ? img : NULL);
}

static void test_bad_input(void) {
    ts_image *img = (ts_image *)1;
    CHECK(ts_image_decode(NULL, 0, &img) == TS_ERR_FORMAT);
    CHECK(strstr(ts_last_error(), "empty"));
    CHECK(ts_image_decode(NULL, 5, &img) == TS_ERR_INVALID);
    CHECK(ts_image_decode("x", 1, NULL) == TS_ERR_INVALID);
    CHECK(img == (ts_image *)1);
    expect((const uint8_t *)"hello, world", 12, TS_ERR_UNSUPPORTED, "PNG, JPEG and WebP", "text");
    expect((const uint8_t *)"GIF89a\1\0\1\0\0\0\0;", 14, TS_ERR_UNSUPPORTED, "GIF", "GIF");
    expect((const uint8_t *)"BM\0\0\0\0\0\0\0\0", 10, TS_ERR_UNSUPPORTED, "BMP", "BMP");
    expect((const uint8_t *)"RIFF\4\0\0\0WAVEfmt ", 16, TS_ERR_UNSUPPORTED, "not WebP", "WAV");
    expect((const uint8_t *)"\0\0\0\x1c"
                            "ftypavif\0\0\0\0",
           16, TS_ERR_UNSUPPORTED, "AVIF", "AVIF");
    expect((const uint8_t *)"\x89PN", 3, TS_ERR_FORMAT, "PNG signature", "cut signature");
    expect((const uint8_t *)"\xff\xd8", 2, TS_ERR_FORMAT, "JPEG signature", "cut SOI");
    expect((const uint8_t *)"RIFF\0\0", 6, TS_ERR_FORMAT, "truncated", "cut RIFF");
    expect((const uint8_t *)"\x89PNG\r\n\x1a\n", 8, TS_ERR_FORMAT, "PNG", "bare PNG signature");
    expect((const uint8_t *)"\xff\xd8\xff\xd9", 4, TS_ERR_FORMAT, "JPEG", "SOI EOI");
}

/* Every prefix of a file: an error (with a message) or a whole image, never a crash. */
static void test_truncations(const char *name, bool all_fail) {
    size_t n;
    uint8_t *data = read_file(name, &n);
    CHECKF(data, "%s missing", name);
    if (!data) return;
    int ok = 0, bad = 0;
    for (size_t k = 0; k < n; k++) {
        ts_image *img;
        ts_status st = decode_copy(data, k, &img);
        if (st == TS_OK) {
            ok++;
            CHECK(img->width > 0 && img->height > 0 && img->rgb);
            ts_image_free(img);
        } else {
            if (st != TS_ERR_FORMAT || !ts_last_error()[0]) bad++;
        }
    }
    CHECKF(bad == 0, "%s: %d truncations gave a status other than TS_ERR_FORMAT", name, bad);
    /* PNG stops reading after the last row, JPEG accepts a missing EOI; WebP needs it all */
    CHECKF(!all_fail || ok == 0, "%s: %d truncated files decoded", name, ok);
    CHECKF(ok < 64, "%s: %d truncated files decoded", name, ok);
    free(data);
}

static uint32_t crc32_of(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0xedb88320u : c >> 1;
    }
    return ~c;
}
static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8),
    p[3] = (uint8_t)v;
}

/* A PNG's IHDR (the first chunk) set to w x h, its CRC fixed. */
static void png_set_size(uint8_t *png, uint32_t w, uint32_t h) {
    put_be32(png + 16, w);
    put_be32(png + 20, h);
    put_be32(png + 29, crc32_of(png + 12, 17));
}

/* Headers declaring huge images (refused before any pixel memory), and other header faults. */
static void test_headers(void) {
    size_t n;
    uint8_t *png = read_file("png_rgb.png", &n);
    if (png) {
        png_set_size(png, 100000, 100000);
        expect(png, n, TS_ERR_RANGE, "100000x100000", "PNG 100000x100000");
        png_set_size(png, TS_IMAGE_MAX_SIDE + 1, 1);
        expect(png, n, TS_ERR_RANGE, "over the limit", "PNG too wide");
        png_set_size(png, 8192, 8192);
        expect(png, n, TS_ERR_RANGE, "over the limit", "PNG 64M pixels");
        png_set_size(png, 0, 48);
        expect(png, n, TS_ERR_FORMAT, "PNG", "PNG width 0");
        png_set_size(png, 64, 48);
        expect(png, n, TS_OK, NULL, "PNG restored");
        png[29] ^= 1; /* IHDR CRC */
        expect(png, n, TS_ERR_FORMAT, "PNG", "PNG IHDR CRC");
        free(png);
    }
    /* JPEG sides are 16-bit: 65535 is the largest a header can declare */
    uint8_t *jpg = read_file("jpeg_baseline.jpg", &n);
    size_t sof = 0;
    for (size_t i = 2; jpg && i + 9 < n && !sof; i++)
        if (jpg[i] == 0xff && jpg[i + 1] == 0xc0) sof = i;
    CHECK(sof > 0);
    if (sof) {
        const int sizes[][2] = {{65535, 65535}, {16385, 8}, {8000, 8000}};
        for (int k = 0; k < 3; k++) {
            jpg[sof + 5] = (uint8_t)(sizes[k][1] >> 8), jpg[sof + 6] = (uint8_t)sizes[k][1];
            jpg[sof + 7] = (uint8_t)(sizes[k][0] >> 8), jpg[sof + 8] = (uint8_t)sizes[k][0];
            expect(jpg, n, TS_ERR_RANGE, "over the limit", "JPEG huge");
        }
        jpg[sof + 5] = 0, jpg[sof + 6] = 0; /* height 0 (DNL) */
        ts_image *img;
        ts_status st = decode_copy(jpg, n, &img);
        CHECKF(st == TS_ERR_FORMAT || st == TS_ERR_UNSUPPORTED, "JPEG height 0: %d", st);
        jpg[sof + 5] = 0, jpg[sof + 6] = 31;
        expect(jpg, n, TS_OK, NULL, "JPEG restored");
        jpg[sof + 4] = 12;
        expect(jpg, n, TS_ERR_UNSUPPORTED, "precision 12", "12-bit JPEG");
        jpg[sof + 4] = 8;
        jpg[sof + 1] = 0xc3;
        expect(jpg, n, TS_ERR_UNSUPPORTED, "SOF type 0xc3", "lossless JPEG");
    }
    free(jpg);
    /* WebP lossy ("VP8 " chunk): the frame header's 14-bit sides at bytes 26 and 28 */
    uint8_t *webp = read_file("webp_lossy.webp", &n);
    if (webp && memcmp(webp + 12, "VP8 ", 4) == 0) {
        webp[26] = 0xff, webp[27] = 0x3f, webp[28] = 0xff, webp[29] = 0x3f;
        expect(webp, n, TS_ERR_RANGE, "16383x16383", "WebP 16383x16383");
    } else {
        CHECKF(0, "webp_lossy.webp is not a simple lossy WebP");
    }
    free(webp);
}

/* Damaged bytes in the middle of each file: an error or an image, never a crash. */
static void test_damage(json_t *manifest) {
    json_t *list = json_object_get(manifest, "decode"), *e;
    size_t i;
    unsigned long long rng = 0x5eedf00dULL;
    json_array_foreach(list, i, e) {
        const char *file = json_string_value(json_object_get(e, "file"));
        size_t n;
        uint8_t *data = read_file(file, &n);
        if (!data) continue;
        uint8_t *m = malloc(n);
        for (int round = 0; round < 150; round++) {
            memcpy(m, data, n);
            int flips = 1 + (int)(tu_rng_next(&rng) % 4);
            for (int f = 0; f < flips; f++) {
                /* past the signature, anywhere else (headers included) */
                size_t at = 8 + tu_rng_next(&rng) % (n - 8);
                m[at] =
                    round & 1 ? (uint8_t)tu_rng_next(&rng) : m[at] ^ (uint8_t)(1u << (round % 8));
            }
            ts_image *img;
            ts_status st = decode_copy(m, n, &img);
            if (st == TS_OK) {
                CHECK(img->width > 0 && img->height > 0);
                ts_image_free(img);
            } else {
                CHECKF(st == TS_ERR_FORMAT || st == TS_ERR_UNSUPPORTED || st == TS_ERR_RANGE,
                       "%s damaged: status %d (%s)", file, st, ts_last_error());
            }
        }
        free(m);
        free(data);
    }
}

/* ---- EXIF orientation ---------------------------------------------------------------------- */

/* The orientation fixtures are all there (test_decode_fixtures compares their bytes), 5..8
 * turned on their side. */
static void test_exif_fixtures(json_t *manifest) {
    json_t *list = json_object_get(manifest, "decode"), *e;
    size_t i;
    int seen = 0;
    json_array_foreach(list, i, e) {
        const char *file = json_string_value(json_object_get(e, "file"));
        int w = (int)json_integer_value(json_object_get(e, "width"));
        int h = (int)json_integer_value(json_object_get(e, "height"));
        int k;
        if (sscanf(file, "jpeg_exif_orient%d", &k) == 1) {
            seen++;
            CHECKF(k >= 5 ? w == 16 && h == 24 : w == 24 && h == 16, "%s: %dx%d", file, w, h);
        } else if (strcmp(file, "jpeg_exif_bad.jpg") == 0) {
            seen++;
            CHECKF(w == 24 && h == 16, "%s: %dx%d", file, w, h);
        }
    }
    CHECKF(seen == 9, "%d EXIF fixtures in the manifest, 9 expected", seen);
}

/* jpeg_exif_orient6.jpg (24x16, orientation 6) with its APP1 segment replaced by the first cut
 * bytes of body (the marker length set to match), decoded: the JPEG stays well-formed, so
 * whatever the EXIF block holds the result is an image, 16x24 or 24x16. Returns the width, or 0
 * on failure. */
static int exif_variant(const uint8_t *jpg, size_t n, size_t app1, const uint8_t *body,
                        size_t cut) {
    size_t old = (size_t)jpg[app1 + 2] << 8 | jpg[app1 + 3];
    size_t rest = app1 + 2 + old, m = app1 + 4 + cut + (n - rest);
    uint8_t *v = malloc(m);
    memcpy(v, jpg, app1 + 2);
    v[app1 + 2] = (uint8_t)((cut + 2) >> 8);
    v[app1 + 3] = (uint8_t)(cut + 2);
    memcpy(v + app1 + 4, body, cut);
    memcpy(v + app1 + 4 + cut, jpg + rest, n - rest);
    ts_image *img;
    ts_status st = decode_copy(v, m, &img);
    free(v);
    CHECKF(st == TS_OK, "EXIF variant (cut %zu): %s", cut, ts_last_error());
    if (st != TS_OK) return 0;
    int w = img->width;
    CHECKF((img->width == 16 && img->height == 24) || (img->width == 24 && img->height == 16),
           "EXIF variant (cut %zu): %dx%d", cut, img->width, img->height);
    ts_image_free(img);
    return w;
}

/* A damaged EXIF block is orientation 1, never an error: every cut of it (the entry is whole
 * from 28 bytes on: "Exif\0\0", 8 of TIFF header, 2 of count, 12 of entry), absurd offsets and
 * counts, and random bytes. */
static void test_exif_damage(void) {
    size_t n;
    uint8_t *jpg = read_file("jpeg_exif_orient6.jpg", &n);
    CHECK(jpg != NULL);
    if (!jpg) return;
    size_t app1 = 2;
    while (app1 + 4 < n && !(jpg[app1] == 0xFF && jpg[app1 + 1] == 0xE1))
        app1 += 2 + ((size_t)jpg[app1 + 2] << 8 | jpg[app1 + 3]);
    CHECK(app1 + 4 < n && jpg[app1] == 0xFF && jpg[app1 + 1] == 0xE1);
    if (!(app1 + 4 < n && jpg[app1 + 1] == 0xE1)) {
        free(jpg);
        return;
    }
    size_t len = ((size_t)jpg[app1 + 2] << 8 | jpg[app1 + 3]) - 2;
    uint8_t body[256];
    CHECK(len >= 32 && len <= sizeof body);
    if (len < 32 || len > sizeof body) {
        free(jpg);
        return;
    }
    memcpy(body, jpg + app1 + 4, len);
    CHECK(memcmp(body, "Exif\0\0MM", 8) == 0);
    for (size_t cut = 0; cut <= len; cut++) {
        int w = exif_variant(jpg, n, app1, body, cut);
        CHECKF(w == (cut >= 28 ? 16 : 24), "EXIF cut at %zu: width %d", cut, w);
    }
    /* IFD offset, entry count, the entry's type and count, all at their largest: only the
     * entry count keeps the orientation (PIL reads entries until the block ends) */
    static const size_t at[] = {10, 14, 18, 20};
    static const size_t width[] = {4, 2, 2, 4};
    for (int k = 0; k < 4; k++) {
        uint8_t b[256];
        memcpy(b, body, len);
        memset(b + at[k], 0xFF, width[k]);
        CHECKF(exif_variant(jpg, n, app1, b, len) == (k == 1 ? 16 : 24),
               "EXIF field at %zu all ones", at[k]);
    }
    /* SHORT count 3: out of line, at an offset past the block */
    uint8_t b[256];
    memcpy(b, body, len);
    b[23] = 3;
    CHECK(exif_variant(jpg, n, app1, b, len) == 24);
    /* little-endian header on big-endian data: offset 0x08000000, past the block */
    memcpy(b + 6, "II*\0", 4);
    CHECK(exif_variant(jpg, n, app1, b, len) == 24);
    unsigned long long rng = 0xe81fULL;
    for (int round = 0; round < 300; round++) {
        memcpy(b, body, len);
        int flips = 1 + (int)(tu_rng_next(&rng) % 4);
        for (int f = 0; f < flips; f++)
            b[tu_rng_next(&rng) % len] = (uint8_t)tu_rng_next(&rng);
        exif_variant(jpg, n, app1, b, len);
    }
    free(jpg);
}

/* ---- orientation from PNG / WebP metadata and XMP ------------------------------------------ */

/* The orientation fixtures (manifest entries with an "orientation": which one PIL applied) are
 * all there, from a 24x16 picture, 5..8 turned on their side. test_decode_fixtures compares
 * their bytes. */
static void test_orientation_fixtures(json_t *manifest) {
    json_t *list = json_object_get(manifest, "decode"), *e;
    size_t i;
    int seen = 0, png = 0, webp = 0, jpeg = 0;
    json_array_foreach(list, i, e) {
        json_t *o = json_object_get(e, "orientation");
        if (!o) continue;
        const char *file = json_string_value(json_object_get(e, "file"));
        int k = (int)json_integer_value(o);
        int w = (int)json_integer_value(json_object_get(e, "width"));
        int h = (int)json_integer_value(json_object_get(e, "height"));
        seen++;
        png += strstr(file, ".png") != NULL;
        webp += strstr(file, ".webp") != NULL;
        jpeg += strstr(file, ".jpg") != NULL;
        CHECKF(k >= 5 && k <= 8 ? w == 16 && h == 24 : w == 24 && h == 16, "%s: %dx%d", file, w, h);
    }
    CHECKF(seen == 19 && png == 9 && webp == 5 && jpeg == 5,
           "%d orientation fixtures (%d PNG, %d WebP, %d JPEG), 19 (9, 5, 5) expected", seen, png,
           webp, jpeg);
}

static void put_be32_to(tu_bytes *b, uint32_t v) {
    uint8_t q[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    tu_put(b, q, 4);
}

/* A PNG chunk, its CRC flipped with bad_crc; len may differ from n (a lying length). */
static void put_chunk_len(tu_bytes *b, const char *type, const void *d, size_t n, uint32_t len,
                          bool bad_crc) {
    put_be32_to(b, len);
    size_t at = b->n;
    tu_put(b, type, 4);
    tu_put(b, d, n);
    put_be32_to(b, crc32_of(b->p + at, 4 + n) ^ (bad_crc ? 1u : 0u));
}

static void put_chunk(tu_bytes *b, const char *type, const void *d, size_t n) {
    put_chunk_len(b, type, d, n, (uint32_t)n, false);
}

/* A tEXt, zTXt or iTXt (uncompressed) chunk: key, then v (n bytes), zTXt's deflated. */
static void put_text(tu_bytes *b, const char *type, const char *key, const void *v, size_t n) {
    tu_bytes c = {0};
    tu_put(&c, key, strlen(key) + 1);
    if (!strcmp(type, "zTXt")) {
        uLongf zn = compressBound(n);
        uint8_t *z = malloc(zn);
        CHECK(compress2(z, &zn, v, n, 9) == Z_OK);
        tu_put(&c, "\0", 1);
        tu_put(&c, z, zn);
        free(z);
    } else {
        if (!strcmp(type, "iTXt")) tu_put(&c, "\0\0\0\0", 4); /* not compressed, no language */
        tu_put(&c, v, n);
    }
    put_chunk(b, type, c.p, c.n);
    free(c.p);
}

/* A big-endian EXIF TIFF block whose IFD0 holds Orientation k (26 bytes). */
static size_t tiff_orient(uint8_t *t, int k) {
    static const uint8_t tiff[26] = {'M', 'M', 0, '*', 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0,
                                     3,   0,   0, 0,   1, 0, 0, 0, 0, 0, 0,    0,    0};
    memcpy(t, tiff, sizeof tiff);
    t[19] = (uint8_t)k;
    return sizeof tiff;
}

/* ImageMagick's "Raw profile type exif" text for Orientation k, then pad. */
static void put_raw_profile(tu_bytes *b, int k, const char *pad) {
    uint8_t t[26];
    size_t n = tiff_orient(t, k);
    char head[32];
    snprintf(head, sizeof head, "\nexif\n%8zu\n", n);
    tu_put(b, head, strlen(head));
    for (size_t i = 0; i < n; i++) {
        char hx[3];
        snprintf(hx, sizeof hx, "%02x", t[i]);
        tu_put(b, hx, 2);
    }
    tu_put(b, pad, strlen(pad));
}

static const char *xmp_attr(int k) {
    static char x[96];
    snprintf(x, sizeof x, "<rdf:Description tiff:Orientation=\"%d\"/>", k);
    return x;
}

/* png (24x16, one IDAT) with `before` put before its IDAT and `after` after it; cut > 0 ends the
 * file there instead of with IEND. Decoded: it must be an image, and its width (16 when turned
 * on its side) is returned; 0 on failure. */
static int png_variant(const uint8_t *png, size_t n, const tu_bytes *before, const tu_bytes *after,
                       size_t cut, const char *what) {
    size_t idat = 8;
    while (idat + 8 < n && memcmp(png + idat + 4, "IDAT", 4))
        idat += 12 + ((size_t)png[idat] << 24 | (size_t)png[idat + 1] << 16 |
                      (size_t)png[idat + 2] << 8 | png[idat + 3]);
    tu_bytes f = {0};
    tu_put(&f, png, idat);
    tu_put(&f, before->p, before->n);
    tu_put(&f, png + idat, n - 12 - idat);
    tu_put(&f, after->p, after->n);
    if (cut)
        f.n = cut < f.n ? cut : f.n;
    else
        tu_put(&f, png + n - 12, 12);
    ts_image *img;
    ts_status st = decode_copy(f.p, f.n, &img);
    free(f.p);
    CHECKF(st == TS_OK, "%s: %s", what, ts_last_error());
    if (st != TS_OK) return 0;
    int w = img->width;
    CHECKF((w == 16 && img->height == 24) || (w == 24 && img->height == 16), "%s: %dx%d", what,
           img->width, img->height);
    ts_image_free(img);
    return w;
}

/* A chunk with key "Raw profile type exif" / "XML:com.adobe.xmp" holding v (n bytes). */
static void put_raw(tu_bytes *b, const char *type, const void *v, size_t n) {
    put_text(b, type, "Raw profile type exif", v, n);
}
static void put_xmp(tu_bytes *b, const char *type, int k) {
    put_text(b, type, "XML:com.adobe.xmp", xmp_attr(k), strlen(xmp_attr(k)));
}

/* Hostile PNG metadata: every case decodes; the orientation is Pillow's where it reads the file
 * (checked once against Pillow 13.0.0), and ours (src/image/README.md) where it raises. */
static void test_png_meta_hostile(void) {
    size_t n;
    uint8_t *png = read_file("png_palette4.png", &n);
    CHECK(png && n > 60 && memcmp(png + n - 8, "IEND", 4) == 0);
    if (!png) return;
    uint8_t t6[32], t3[32];
    size_t tn = tiff_orient(t6, 6);
    tiff_orient(t3, 3);
    tu_bytes none = {0}, a = {0}, b = {0}, v = {0};
    /* a: chunks before the image data, b: after it */
#define CASE(want, what)                                                                           \
    do {                                                                                           \
        int w_ = png_variant(png, n, &a, &b, 0, what);                                             \
        CHECKF(w_ == (want), "%s: width %d, want %d", what, w_, want);                             \
        a.n = b.n = v.n = 0;                                                                       \
    } while (0)

    put_chunk(&a, "eXIf", t6, tn);
    CASE(16, "eXIf 6");
    put_chunk_len(&a, "eXIf", t6, tn, (uint32_t)tn, true);
    CASE(24, "eXIf 6 with a bad CRC before the image data (libpng drops it; PIL refuses)");
    put_chunk_len(&b, "eXIf", t6, tn, (uint32_t)tn, true);
    CASE(16, "eXIf 6 with a bad CRC after the image data (PIL does not check it)");

    /* lying lengths after the image data end the walk; what came before stays */
    put_chunk(&a, "eXIf", t6, tn);
    put_chunk_len(&b, "tEXt", "k\0v", 3, 0xFFFFFFFFu, false);
    put_chunk(&b, "eXIf", t3, tn);
    CASE(16, "eXIf 6, a chunk declaring 4 GiB, eXIf 3");
    put_chunk_len(&b, "eXIf", t6, tn, 0x7FFFFFF0u, false);
    CASE(24, "eXIf 6 declaring 2 GiB");
    put_chunk(&b, "a-b!", "x", 1);
    put_chunk(&b, "eXIf", t6, tn);
    CASE(24, "a chunk type that is not four word characters (PIL's is_cid), eXIf 6");
    /* the file ending inside the chunk (no IEND): not read; inside its CRC: read */
    put_chunk(&b, "eXIf", t6, tn);
    size_t whole = n - 12 + b.n;
    CHECK(png_variant(png, n, &none, &b, whole - 6, "eXIf cut in its data") == 24);
    CHECK(png_variant(png, n, &none, &b, whole - 2, "eXIf cut in its CRC") == 16);
    b.n = 0;

    /* corrupt zlib: a zTXt's text is empty (so the raw profile holds no EXIF), an iTXt is not
     * read; a zTXt of compression method 1, or inflating past 1 MiB, is not read (PIL raises) */
    static const uint8_t bad_zlib[] = {0x78, 0x9c, 0xff, 0xff, 0xff, 0xff, 1, 2, 3};
    put_raw_profile(&v, 6, "\n");
    put_raw(&a, "tEXt", v.p, v.n);
    tu_bytes z = {0};
    tu_put(&z, "Raw profile type exif\0\0", 23);
    tu_put(&z, bad_zlib, sizeof bad_zlib);
    put_chunk(&b, "zTXt", z.p, z.n);
    CASE(24, "raw profile 6, then a zTXt raw profile of corrupt zlib");
    z.n = 0;
    tu_put(&z, "XML:com.adobe.xmp\0\1\0\0\0", 22); /* compressed, no language */
    tu_put(&z, bad_zlib, sizeof bad_zlib);
    put_chunk(&a, "iTXt", z.p, z.n);
    put_xmp(&b, "tEXt", 8);
    put_chunk(&b, "iTXt", z.p, z.n);
    CASE(16, "tEXt XMP 8 between two iTXt XMP of corrupt zlib");
    put_raw_profile(&v, 6, "\n");
    put_raw(&a, "tEXt", v.p, v.n);
    v.n = 0;
    put_raw_profile(&v, 3, "");
    for (int i = 0; i < 1100000 / 16; i++)
        tu_put(&v, "              \n ", 16);
    put_raw(&b, "zTXt", v.p, v.n);
    CASE(16, "raw profile 6, then a zTXt raw profile 3 inflating past 1 MiB");
    put_raw_profile(&v, 6, "\n");
    put_raw(&a, "tEXt", v.p, v.n);
    put_chunk(&b, "zTXt", "Raw profile type exif\0\1x", 24);
    CASE(16, "raw profile 6, then a zTXt of compression method 1");
    /* past the file's budget of inflated bytes, zTXt is not inflated: 19 raw profiles 6 of
     * 900 kB (the budget runs out in the 19th), then one of 3 */
    put_raw_profile(&v, 6, "");
    for (int i = 0; i < 900000 / 16; i++)
        tu_put(&v, "              \n ", 16);
    z.n = 0;
    put_raw(&z, "zTXt", v.p, v.n);
    for (int i = 0; i < 19; i++)
        tu_put(&b, z.p, z.n);
    v.n = 0;
    put_raw_profile(&v, 3, "\n");
    put_raw(&b, "zTXt", v.p, v.n);
    CASE(16, "20 zTXt raw profiles of 900 kB: the last one past the budget");

    /* hex that bytes.fromhex refuses, or a block too short for a TIFF header (PIL raises): no
     * EXIF, so the XMP is searched */
    static const char *bad_hex[] = {"\nexif\n 2\n4d4",      "\nexif\n 2\n4d 4d",
                                    "\nexif\n 2\n4 d",      "\nexif\n 2\nzz",
                                    "\nexif\n 2\n\xc3\xa9", "\nexif\n 2\n4d\x1c"};
    for (size_t i = 0; i < sizeof bad_hex / sizeof bad_hex[0]; i++) {
        put_raw(&a, "tEXt", bad_hex[i], strlen(bad_hex[i]));
        put_xmp(&a, "tEXt", 8);
        CASE(16, bad_hex[i]);
    }
    /* whitespace between pairs, and a newline inside one (the join removes it), are fine */
    tu_put(&v, "\nexif\n      26\n", 15);
    for (size_t i = 0; i < tn; i++) {
        char hx[8];
        snprintf(hx, sizeof hx, i == 3 ? "%x\n%x" : "%x%x \r\t\v\f", t6[i] >> 4, t6[i] & 15);
        tu_put(&v, hx, strlen(hx));
    }
    put_raw(&a, "iTXt", v.p, v.n);
    CASE(16, "raw profile with whitespace");
    put_raw(&a, "tEXt", "\nexif\n", 6); /* fewer than 3 lines: an empty EXIF */
    put_xmp(&a, "iTXt", 7);
    CASE(16, "raw profile of 2 lines, iTXt XMP 7");

    /* EXIF headers: one PIL reads as classic TIFF without entries; not TIFF (PIL raises) */
    put_chunk(&a, "eXIf", "MM\0+\0\0\0\x08\0\0", 10);
    put_xmp(&a, "tEXt", 8);
    CASE(16, "eXIf MM\\0+ without entries, XMP 8");
    put_chunk(&a, "eXIf", "hello, world", 12);
    put_xmp(&a, "tEXt", 7);
    CASE(16, "eXIf not TIFF, XMP 7");
    tu_put(&v, "Exif\0\0Exif\0\0", 12);
    tu_put(&v, t6, tn);
    put_chunk(&a, "eXIf", v.p, v.n);
    CASE(24, "eXIf with two Exif\\0\\0 before its TIFF (three with PIL's)");
    tu_put(&v, "Exif\0\0", 6);
    tu_put(&v, t6, tn);
    put_chunk(&a, "eXIf", v.p, v.n);
    CASE(16, "eXIf with one Exif\\0\\0 before its TIFF");
    put_text(&a, "zTXt", "exif", t6, tn);
    CASE(24, "a zTXt keyed exif (a str to PIL)");
    put_text(&a, "tEXt", "exif", t6, tn);
    put_text(&a, "zTXt", "exif", t6, tn);
    put_xmp(&a, "tEXt", 5);
    CASE(16, "tEXt exif 6, then a zTXt keyed exif, XMP 5");

    /* an iTXt XMP with invalid UTF-8 sets info["xmp"] only, which is read */
    tu_put(&v, xmp_attr(5), strlen(xmp_attr(5)));
    tu_put(&v, "\xed\xa0\x80", 3); /* a surrogate */
    put_text(&a, "iTXt", "XML:com.adobe.xmp", v.p, v.n);
    CASE(16, "iTXt XMP 5 with invalid UTF-8");
    put_text(&a, "iTXt", "XML:com.adobe.xmp", v.p, 0);
    put_text(&a, "tEXt", "XML:com.adobe.xmp", "nothing", 7);
    put_xmp(&b, "zTXt", 6);
    CASE(16, "XMP: empty iTXt, tEXt without an orientation, zTXt 6 (the last wins)");
    put_xmp(&a, "tEXt", 6);
    put_text(&b, "tEXt", "XML:com.adobe.xmp", "nothing", 7);
    CASE(24, "XMP: tEXt 6, then a tEXt without an orientation (the last wins)");

    /* malformed text chunks: no NUL, an empty key, short iTXt headers, an unknown method */
    static const struct {
        const char *type, *data;
        size_t len;
    } odd[] = {{"tEXt", "exif", 4},
               {"tEXt", "\0exif", 5},
               {"zTXt", "exif", 4},
               {"zTXt", "exif\0", 5},
               {"zTXt", "exif\0\0", 6},
               {"iTXt", "exif", 4},
               {"iTXt", "exif\0\1", 6},
               {"iTXt", "exif\0\0\0x", 8},
               {"iTXt", "XML:com.adobe.xmp\0\1\1\0\0x", 23}};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        put_chunk(&a, odd[i].type, odd[i].data, odd[i].len);
        put_xmp(&b, "tEXt", 6);
        /* a zTXt keyed exif is a str to PIL: we read no EXIF, so the XMP */
        CASE(16, odd[i].type);
    }
    /* every cut of the metadata after the image data: an image */
    put_chunk(&b, "eXIf", t6, tn);
    put_xmp(&b, "zTXt", 8);
    for (size_t cut = n - 12; cut < n - 12 + b.n; cut++)
        png_variant(png, n, &none, &b, cut, "metadata cut");
#undef CASE
    free(a.p);
    free(b.p);
    free(v.p);
    free(z.p);
    free(png);
}

/* Decodes data (n bytes); returns the width (0 on failure, which it must not be). */
static int decoded_width(const uint8_t *data, size_t n, const char *what) {
    ts_image *img;
    ts_status st = decode_copy(data, n, &img);
    CHECKF(st == TS_OK, "%s: %s", what, ts_last_error());
    if (st != TS_OK) return 0;
    int w = img->width;
    ts_image_free(img);
    return w;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Hostile WebP metadata: an EXIF chunk running past the RIFF (the demuxer refuses the file: no
 * orientation), an EXIF header that is not TIFF, every cut of the file in its EXIF chunk. */
static void test_webp_meta_hostile(void) {
    size_t n;
    uint8_t *webp = read_file("webp_lossy_exif3.webp", &n);
    CHECK(webp && n > 30 && memcmp(webp + 12, "VP8X", 4) == 0);
    if (!webp) return;
    size_t at = 30;
    while (at + 8 <= n && memcmp(webp + at, "EXIF", 4))
        at += 8 + le32(webp + at + 4) + (le32(webp + at + 4) & 1);
    CHECK(at + 8 <= n && decoded_width(webp, n, "webp_lossy_exif3.webp") == 24);
    if (at + 8 <= n) {
        uint8_t *m = malloc(n);
        memcpy(m, webp, n);
        m[at + 5] = 0xF0; /* size + 61440 */
        CHECK(decoded_width(m, n, "EXIF past the RIFF") == 24);
        memcpy(m, webp, n);
        m[at + 8] ^= 0x20; /* "MM" -> "mM" */
        CHECK(decoded_width(m, n, "EXIF not TIFF") == 24);
        for (size_t cut = at; cut < n; cut++) {
            ts_image *img;
            ts_status st = decode_copy(webp, cut, &img);
            CHECKF(st == TS_OK || st == TS_ERR_FORMAT, "WebP cut at %zu: %d", cut, st);
            ts_image_free(st == TS_OK ? img : NULL);
        }
        free(m);
    }
    free(webp);
}

/* XMP in a JPEG (jpeg_exif_bad.jpg: 24x16, an EXIF block storing no Orientation) with an APP1
 * segment holding payload put first: PIL's regex tiff:Orientation(="|>)([0-9]), case and all.
 * And only the segments before the first scan count. */
static void test_jpeg_xmp(void) {
    size_t n;
    uint8_t *jpg = read_file("jpeg_exif_bad.jpg", &n);
    CHECK(jpg != NULL);
    if (!jpg) return;
    static const struct {
        const char *payload;
        int width;
    } cases[] = {
        {"http://ns.adobe.com/xap/1.0/\0<x tiff:Orientation=\"6\"/>", 16},
        {"http://ns.adobe.com/xap/1.0/\0<tiff:Orientation>8</tiff:Orientation>", 16},
        {"http://ns.adobe.com/xap/1.0/\0tiff:Orientation>5", 16},
        {"http://ns.adobe.com/xap/1.0/\0tiff:Orientation=\"x\" tiff:Orientation>7", 16},
        {"http://ns.adobe.com/xap/1.0/\0tiff:Orientation=\"", 24},
        {"http://ns.adobe.com/xap/1.0/\0tiff:Orientation>", 24},
        {"http://ns.adobe.com/xap/1.0/\0tiff:Orientation='6'", 24},
        {"http://ns.adobe.com/xap/1.0/\0TIFF:Orientation=\"6\"", 24},
        {"http://ns.adobe.com/xap/1.0/\0tiff:Orientation=\"0\" tiff:Orientation=\"6\"", 24},
        {"http://ns.adobe.com/xap/1.0/\0tiff:Orientation=\"9\"", 24},
        {"http://ns.adobe.com/xap/1.0/\0", 24},
        {"http://ns.adobe.com/xap/1.0/ tiff:Orientation=\"6\"", 24}, /* no NUL: not XMP */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = cases[i].payload;
        size_t len = strlen(p); /* the namespace's NUL, then the packet */
        if (len == 28) len = 29 + strlen(p + 29);
        tu_bytes f = {0};
        tu_put(&f, jpg, 2);
        uint8_t seg[4] = {0xFF, 0xE1, (uint8_t)((len + 2) >> 8), (uint8_t)(len + 2)};
        tu_put(&f, seg, 4);
        tu_put(&f, p, len);
        tu_put(&f, jpg + 2, n - 2);
        int w = decoded_width(f.p, f.n, p + (len > 29 ? 29 : 0));
        CHECKF(w == cases[i].width, "XMP case %zu: width %d, want %d", i, w, cases[i].width);
        free(f.p);
    }
    free(jpg);
    /* an Exif segment between the scans of a progressive JPEG: not read (PIL stops at the first
     * SOS; libjpeg would save it too) */
    jpg = read_file("jpeg_progressive.jpg", &n);
    size_t sos = 0, second = 0;
    for (size_t i = 2; jpg && i + 1 < n && !second; i++) {
        if (jpg[i] != 0xFF || jpg[i + 1] != 0xDA) continue;
        if (sos)
            second = i;
        else
            sos = i;
    }
    CHECK(second > 0);
    if (second) {
        uint8_t seg[4 + 6 + 32] = {0xFF, 0xE1, 0, 2 + 6 + 26, 'E', 'x', 'i', 'f', 0, 0};
        tiff_orient(seg + 10, 6);
        tu_bytes f = {0};
        tu_put(&f, jpg, second);
        tu_put(&f, seg, 4 + 6 + 26);
        tu_put(&f, jpg + second, n - second);
        CHECK(decoded_width(f.p, f.n, "Exif between scans") == 64);
        f.n = 0;
        tu_put(&f, jpg, 2);
        tu_put(&f, seg, 4 + 6 + 26);
        tu_put(&f, jpg + 2, n - 2);
        CHECK(decoded_width(f.p, f.n, "Exif before the first scan") == 48);
        free(f.p);
    }
    free(jpg);
}

int main(void) {
    snprintf(fixdir, sizeof fixdir, "%s/image", tu_env("TS_FIXTURES", "tests/fixtures"));
    char path[1100];
    snprintf(path, sizeof path, "%s/manifest.json", fixdir);
    json_error_t jerr;
    json_t *manifest = json_load_file(path, 0, &jerr);
    CHECKF(manifest, "%s: %s", path, jerr.text);
    if (!manifest) return tu_report("test_image");

    test_decode_fixtures(manifest);
    test_resize_fixtures(manifest);
    test_resize_args();
    test_bad_input();
    test_truncations("png_rgba.png", false);
    test_truncations("png_rgb16_interlaced.png", false);
    test_truncations("png_palette4.png", false);
    test_truncations("jpeg_baseline.jpg", false);
    test_truncations("jpeg_progressive.jpg", false);
    test_truncations("webp_lossy.webp", true);
    test_truncations("webp_lossless_alpha.webp", true);
    test_headers();
    test_damage(manifest);
    test_exif_fixtures(manifest);
    test_exif_damage();
    test_orientation_fixtures(manifest);
    test_png_meta_hostile();
    test_webp_meta_hostile();
    test_jpeg_xmp();
    json_decref(manifest);
    return tu_report("test_image");
}
