/* Images (src/image/): every fixture of tests/fixtures/image/ decodes to exactly the bytes PIL
 * + Hugging Face's convert_to_rgb give, resizes equal PIL's Image.resize(BICUBIC) byte for byte,
 * and hostile input is refused with the right status: empty and unknown data, every truncation
 * of a PNG, a JPEG and a WebP, headers declaring huge images, damaged bytes; JPEG EXIF
 * orientations 2..8 applied (and a damaged EXIF block read as none). Every buffer given
 * to ts_image_decode is an exact-size heap copy, so an ASan build catches a read past the end. */
#include "fixture_util.h"
#include "tessera.h"
#include "testutil.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    json_decref(manifest);
    return tu_report("test_image");
}
