/* Video (src/image/video_*.c): every fixture of tests/fixtures/video/ probes to what PyAV reports
 * (size, packets counted, average rate) and decodes to exactly the RGB bytes PyAV's
 * container.decode(video=0) + to_ndarray("rgb24") give (one fixture, an odd-width 4:2:0 frame on
 * swscale's general path, within the tolerance its manifest entry states: at most 1, on under 1%
 * of the bytes); resizing is ts_image_resize of the full frame; bad indices and sizes are
 * refused; and hostile input never crashes: every truncation of two files, random damage, other
 * formats, headers declaring huge sizes or too many frames, codecs not decoded, and HLS / ffconcat
 * lists naming a file that would decode if it were opened. Every buffer handed to the library is
 * an exact-size heap copy, so an ASan build catches a read past the end. */
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

static uint8_t *read_fixture(const char *name, size_t *n) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", fixdir, name);
    return fx_read_file(path, n);
}

static uint8_t *copy_of(const uint8_t *data, size_t n) {
    uint8_t *c = malloc(n ? n : 1);
    if (n) memcpy(c, data, n);
    return c;
}

static ts_status probe_copy(const uint8_t *data, size_t n, ts_video_info *info) {
    uint8_t *c = copy_of(data, n);
    ts_status st = ts_video_probe(c, n, info);
    free(c);
    return st;
}

static ts_status decode_copy(const uint8_t *data, size_t n, const int64_t *idx, int k, int w, int h,
                             ts_image **frames) {
    uint8_t *c = copy_of(data, n);
    ts_status st = ts_video_decode(c, n, idx, k, w, h, frames);
    free(c);
    return st;
}

static void free_frames(ts_image **frames, int n) {
    for (int i = 0; i < n; i++) {
        ts_image_free(frames[i]);
        frames[i] = NULL;
    }
}

static bool all_null(ts_image *const *frames, int n) {
    for (int i = 0; i < n; i++)
        if (frames[i]) return false;
    return true;
}

/* ---- against PyAV ---------------------------------------------------------------------------- */

enum { MAX_KEEP = 8 };

static void test_fixture(json_t *e) {
    const char *file = json_string_value(json_object_get(e, "file"));
    const int w = (int)json_integer_value(json_object_get(e, "width"));
    const int h = (int)json_integer_value(json_object_get(e, "height"));
    const int64_t frames = json_integer_value(json_object_get(e, "frames"));
    const double fps = json_number_value(json_object_get(e, "fps"));
    const int tolerance = (int)json_integer_value(json_object_get(e, "tolerance"));
    json_t *rgb = json_object_get(e, "rgb");
    size_t n;
    uint8_t *data = read_fixture(file, &n);
    CHECKF(data, "%s: fixture missing", file);
    if (!data) return;

    ts_video_info info = {0};
    ts_status st = probe_copy(data, n, &info);
    CHECKF(st == TS_OK, "%s: probe: %s", file, ts_last_error());
    CHECKF(info.width == w && info.height == h, "%s: %dx%d, PyAV %dx%d", file, info.width,
           info.height, w, h);
    CHECKF(info.n_frames == frames, "%s: %lld frames, PyAV %lld", file, (long long)info.n_frames,
           (long long)frames);
    CHECKF(info.fps == fps, "%s: %.17g fps, PyAV %.17g", file, info.fps, fps);

    /* all the sampled frames in one call, then each alone: the same bytes */
    int64_t idx[MAX_KEEP];
    int k = (int)json_array_size(rgb);
    CHECK(k > 0 && k <= MAX_KEEP);
    if (k < 1 || k > MAX_KEEP) k = 0;
    for (int i = 0; i < k; i++)
        idx[i] = json_integer_value(json_object_get(json_array_get(rgb, (size_t)i), "index"));
    ts_image *all[MAX_KEEP] = {0}, *one = NULL;
    st = decode_copy(data, n, idx, k, w, h, all);
    CHECKF(st == TS_OK, "%s: decode: %s", file, ts_last_error());
    for (int i = 0; i < k && st == TS_OK; i++) {
        const char *raw =
            json_string_value(json_object_get(json_array_get(rgb, (size_t)i), "file"));
        size_t nr;
        uint8_t *want = read_fixture(raw, &nr);
        CHECKF(want && nr == (size_t)w * h * 3, "%s: reference missing", raw);
        if (want && nr == (size_t)w * h * 3 && all[i]->width == w && all[i]->height == h) {
            long diff = 0;
            int max = 0;
            for (size_t b = 0; b < nr; b++) {
                int d = abs((int)all[i]->rgb[b] - (int)want[b]);
                diff += d != 0;
                max = d > max ? d : max;
            }
            if (tolerance == 0)
                CHECKF(diff == 0, "%s frame %lld: %ld bytes differ from PyAV's (max %d)", file,
                       (long long)idx[i], diff, max);
            else
                CHECKF(max <= tolerance && diff * 100 < (long)nr,
                       "%s frame %lld: %ld of %zu bytes differ from PyAV's, max %d (allowed: "
                       "max %d, under 1%%)",
                       file, (long long)idx[i], diff, nr, max, tolerance);
        }
        free(want);
        CHECK(ts_video_decode(data, n, &idx[i], 1, w, h, &one) == TS_OK);
        CHECKF(one && memcmp(one->rgb, all[i]->rgb, (size_t)w * h * 3) == 0,
               "%s frame %lld alone differs", file, (long long)idx[i]);
        free_frames(&one, 1);
    }
    free_frames(all, k);

    /* the last frame is there; one past it is not */
    int64_t last[2] = {frames - 1, frames};
    ts_image *two[2] = {(ts_image *)1, (ts_image *)1};
    CHECKF(decode_copy(data, n, last, 1, 8, 8, two) == TS_OK, "%s: last frame: %s", file,
           ts_last_error());
    free_frames(two, 1);
    CHECK(decode_copy(data, n, last, 2, 8, 8, two) == TS_ERR_FORMAT);
    char frag[64];
    snprintf(frag, sizeof frag, "has %lld frames; frame %lld", (long long)frames,
             (long long)frames);
    CHECKF(strstr(ts_last_error(), frag), "%s: '%s'", file, ts_last_error());
    CHECK(all_null(two, 2));
    free(data);
}

/* Resized output is ts_image_resize of the frame at its own size. */
static void test_resize(void) {
    size_t n;
    uint8_t *data = read_fixture("h264_bframes.mp4", &n);
    if (!data) return;
    const int64_t idx[] = {1, 3};
    ts_image *full[2] = {0}, *small[2] = {0};
    CHECK(decode_copy(data, n, idx, 2, 48, 32, full) == TS_OK);
    const int sizes[][2] = {{20, 14}, {64, 40}, {1, 1}, {48, 7}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0] && full[1]; s++) {
        const int w = sizes[s][0], h = sizes[s][1];
        CHECK(decode_copy(data, n, idx, 2, w, h, small) == TS_OK);
        for (int i = 0; i < 2 && small[i]; i++) {
            ts_image *want = NULL;
            CHECK(ts_image_resize(full[i], w, h, &want) == TS_OK);
            CHECKF(small[i]->width == w && small[i]->height == h && want &&
                       memcmp(small[i]->rgb, want->rgb, (size_t)w * h * 3) == 0,
                   "frame %lld at %dx%d is not ts_image_resize of the full frame",
                   (long long)idx[i], w, h);
            ts_image_free(want);
        }
        free_frames(small, 2);
    }
    free_frames(full, 2);
    free(data);
}

static void test_arguments(void) {
    size_t n;
    uint8_t *data = read_fixture("vp9.webm", &n);
    if (!data) return;
    ts_image *f[3] = {(ts_image *)1, (ts_image *)1, (ts_image *)1};
    ts_video_info info;
    const int64_t same[] = {2, 2}, down[] = {5, 1}, neg[] = {-1, 3}, ok[] = {0, 4};
    CHECK(ts_video_decode(data, n, same, 2, 8, 8, f) == TS_ERR_INVALID);
    CHECK(all_null(f, 2));
    CHECK(strstr(ts_last_error(), "ascending"));
    CHECK(ts_video_decode(data, n, down, 2, 8, 8, f) == TS_ERR_INVALID);
    CHECK(ts_video_decode(data, n, neg, 2, 8, 8, f) == TS_ERR_INVALID);
    CHECK(ts_video_decode(data, n, ok, 0, 8, 8, f) == TS_ERR_INVALID);
    CHECK(ts_video_decode(data, n, NULL, 2, 8, 8, f) == TS_ERR_INVALID);
    CHECK(ts_video_decode(data, n, ok, 2, 8, 8, NULL) == TS_ERR_INVALID);
    CHECK(ts_video_decode(data, n, ok, 2, 0, 8, f) == TS_ERR_INVALID);
    CHECK(ts_video_decode(data, n, ok, 2, 8, -1, f) == TS_ERR_INVALID);
    CHECK(ts_video_decode(data, n, ok, 2, TS_IMAGE_MAX_SIDE + 1, 8, f) == TS_ERR_RANGE);
    CHECK(ts_video_decode(data, n, ok, 2, 8192, 8192, f) == TS_ERR_RANGE);
    CHECK(ts_video_decode(NULL, 5, ok, 2, 8, 8, f) == TS_ERR_INVALID);
    CHECK(ts_video_decode(NULL, 0, ok, 2, 8, 8, f) == TS_ERR_FORMAT);
    CHECK(strstr(ts_last_error(), "empty"));
    CHECK(all_null(f, 2));
    /* far past the end: the stream is read to its end, then refused */
    const int64_t far[] = {3, 1000000};
    CHECK(ts_video_decode(data, n, far, 2, 8, 8, f) == TS_ERR_FORMAT);
    CHECK(strstr(ts_last_error(), "has 10 frames; frame 1000000"));
    CHECK(all_null(f, 2));
    CHECK(ts_video_probe(data, n, NULL) == TS_ERR_INVALID);
    CHECK(ts_video_probe(NULL, 3, &info) == TS_ERR_INVALID);
    CHECK(ts_video_probe(NULL, 0, &info) == TS_ERR_FORMAT);
    free(data);
}

/* ---- hostile input ----------------------------------------------------------------------------
 */

/* Probe, then (when it probes) decode frames 0 and 2 small: an error with a message, or frames of
 * the size asked for, never a crash. Returns the probe's status. */
static ts_status survive(const uint8_t *data, size_t n, const char *what, int *bad) {
    ts_video_info info = {0};
    ts_status st = probe_copy(data, n, &info);
    bool good = st == TS_OK
                    ? info.width > 0 && info.height > 0 && info.n_frames > 0
                    : (st == TS_ERR_FORMAT || st == TS_ERR_UNSUPPORTED || st == TS_ERR_RANGE) &&
                          ts_last_error()[0];
    if (st == TS_OK) {
        const int64_t idx[] = {0, 2};
        ts_image *f[2] = {(ts_image *)1, (ts_image *)1};
        ts_status sd = decode_copy(data, n, idx, 2, 6, 4, f);
        if (sd == TS_OK)
            good &= f[0] && f[1] && f[0]->width == 6 && f[1]->height == 4;
        else
            good &= (sd == TS_ERR_FORMAT || sd == TS_ERR_UNSUPPORTED || sd == TS_ERR_RANGE) &&
                    ts_last_error()[0] && all_null(f, 2);
        if (sd == TS_OK) free_frames(f, 2);
    }
    if (!good && (*bad)++ < 5) fprintf(stderr, "%s: status %d (%s)\n", what, st, ts_last_error());
    return st;
}

static void test_truncations(const char *name) {
    size_t n;
    uint8_t *data = read_fixture(name, &n);
    if (!data) return;
    int bad = 0, probed = 0;
    for (size_t k = 0; k < n; k++) {
        char what[128];
        snprintf(what, sizeof what, "%s cut to %zu bytes", name, k);
        probed += survive(data, k, what, &bad) == TS_OK;
    }
    CHECKF(bad == 0, "%s: %d truncations misbehaved", name, bad);
    printf("%s: %zu truncations, %d probed\n", name, n, probed);
    free(data);
}

static void test_damage(void) {
    const char *names[] = {"h264_bframes.mp4", "vp9.webm", "mjpeg_422.mkv", "vp9_10bit.webm"};
    unsigned long long seed = 20260607;
    int bad = 0;
    for (int it = 0; it < 300; it++) {
        size_t n;
        uint8_t *data = read_fixture(names[it % 4], &n);
        if (!data) continue;
        int flips = 1 + (int)(tu_rng_next(&seed) % 8);
        for (int f = 0; f < flips; f++)
            data[tu_rng_next(&seed) % n] = (uint8_t)tu_rng_next(&seed);
        char what[96];
        snprintf(what, sizeof what, "%s damage %d", names[it % 4], it);
        survive(data, n, what, &bad);
        free(data);
    }
    CHECKF(bad == 0, "%d damaged files misbehaved", bad);
}

static void expect(const void *data, size_t n, ts_status want, const char *frag, const char *what) {
    ts_video_info info;
    ts_status st = probe_copy(data, n, &info);
    CHECKF(st == want, "%s: status %d, want %d (%s)", what, st, want, ts_last_error());
    CHECKF(!frag || strstr(ts_last_error(), frag), "%s: message '%s' lacks '%s'", what,
           ts_last_error(), frag);
}

/* HLS and ffconcat lists are refused before their demuxers run, so they cannot make us open
 * anything: the file they name decodes when opened directly. */
static void test_lists(void) {
    char path[1400], text[3000];
    snprintf(path, sizeof path, "%s/h264_bframes.mp4", fixdir);
    snprintf(text, sizeof text,
             "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:10\n#EXT-X-MEDIA-SEQUENCE:0\n"
             "#EXTINF:10.0,\nfile:///etc/passwd\n#EXTINF:1.2,\nfile://%s\n#EXTINF:1.2,\n%s\n"
             "#EXT-X-ENDLIST\n",
             path, path);
    expect(text, strlen(text), TS_ERR_UNSUPPORTED, "is not read", "HLS playlist");
    snprintf(text, sizeof text, "ffconcat version 1.0\nfile '%s'\nfile '/etc/passwd'\n", path);
    expect(text, strlen(text), TS_ERR_UNSUPPORTED, "is not read", "ffconcat");
    snprintf(text, sizeof text, "file '%s'\n", path); /* probes as nothing */
    expect(text, strlen(text), TS_ERR_UNSUPPORTED, "MP4 / QuickTime", "concat without header");
    const int64_t idx[] = {0};
    ts_image *f = (ts_image *)1;
    CHECK(ts_video_decode(text, strlen(text), idx, 1, 4, 4, &f) == TS_ERR_UNSUPPORTED && !f);
}

static void test_other_formats(void) {
    expect("", 0, TS_ERR_FORMAT, "empty", "empty");
    expect("hello, world", 12, TS_ERR_UNSUPPORTED, "MP4 / QuickTime and Matroska / WebM", "text");
    size_t n;
    char img[1400];
    snprintf(img, sizeof img, "%s/../image/png_rgb.png", fixdir);
    uint8_t *png = fx_read_file(img, &n);
    CHECK(png);
    if (png) expect(png, n, TS_ERR_UNSUPPORTED, "is not read", "PNG");
    free(png);
    unsigned long long seed = 99;
    uint8_t junk[4096];
    int bad = 0;
    for (int it = 0; it < 40; it++) {
        size_t len = 1 + tu_rng_next(&seed) % sizeof junk;
        for (size_t i = 0; i < len; i++)
            junk[i] = (uint8_t)tu_rng_next(&seed);
        survive(junk, len, "random bytes", &bad);
    }
    CHECK(bad == 0);
}

/* ---- Matroska by hand -------------------------------------------------------------------------
 */

static void eb_id(tu_bytes *b, uint32_t id) {
    uint8_t v[4];
    int n = 0;
    for (int s = 24; s >= 0; s -= 8)
        if ((id >> s) || n) v[n++] = (uint8_t)(id >> s);
    tu_put(b, v, (size_t)n);
}

/* an element: its id, an 8-byte size, its data */
static void eb(tu_bytes *b, uint32_t id, const void *data, size_t n) {
    eb_id(b, id);
    uint8_t size[8] = {0x01};
    for (int i = 0; i < 7; i++)
        size[7 - i] = (uint8_t)((uint64_t)n >> (8 * i));
    tu_put(b, size, 8);
    tu_put(b, data, n);
}

static void eb_uint(tu_bytes *b, uint32_t id, uint64_t v) {
    uint8_t d[8];
    for (int i = 0; i < 8; i++)
        d[7 - i] = (uint8_t)(v >> (8 * i));
    eb(b, id, d, 8);
}

/* A Matroska file: one track of `codec` (video w x h, or audio when w is 0), then `blocks`
 * one-byte frames 1 ms apart. */
static tu_bytes mkv(const char *codec, int w, int h, int blocks) {
    tu_bytes head = {0}, info = {0}, track = {0}, entry = {0}, av = {0}, seg = {0}, out = {0};
    eb_uint(&head, 0x4286, 1);
    eb_uint(&head, 0x42F7, 1);
    eb_uint(&head, 0x42F2, 4);
    eb_uint(&head, 0x42F3, 8);
    eb(&head, 0x4282, "matroska", 8);
    eb_uint(&head, 0x4287, 4);
    eb_uint(&head, 0x4285, 2);
    eb(&out, 0x1A45DFA3, head.p, head.n);
    eb_uint(&info, 0x2AD7B1, 1000000);
    eb(&seg, 0x1549A966, info.p, info.n);
    eb_uint(&entry, 0xD7, 1);
    eb_uint(&entry, 0x73C5, 1);
    eb_uint(&entry, 0x83, w ? 1 : 2);
    eb(&entry, 0x86, codec, strlen(codec));
    if (w) {
        eb_uint(&av, 0xB0, (uint64_t)w);
        eb_uint(&av, 0xBA, (uint64_t)h);
        eb(&entry, 0xE0, av.p, av.n);
    } else {
        eb_uint(&av, 0x9F, 2);
        eb(&entry, 0xE1, av.p, av.n);
    }
    eb(&track, 0xAE, entry.p, entry.n);
    eb(&seg, 0x1654AE6B, track.p, track.n);
    for (int first = 0; first < blocks; first += 30000) {
        tu_bytes cluster = {0};
        eb_uint(&cluster, 0xE7, (uint64_t)first);
        for (int i = first; i < blocks && i < first + 30000; i++) {
            const int t = i - first;
            const uint8_t block[] = {0xA3, 0x85, 0x81, (uint8_t)(t >> 8), (uint8_t)t, 0x80, 0x00};
            tu_put(&cluster, block, sizeof block);
        }
        eb(&seg, 0x1F43B675, cluster.p, cluster.n);
        free(cluster.p);
    }
    eb(&out, 0x18538067, seg.p, seg.n);
    free(head.p), free(info.p), free(track.p), free(entry.p), free(av.p), free(seg.p);
    return out;
}

/* Limits are checked against what the file declares, before any frame memory. */
static void test_limits(void) {
    tu_bytes m = mkv("V_VP9", 20000, 16, 3);
    expect(m.p, m.n, TS_ERR_RANGE, "20000x16 is over the limit", "MKV 20000 wide");
    free(m.p);
    m = mkv("V_VP9", 10000, 10000, 3);
    expect(m.p, m.n, TS_ERR_RANGE, "10000x10000", "MKV 100M pixels");
    free(m.p);
    m = mkv("V_VP9", 64, 48, TS_VIDEO_MAX_FRAMES + 1);
    expect(m.p, m.n, TS_ERR_RANGE, "more than 100000 frames", "MKV 100001 frames");
    free(m.p);
    m = mkv("V_VP9", 64, 48, 1000); /* 1000 packets: counted, although none decodes */
    ts_video_info info = {0};
    CHECK(probe_copy(m.p, m.n, &info) == TS_OK && info.n_frames == 1000 && info.width == 64);
    const int64_t idx[] = {0};
    ts_image *f = (ts_image *)1;
    CHECK(decode_copy(m.p, m.n, idx, 1, 4, 4, &f) == TS_ERR_FORMAT && !f);
    free(m.p);
    /* 4096 x 4096 x 1025 frames is past 2^34 pixels of decoding */
    m = mkv("V_VP9", 4096, 4096, 1025);
    expect(m.p, m.n, TS_ERR_RANGE, "1025 frames of 4096x4096", "MKV work");
    free(m.p);
    m = mkv("V_MPEG2", 64, 48, 3);
    expect(m.p, m.n, TS_ERR_UNSUPPORTED, "mpeg2video video is not decoded", "MPEG-2");
    free(m.p);
    m = mkv("A_OPUS", 0, 0, 3);
    expect(m.p, m.n, TS_ERR_FORMAT, "no video stream", "audio only");
    free(m.p);

    /* an MP4 whose sample description declares 10000 x 10000: the width and height of its avc1
     * entry, 28 bytes after the type (the brand list of ftyp names avc1 too) */
    size_t n;
    uint8_t *mp4 = read_fixture("h264_bframes.mp4", &n), *avc1 = NULL;
    for (size_t i = 0; mp4 && i + 32 <= n && !avc1; i++)
        if (memcmp(mp4 + i, "avc1", 4) == 0 && mp4[i + 28] == 0 && mp4[i + 29] == 48 &&
            mp4[i + 30] == 0 && mp4[i + 31] == 32)
            avc1 = mp4 + i;
    CHECK(avc1);
    if (avc1) {
        avc1[28] = 0x27, avc1[29] = 0x10, avc1[30] = 0x27, avc1[31] = 0x10;
        expect(mp4, n, TS_ERR_RANGE, "10000x10000", "MP4 10000x10000");
    }
    free(mp4);
}

int main(void) {
    snprintf(fixdir, sizeof fixdir, "%s/video", tu_env("TS_FIXTURES", "tests/fixtures"));
    char path[1100];
    snprintf(path, sizeof path, "%s/manifest.json", fixdir);
    json_error_t jerr;
    json_t *manifest = json_load_file(path, 0, &jerr);
    CHECKF(manifest, "%s: %s", path, jerr.text);
    if (!manifest) return tu_report("test_video");
    json_t *videos = json_object_get(manifest, "videos"), *e;
    size_t i;
    CHECK(json_array_size(videos) >= 6);
    json_array_foreach(videos, i, e) test_fixture(e);
    json_decref(manifest);
    test_resize();
    test_arguments();
    test_other_formats();
    test_lists();
    test_limits();
    test_truncations("h264_bframes.mp4");
    test_truncations("vp9.webm");
    test_damage();
    return tu_report("test_video");
}
