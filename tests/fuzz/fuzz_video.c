/* libFuzzer target for the video reader: ts_video_probe, and on what probes ts_video_decode of
 * the first, middle and last frames at a small size derived from the stream's. The input is the
 * file itself. Invariants: a refusal is one of the documented statuses with a message and leaves
 * no frame behind; what probes is within the limits; decoded frames have the size asked for.
 * Streams declaring more than 2^22 pixels of decoding are probed only, so that a few bytes
 * declaring a huge frame do not slow every run (the probe's limits are what they exercise). */
#include "fuzz_util.h"
#include "tessera.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ts_video_info info;
    ts_status st = ts_video_probe(data, size, &info);
    if (st != TS_OK) {
        FZ_ASSERT(st == TS_ERR_FORMAT || st == TS_ERR_UNSUPPORTED || st == TS_ERR_RANGE ||
                  st == TS_ERR_NOMEM);
        FZ_ASSERT(ts_last_error()[0]);
        return 0;
    }
    FZ_ASSERT(info.width > 0 && info.height > 0 && info.width <= TS_IMAGE_MAX_SIDE &&
              info.height <= TS_IMAGE_MAX_SIDE);
    FZ_ASSERT((int64_t)info.width * info.height <= TS_IMAGE_MAX_PIXELS);
    FZ_ASSERT(info.n_frames > 0 && info.n_frames <= TS_VIDEO_MAX_FRAMES);
    FZ_ASSERT(info.n_frames * info.width * info.height <= TS_VIDEO_MAX_WORK);
    FZ_ASSERT(info.fps >= 0);
    if (info.n_frames * info.width * info.height > (int64_t)1 << 22) return 0;

    int64_t idx[3];
    int k = 0;
    idx[k++] = 0;
    if (info.n_frames > 2) idx[k++] = info.n_frames / 2;
    if (info.n_frames > 1) idx[k++] = info.n_frames - 1;
    const int w = 1 + info.width % 24, h = 1 + info.height % 24;
    ts_image *frames[3];
    st = ts_video_decode(data, size, idx, k, w, h, frames);
    if (st != TS_OK) {
        FZ_ASSERT(st == TS_ERR_FORMAT || st == TS_ERR_UNSUPPORTED || st == TS_ERR_RANGE ||
                  st == TS_ERR_NOMEM);
        FZ_ASSERT(ts_last_error()[0]);
        for (int i = 0; i < k; i++)
            FZ_ASSERT(frames[i] == NULL);
        return 0;
    }
    for (int i = 0; i < k; i++) {
        FZ_ASSERT(frames[i] && frames[i]->width == w && frames[i]->height == h);
        fz_touch(frames[i]->rgb, (size_t)w * h * 3);
        ts_image_free(frames[i]);
    }
    return 0;
}
