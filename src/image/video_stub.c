/* Stands in for video_decode.c, video_rgb.c and video_chroma.c in a build configured with
 * -DTESSERA_VIDEO=OFF (no FFmpeg libraries linked, as src/backend/cuda_stub.c stands in for the
 * CUDA backend): every video is refused, saying why. */
#include "base/status.h"
#include "tessera.h"

static ts_status no_video(void) {
    return ts_error(TS_ERR_UNSUPPORTED,
                    "video: this build reads no video (configured with -DTESSERA_VIDEO=OFF)");
}

ts_status ts_video_probe(const void *data, size_t len, ts_video_info *out) {
    (void)data, (void)len, (void)out;
    return no_video();
}

ts_status ts_video_decode(const void *data, size_t len, const int64_t *indices, int n, int width,
                          int height, ts_image **frames) {
    (void)data, (void)len, (void)indices, (void)width, (void)height;
    for (int i = 0; frames && i < n; i++)
        frames[i] = NULL;
    return no_video();
}
