/* JPEG with libjpeg-turbo, set up as PIL's decoder sets it up (libImaging/JpegDecode.c), so
 * that the output is PIL's byte for byte: accurate integer IDCT (JDCT_ISLOW) and fancy
 * (triangle-filter) chroma upsampling, libjpeg's defaults, which PIL leaves alone outside draft
 * mode; libjpeg converts YCbCr to RGB itself. 1, 3 and 4 components, as PIL reads: grey is
 * expanded; 4 components are taken as Adobe's inverted CMYK (PIL's "CMYK;I", whatever the
 * markers say) and turned into RGB with PIL's CMYK -> RGB formula.
 *
 * Damage: libjpeg calls error_exit, which longjmps back to jpeg_run (all state lives in the
 * caller's jpeg_ctx). Its warnings about corrupt entropy data are ignored, as PIL ignores them,
 * except the one for running out of data: PIL refuses a file that ends before its last row
 * ("image file is truncated") where libjpeg would pad it with grey. A file that ends after its
 * last row (no EOI marker) is read, as PIL reads it: jpeg_finish_decompress is not called.
 *
 * Orientation: the APP1 segments are kept (jpeg_save_markers) and read as PIL's JpegImagePlugin
 * reads those before the first scan: the "Exif\0\0" ones joined (the first whole, the others
 * without their "Exif\0\0"), and the last "http://ns.adobe.com/xap/1.0/\0" one as the XMP
 * packet; the decoded image is then transposed as transformers' load_image does with
 * exif_transpose (image_orient.c): the EXIF Orientation, else the XMP tiff:Orientation. An EXIF
 * block whose header is not TIFF is orientation 1 without the XMP: PIL reads the EXIF while it
 * opens the file (for the resolution) and, when that raises, keeps an empty Exif that getexif
 * then returns as it is, XMP unsearched (where the JFIF header gives a resolution PIL skips that
 * read, and exif_transpose raises instead). Never an error. */
#include "base/status.h"
#include "image/image_int.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* jpeglib.h wants FILE and size_t declared before it */
#include <jerror.h>
#include <jpeglib.h>

/* A progressive file may hold any number of scans, each a pass over the whole image: a few
 * kilobytes could keep the decoder busy for minutes. Real encoders write about ten. */
#define JPEG_MAX_SCANS 256

typedef struct {
    struct jpeg_error_mgr err; /* first: libjpeg hands error callbacks this pointer */
    struct jpeg_decompress_struct ci;
    struct jpeg_progress_mgr progress;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
    uint8_t *row;    /* one decoded row, output_components bytes a pixel */
    int orientation; /* what exif_transpose applies (jpeg_orientation) */
    ts_image *img; /* the output, freed by the caller on failure */
} jpeg_ctx;

static void jpeg_fail(j_common_ptr ci) {
    jpeg_ctx *c = (jpeg_ctx *)ci->err;
    ci->err->format_message(ci, c->msg);
    longjmp(c->jump, 1);
}

static void jpeg_note(j_common_ptr ci, int level) {
    jpeg_ctx *c = (jpeg_ctx *)ci->err;
    if (level >= 0) return; /* trace messages */
    if (ci->err->msg_code == JWRN_JPEG_EOF) {
        snprintf(c->msg, sizeof c->msg, "truncated file (data ends before the last row)");
        longjmp(c->jump, 1);
    }
    ci->err->num_warnings++;
}

static void jpeg_watch(j_common_ptr ci) {
    jpeg_ctx *c = (jpeg_ctx *)ci->err;
    if (ci->is_decompressor && ((j_decompress_ptr)ci)->input_scan_number > JPEG_MAX_SCANS) {
        snprintf(c->msg, sizeof c->msg, "more than %d scans", JPEG_MAX_SCANS);
        longjmp(c->jump, 1);
    }
}

/* PIL's MULDIV255: a * b / 255, rounded, without a division. */
static inline unsigned muldiv255(unsigned a, unsigned b) {
    unsigned t = a * b + 128;
    return ((t >> 8) + t) >> 8;
}

static void jpeg_row_rgb(const uint8_t *in, int n, int w, uint8_t *out) {
    if (n == 1) {
        for (int x = 0; x < w; x++)
            out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = in[x];
    } else if (n == 3) {
        for (int x = 0; x < 3 * w; x++)
            out[x] = in[x];
    } else {
        for (int x = 0; x < w; x++) {
            const uint8_t *s = in + 4 * x;
            /* PIL inverts Adobe CMYK on reading (c' = 255 - c), then takes
             * R = (255 - k') - MULDIV255(c', 255 - k'), never outside 0..255; 255 - k' is the
             * file's own k */
            unsigned nk = s[3];
            for (int k = 0; k < 3; k++)
                out[3 * x + k] = (uint8_t)(nk - muldiv255(255u - s[k], nk));
        }
    }
}

static bool is_exif(jpeg_saved_marker_ptr m) {
    return m->marker == JPEG_APP0 + 1 && m->data_length >= 6 && !memcmp(m->data, "Exif\0\0", 6);
}

/* The Orientation of the joined EXIF segments m (count of them, total bytes when joined). */
static int jpeg_exif(jpeg_saved_marker_ptr m, size_t count, size_t total) {
    while (!is_exif(m))
        m = m->next;
    if (count == 1) return img_exif_orientation(m->data, m->data_length);
    uint8_t *all = malloc(total);
    if (!all) return img_exif_orientation(m->data, m->data_length);
    size_t at = 0;
    for (; m; m = m->next) {
        if (!is_exif(m)) continue;
        size_t skip = at ? 6 : 0;
        memcpy(all + at, m->data + skip, m->data_length - skip);
        at += m->data_length - skip;
    }
    int o = img_exif_orientation(all, total);
    free(all);
    return o;
}

/* The orientation exif_transpose finds in the saved APP1 segments (see the top of the file).
 * Called right after jpeg_read_header, so the list holds the markers before the first scan, as
 * PIL's; it calls nothing of libjpeg, so no longjmp can skip the free. */
static int jpeg_orientation(j_decompress_ptr ci) {
    static const char xmp_ns[] = "http://ns.adobe.com/xap/1.0/"; /* and its NUL */
    const uint8_t *xmp = NULL;
    size_t xmp_len = 0, count = 0, total = 0;
    for (jpeg_saved_marker_ptr m = ci->marker_list; m; m = m->next) {
        if (is_exif(m)) {
            total += count++ ? m->data_length - 6 : m->data_length;
        } else if (m->marker == JPEG_APP0 + 1 && m->data_length >= sizeof xmp_ns &&
                   !memcmp(m->data, xmp_ns, sizeof xmp_ns)) {
            xmp = m->data + sizeof xmp_ns; /* the last one wins, as in PIL's info["xmp"] */
            xmp_len = m->data_length - sizeof xmp_ns;
        }
    }
    int exif = count ? jpeg_exif(ci->marker_list, count, total) : IMG_EXIF_ABSENT;
    if (exif == IMG_EXIF_UNREADABLE) return 1;
    return img_orientation(exif, xmp, xmp_len);
}

/* The decoding proper; a libjpeg error leaves it by longjmp (to jpeg_run), abandoning its frame. */
static ts_status jpeg_body(jpeg_ctx *c, const uint8_t *data, size_t len) {
    j_decompress_ptr ci = &c->ci;
    jpeg_mem_src(ci, data, (unsigned long)len);
    jpeg_save_markers(ci, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(ci, TRUE);
    c->orientation = jpeg_orientation(ci);
    if (ci->data_precision != 8)
        return ts_error(TS_ERR_UNSUPPORTED, "JPEG: %d-bit samples (8-bit JPEGs are read)",
                        ci->data_precision);
    int n = ci->num_components;
    if (n == 1)
        ci->out_color_space = JCS_GRAYSCALE;
    else if (n == 3)
        ci->out_color_space = JCS_RGB;
    else if (n == 4)
        ci->out_color_space = JCS_CMYK; /* libjpeg turns YCCK into CMYK */
    else
        return ts_error(TS_ERR_UNSUPPORTED, "JPEG: %d components (1, 3 or 4 are read)", n);
    TS_TRY(img_check_size("JPEG", ci->image_width, ci->image_height));
    ci->dct_method = JDCT_ISLOW;
    ci->do_fancy_upsampling = TRUE;
    jpeg_start_decompress(ci);
    if ((int)ci->output_components != n || ci->output_width != ci->image_width ||
        ci->output_height != ci->image_height)
        return ts_error(TS_ERR_FORMAT, "JPEG: decoder output differs from the header");
    int w = (int)ci->output_width;
    c->row = malloc((size_t)w * (size_t)n);
    if (!c->row) return ts_error(TS_ERR_NOMEM, "JPEG: no memory for a row of %d pixels", w);
    TS_TRY(img_alloc(w, (int)ci->output_height, &c->img));
    while (ci->output_scanline < ci->output_height) {
        size_t y = ci->output_scanline;
        JSAMPROW r = c->row;
        if (jpeg_read_scanlines(ci, &r, 1) != 1)
            return ts_error(TS_ERR_FORMAT, "JPEG: no data for row %zu", y);
        jpeg_row_rgb(c->row, n, w, c->img->rgb + y * (size_t)w * 3);
    }
    return img_apply_orientation(c->img, c->orientation);
}

/* Kept apart from jpeg_body so that no local variable lives across the setjmp. */
static ts_status jpeg_run(jpeg_ctx *c, const uint8_t *data, size_t len) {
    if (setjmp(c->jump)) {
        /* libjpeg's own limit (65500 a side) is above ours: report it as ours */
        if (c->err.msg_code == JERR_IMAGE_TOO_BIG &&
            img_check_size("JPEG", c->ci.image_width, c->ci.image_height) == TS_ERR_RANGE)
            return TS_ERR_RANGE;
        /* well-formed, but not a kind libjpeg-turbo 2 decodes (12-bit, lossless, ...) */
        if (c->err.msg_code == JERR_BAD_PRECISION || c->err.msg_code == JERR_SOF_UNSUPPORTED)
            return ts_error(TS_ERR_UNSUPPORTED, "JPEG: %s", c->msg);
        return ts_error(TS_ERR_FORMAT, "JPEG: %s", c->msg);
    }
    jpeg_create_decompress(&c->ci);
    c->ci.progress = &c->progress;
    return jpeg_body(c, data, len);
}

ts_status img_decode_jpeg(const uint8_t *data, size_t len, ts_image **out) {
    jpeg_ctx *c = calloc(1, sizeof *c);
    if (!c) return ts_error(TS_ERR_NOMEM, "JPEG: cannot create the decoder");
    c->ci.err = jpeg_std_error(&c->err);
    c->err.error_exit = jpeg_fail;
    c->err.emit_message = jpeg_note;
    c->progress.progress_monitor = jpeg_watch;
    ts_status st = jpeg_run(c, data, len);
    jpeg_destroy_decompress(&c->ci);
    free(c->row);
    if (st == TS_OK)
        *out = c->img;
    else
        ts_image_free(c->img);
    free(c);
    return st;
}
