/* What the image readers (image_png.c, image_jpeg.c, image_webp.c) share with image_decode.c:
 * the size limits, the output allocation, the composite over white, and EXIF orientation.
 *
 * Each reader takes a whole file in memory whose magic bytes image_decode.c has already
 * recognised, and produces an 8-bit RGB ts_image exactly as PIL plus Hugging Face's
 * convert_to_rgb would (src/image/README.md). */
#ifndef TS_IMAGE_INT_H
#define TS_IMAGE_INT_H

#include "tessera.h"

#include <stddef.h>
#include <stdint.h>

/* TS_ERR_RANGE naming the format and the size when width x height is over TS_IMAGE_MAX_SIDE /
 * TS_IMAGE_MAX_PIXELS; TS_ERR_FORMAT for a side of 0. Called with the size the file declares,
 * before any pixel memory is allocated. */
ts_status img_check_size(const char *format, uint64_t width, uint64_t height);

/* A new width x height image (size already checked) with uninitialised pixels; the caller frees
 * it with ts_image_free. TS_ERR_NOMEM. */
ts_status img_alloc(int width, int height, ts_image **out);

/* One 8-bit sample v with alpha a composited over opaque white, rounded as PIL's
 * Image.alpha_composite(white, im) rounds (AlphaComposite.c, 7 extra bits of precision). With the
 * background opaque, PIL's coefficients reduce exactly to coef1 = a * 128 (it computes
 * a * 255 * 255 * 128 / (255 * 255)) and coef2 = (255 - a) * 128, and its division by 255 is
 * (t + (t >> 8)) >> 8 after adding half. a == 0 gives white (PIL copies the background);
 * a == 255 gives v. */
static inline uint8_t img_over_white(unsigned v, unsigned a) {
    if (a == 0) return 255;
    uint32_t t = (v * a + 255u * (255u - a)) * 128u + (0x80u << 7);
    return (uint8_t)((((t >> 8) + t) >> 8) >> 7);
}

/* Orientation (image_orient.c), as transformers' load_image applies it with PIL's
 * ImageOps.exif_transpose, which takes Image.getexif()'s Orientation: the EXIF block's tag
 * 0x0112 when the block stores one, else the digit of an XMP "tiff:Orientation" (which file
 * chunks hold the EXIF block and the XMP packet is each reader's business).
 *
 * img_exif_orientation reads tag 0x0112 of IFD0 from an EXIF block as PIL's Exif.load reads
 * the bytes a file's info["exif"] holds (a TIFF header, optionally after one or two
 * "Exif\0\0"), len bytes. It never fails; it returns IMG_EXIF_ABSENT when the block stores no
 * Orientation (empty, an IFD cut before it, ...: PIL then looks at the XMP), 1..8 when it stores
 * one (1 also for any value that does not transpose: the XMP is then ignored), and
 * IMG_EXIF_UNREADABLE when PIL's Exif.load raises (a header that is not TIFF; what that means
 * depends on the container). img_xmp_orientation returns the digit of the first match of PIL's
 * regex tiff:Orientation(="|>)([0-9]) in an XMP packet, or -1. img_orientation puts the two
 * together as getexif does: exif (img_exif_orientation's result, IMG_EXIF_UNREADABLE already
 * resolved by the caller) if stored, else the XMP digit, else 1. img_apply_orientation
 * transposes img in place as exif_transpose does for orientations 2..8 (5..8 swap width and
 * height); anything else leaves it alone. TS_ERR_NOMEM. */
enum { IMG_EXIF_UNREADABLE = -1, IMG_EXIF_ABSENT = 0 };
int img_exif_orientation(const uint8_t *exif, size_t len);
int img_xmp_orientation(const uint8_t *xmp, size_t len);
int img_orientation(int exif, const uint8_t *xmp, size_t xmp_len);
ts_status img_apply_orientation(ts_image *img, int orientation);

/* The orientation exif_transpose applies to a PNG file (data, len bytes: the whole file), from
 * its eXIf / tEXt / zTXt / iTXt chunks as PIL's PngImagePlugin reads them (image_png_meta.c).
 * Never fails: unreadable metadata is no orientation (1). */
int img_png_orientation(const uint8_t *data, size_t len);

/* The readers: data is the whole file (len bytes, len >= the format's magic). On success *out
 * is a new image; on failure *out is untouched and the message names the format and the fault. */
ts_status img_decode_png(const uint8_t *data, size_t len, ts_image **out);
ts_status img_decode_jpeg(const uint8_t *data, size_t len, ts_image **out);
ts_status img_decode_webp(const uint8_t *data, size_t len, ts_image **out);

#endif
