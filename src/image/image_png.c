/* PNG with libpng (classic API): samples are taken raw, one byte per sample below 8 bits, and
 * turned into RGB here, following PIL's own rules rather than libpng's transformations, so that
 * the result is what PIL + Hugging Face's convert_to_rgb give:
 *   - grey below 8 bits is scaled (1 bit: 0/255, 2 bits: x85, 4 bits: x17);
 *   - 16-bit colour samples keep their high byte (PIL's "RGB;16B" unpackers), but 16-bit grey
 *     (PIL mode I;16) is clipped at 255, which is what PIL's I;16 -> RGB conversion does;
 *   - a tRNS colour makes matching pixels transparent, compared as PIL compares it: the chunk's
 *     raw value against the 8-bit sample (so a 2-bit image's tRNS 2 never matches its 170s);
 *   - palette indices past the palette are black (PIL pads its palette with zeros);
 *   - alpha, from a channel or tRNS, is composited over white (img_over_white).
 * No gamma, ICC or sBIT handling: PIL applies none when it decodes. The orientation that
 * transformers' load_image applies (exif_transpose: eXIf, text chunks holding EXIF or XMP) is
 * read from the file's chunks by image_png_meta.c, and applied to the decoded image.
 * libpng reports errors through a callback that must not return: it longjmps back to png_run,
 * whose state all lives in the caller's png_ctx, so nothing local is used after the jump. */
#include "base/status.h"
#include "image/image_int.h"

#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *data;
    size_t len, pos;
    png_structp png;
    png_infop info;
    uint8_t *raw;  /* [rows][rowbytes] as libpng gives them: 1 row, or all for interlacing */
    ts_image *img; /* the output, freed by the caller on failure */
    char msg[128]; /* libpng's last error */
} png_ctx;

/* What the per-row conversion needs to know about the file. */
typedef struct {
    int color_type, depth, width;
    bool has_trns;
    unsigned trns_grey, trns_r, trns_g, trns_b; /* tRNS colour, raw (up to 16 bits) */
    uint8_t pal[256][4];                        /* palette RGBA: black and opaque past its end */
} png_layout;

static void png_fail(png_structp png, png_const_charp msg) {
    png_ctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg ? msg : "error");
    longjmp(png_jmpbuf(png), 1);
}

static void png_warn(png_structp png, png_const_charp msg) {
    (void)png; /* warnings (bad ancillary chunks, out-of-range tRNS) are not faults: PIL reads */
    (void)msg; /* such files too */
}

static void png_read_mem(png_structp png, png_bytep out, size_t n) {
    png_ctx *c = png_get_io_ptr(png);
    if (n > c->len - c->pos) png_error(png, "truncated file");
    memcpy(out, c->data + c->pos, n);
    c->pos += n;
}

static inline unsigned be16(const uint8_t *p) { return (unsigned)p[0] << 8 | p[1]; }

/* One row of raw samples to RGB (see the rules at the top of the file). */
static void png_row_rgb(const png_layout *l, const uint8_t *in, uint8_t *out) {
    const int w = l->width;
    const bool wide = l->depth == 16;
    switch (l->color_type) {
    case PNG_COLOR_TYPE_GRAY: {
        const unsigned scale = l->depth == 1 ? 255 : l->depth == 2 ? 85 : l->depth == 4 ? 17 : 1;
        /* PIL reads 1-bit images as mode "1" and turns a tRNS grey into 255 or 0 */
        const unsigned key = l->depth == 1 ? (l->trns_grey ? 255 : 0) : l->trns_grey;
        for (int x = 0; x < w; x++) {
            unsigned v = wide ? be16(in + 2 * x) : in[x] * scale;
            if (v > 255) v = 255;
            uint8_t o = l->has_trns && v == key ? 255 : (uint8_t)v;
            out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = o;
        }
        break;
    }
    case PNG_COLOR_TYPE_RGB:
        for (int x = 0; x < w; x++) {
            const uint8_t *s = wide ? in + 6 * x : in + 3 * x;
            unsigned r = s[0], g = s[wide ? 2 : 1], b = s[wide ? 4 : 2];
            bool clear = l->has_trns && r == l->trns_r && g == l->trns_g && b == l->trns_b;
            out[3 * x] = clear ? 255 : (uint8_t)r;
            out[3 * x + 1] = clear ? 255 : (uint8_t)g;
            out[3 * x + 2] = clear ? 255 : (uint8_t)b;
        }
        break;
    case PNG_COLOR_TYPE_PALETTE:
        for (int x = 0; x < w; x++) {
            const uint8_t *p = l->pal[in[x]];
            for (int k = 0; k < 3; k++)
                out[3 * x + k] = img_over_white(p[k], p[3]);
        }
        break;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
        for (int x = 0; x < w; x++) {
            const uint8_t *s = wide ? in + 4 * x : in + 2 * x;
            uint8_t o = img_over_white(s[0], s[wide ? 2 : 1]);
            out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = o;
        }
        break;
    default: /* PNG_COLOR_TYPE_RGB_ALPHA */
        for (int x = 0; x < w; x++) {
            const uint8_t *s = wide ? in + 8 * x : in + 4 * x;
            unsigned a = s[wide ? 6 : 3];
            for (int k = 0; k < 3; k++)
                out[3 * x + k] = img_over_white(s[wide ? 2 * k : k], a);
        }
        break;
    }
}

/* The tRNS and PLTE chunks as png_row_rgb wants them; read before any transformation is set,
 * so the values are the file's own. */
static void png_get_layout(png_ctx *c, png_layout *l) {
    png_bytep alphas = NULL;
    int n_alphas = 0;
    png_color_16p colour = NULL;
    if (png_get_tRNS(c->png, c->info, &alphas, &n_alphas, &colour) & PNG_INFO_tRNS) {
        if (l->color_type == PNG_COLOR_TYPE_PALETTE) {
            l->has_trns = alphas && n_alphas > 0;
        } else if (colour) {
            l->has_trns = true;
            l->trns_grey = colour->gray;
            l->trns_r = colour->red;
            l->trns_g = colour->green;
            l->trns_b = colour->blue;
        }
    }
    if (l->color_type != PNG_COLOR_TYPE_PALETTE) return;
    png_colorp pal = NULL;
    int n_pal = 0;
    png_get_PLTE(c->png, c->info, &pal, &n_pal);
    for (int i = 0; i < 256; i++) {
        bool in = pal && i < n_pal;
        l->pal[i][0] = in ? pal[i].red : 0;
        l->pal[i][1] = in ? pal[i].green : 0;
        l->pal[i][2] = in ? pal[i].blue : 0;
        l->pal[i][3] = l->has_trns && i < n_alphas ? alphas[i] : 255;
    }
}

/* The decoding proper; a libpng error leaves it by longjmp (to png_run), abandoning its frame. */
static ts_status png_body(png_ctx *c) {
    png_set_read_fn(c->png, c, png_read_mem);
    png_read_info(c->png, c->info);

    png_uint_32 w, h;
    int depth, color_type, interlace;
    png_get_IHDR(c->png, c->info, &w, &h, &depth, &color_type, &interlace, NULL, NULL);
    TS_TRY(img_check_size("PNG", w, h));
    png_layout l = {.color_type = color_type, .depth = depth, .width = (int)w};
    png_get_layout(c, &l);

    if (depth < 8) png_set_packing(c->png); /* one byte per sample, value unscaled */
    int passes = png_set_interlace_handling(c->png);
    png_read_update_info(c->png, c->info);
    size_t channels = png_get_channels(c->png, c->info);
    size_t rowbytes = png_get_rowbytes(c->png, c->info);
    if (rowbytes != (size_t)w * channels * (depth == 16 ? 2 : 1))
        return ts_error(TS_ERR_FORMAT, "PNG: unexpected row layout (%zu bytes for %u pixels)",
                        rowbytes, (unsigned)w);
    /* interlaced images come in 7 passes over the whole image, so they need every row */
    size_t rows = passes > 1 ? h : 1;
    c->raw = calloc(rows, rowbytes);
    if (!c->raw) return ts_error(TS_ERR_NOMEM, "PNG: no memory for %ux%u pixels", w, h);
    TS_TRY(img_alloc((int)w, (int)h, &c->img));
    if (passes > 1) {
        for (int p = 0; p < passes; p++)
            for (png_uint_32 y = 0; y < h; y++)
                png_read_row(c->png, c->raw + y * rowbytes, NULL);
        for (png_uint_32 y = 0; y < h; y++)
            png_row_rgb(&l, c->raw + y * rowbytes, c->img->rgb + (size_t)y * w * 3);
    } else {
        for (png_uint_32 y = 0; y < h; y++) {
            png_read_row(c->png, c->raw, NULL);
            png_row_rgb(&l, c->raw, c->img->rgb + (size_t)y * w * 3);
        }
    }
    /* The rest of the file (after the last row) is not read: PIL does not need it either. */
    return TS_OK;
}

/* Kept apart from png_body so that no local variable lives across the setjmp. */
static ts_status png_run(png_ctx *c) {
    if (setjmp(png_jmpbuf(c->png))) return ts_error(TS_ERR_FORMAT, "PNG: %s", c->msg);
    return png_body(c);
}

ts_status img_decode_png(const uint8_t *data, size_t len, ts_image **out) {
    png_ctx c = {.data = data, .len = len};
    c.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &c, png_fail, png_warn);
    if (c.png) c.info = png_create_info_struct(c.png);
    if (!c.png || !c.info) {
        png_destroy_read_struct(c.png ? &c.png : NULL, NULL, NULL);
        return ts_error(TS_ERR_NOMEM, "PNG: cannot create the decoder");
    }
    /* libpng would read these ancillary chunks whole into memory of the size they declare (an
     * iTXt of 3 bytes may say 2 GB); the pixels need none of them and image_png_meta.c reads
     * the text and EXIF ones from the file's bytes, so libpng skips them unread */
    static const png_byte skipped[] = "tEXt\0zTXt\0iTXt\0eXIf\0iCCP\0sPLT";
    png_set_keep_unknown_chunks(c.png, PNG_HANDLE_CHUNK_NEVER, skipped, (int)(sizeof skipped / 5));
    ts_status st = png_run(&c);
    png_destroy_read_struct(&c.png, &c.info, NULL);
    free(c.raw);
    if (st == TS_OK) st = img_apply_orientation(c.img, img_png_orientation(data, len));
    if (st != TS_OK) {
        ts_image_free(c.img);
        return st;
    }
    *out = c.img;
    return TS_OK;
}
