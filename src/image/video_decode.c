/* ts_video_probe / ts_video_decode: a video file held in memory, read with the system's
 * libavformat and libavcodec as Hugging Face's load_video reads it with PyAV (src/image/README.md,
 * "Video"): the first video stream, its frames counted in the order the decoder gives them, each
 * turned into RGB by video_rgb.c as PyAV's to_ndarray("rgb24") turns it.
 *
 * Hostile files: libavformat reads only the buffer (a custom AVIOContext over it), and nothing
 * else: the demuxers are held to MP4 / QuickTime and Matroska / WebM (an HLS playlist or an
 * ffconcat list is refused after probing, before its demuxer runs), no protocol may be opened
 * and io_open refuses whatever a demuxer asks for (an MP4's external data references, say). The
 * decoders are held to a list, and to TS_IMAGE_MAX_PIXELS a frame (their max_pixels). */
#include "base/status.h"
#include "image/video_int.h"

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/avstring.h>
#include <libavutil/log.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* av_match_list lists: the demuxers (their names as libavformat spells them) and the software
 * decoders of Debian 12's libavcodec 59 (AV1's first decoder there is libdav1d; the native one
 * needs a hardware accelerator). */
#define VID_FORMATS "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm"
#define VID_CODECS  "h264,hevc,vp8,vp9,libdav1d,mpeg4,mjpeg"
#define VID_READ    "MP4 / QuickTime and Matroska / WebM are"
#define VID_IO_BUF  32768
/* Packets of every stream read while counting, so that a file of endless other streams stops */
#define VID_MAX_PACKETS (16 * (int64_t)TS_VIDEO_MAX_FRAMES)

typedef struct {
    const uint8_t *data;
    size_t len, pos;
} vid_mem;

typedef struct {
    vid_mem mem;
    AVFormatContext *fmt;
    AVStream *st; /* the first video stream */
    const AVCodec *codec;
    AVPacket *pkt;
} vid_file;

static pthread_once_t vid_quiet_once = PTHREAD_ONCE_INIT;

/* libav logs to stderr by default: a damaged upload would fill the server's log. */
static void vid_quiet(void) { av_log_set_level(AV_LOG_QUIET); }

static int vid_read(void *opaque, uint8_t *buf, int n) {
    vid_mem *m = opaque;
    size_t left = m->len - m->pos;
    if (left == 0) return AVERROR_EOF;
    if ((size_t)n > left) n = (int)left;
    memcpy(buf, m->data + m->pos, (size_t)n);
    m->pos += (size_t)n;
    return n;
}

static int64_t vid_seek(void *opaque, int64_t off, int whence) {
    vid_mem *m = opaque;
    if (whence & AVSEEK_SIZE) return (int64_t)m->len;
    whence &= ~AVSEEK_FORCE;
    int64_t base = whence == SEEK_SET   ? 0
                   : whence == SEEK_CUR ? (int64_t)m->pos
                   : whence == SEEK_END ? (int64_t)m->len
                                        : -1;
    if (base < 0 || off < -base || off > (int64_t)m->len - base) return AVERROR(EINVAL);
    m->pos = (size_t)(base + off);
    return (int64_t)m->pos;
}

/* Every other file or URL a demuxer would open */
static int vid_io_open(AVFormatContext *s, AVIOContext **pb, const char *url, int flags,
                       AVDictionary **options) {
    (void)s, (void)pb, (void)url, (void)flags, (void)options;
    return AVERROR(EPERM);
}

ts_status vid_averror(ts_status code, const char *what, int err) {
    char buf[AV_ERROR_MAX_STRING_SIZE];
    av_strerror(err, buf, sizeof buf);
    return ts_error(code, "video: %s (%s)", what, buf);
}

static void vid_close(vid_file *v) {
    if (v->fmt) {
        AVIOContext *io = v->fmt->pb;
        avformat_close_input(&v->fmt); /* custom I/O: leaves io alone */
        if (io) av_freep(&io->buffer);
        avio_context_free(&io);
    }
    av_packet_free(&v->pkt);
}

static ts_status vid_check_size(int w, int h) {
    if (w <= 0 || h <= 0)
        return ts_error(TS_ERR_FORMAT, "video: frame size %dx%d has no pixels", w, h);
    if (w > TS_IMAGE_MAX_SIDE || h > TS_IMAGE_MAX_SIDE ||
        (int64_t)w * h > (int64_t)TS_IMAGE_MAX_PIXELS)
        return ts_error(TS_ERR_RANGE,
                        "video: frame size %dx%d is over the limit (%d pixels a side, %d in all)",
                        w, h, TS_IMAGE_MAX_SIDE, TS_IMAGE_MAX_PIXELS);
    return TS_OK;
}

/* The demuxer's options: the whitelists, and for the decoders that avformat_find_stream_info
 * opens (one dictionary a stream) one thread and the pixel limit. */
static AVDictionary *vid_codec_opts(void) {
    AVDictionary *d = NULL;
    av_dict_set(&d, "threads", "1", 0);
    av_dict_set(&d, "codec_whitelist", VID_CODECS, 0);
    av_dict_set_int(&d, "max_pixels", TS_IMAGE_MAX_PIXELS, 0);
    return d;
}

static ts_status vid_stream_info(vid_file *v) {
    unsigned n = v->fmt->nb_streams;
    AVDictionary **opts = av_calloc(n ? n : 1, sizeof *opts);
    if (!opts) return ts_error(TS_ERR_NOMEM, "video: no memory");
    for (unsigned i = 0; i < n; i++)
        opts[i] = vid_codec_opts();
    int r = avformat_find_stream_info(v->fmt, opts);
    for (unsigned i = 0; i < n; i++)
        av_dict_free(&opts[i]);
    av_free(opts);
    return r < 0 ? vid_averror(TS_ERR_FORMAT, "damaged file: its streams cannot be read", r)
                 : TS_OK;
}

/* The first video stream's size (its header's and then what avformat_find_stream_info found),
 * and its decoder, checked. */
static ts_status vid_find_stream(vid_file *v, int header) {
    v->st = NULL;
    for (unsigned i = 0; i < v->fmt->nb_streams && !v->st; i++)
        if (v->fmt->streams[i]->codecpar->codec_type == AVMEDIA_TYPE_VIDEO)
            v->st = v->fmt->streams[i];
    if (!v->st) return ts_error(TS_ERR_FORMAT, "video: the file holds no video stream");
    const AVCodecParameters *par = v->st->codecpar;
    /* a size the header does not give is found by decoding (find_stream_info) */
    if (!header || par->width || par->height) TS_TRY(vid_check_size(par->width, par->height));
    v->codec = avcodec_find_decoder(par->codec_id);
    if (!v->codec || av_match_list(v->codec->name, VID_CODECS, ',') <= 0)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "video: %s video is not decoded (H.264, H.265, VP8, VP9, AV1, MPEG-4 "
                        "Part 2 and Motion JPEG are)",
                        avcodec_get_name(par->codec_id));
    return TS_OK;
}

/* Opens the data as a container, reads its header and its streams' parameters (as av.open
 * does) and finds the first video stream. On failure v is closed. */
static ts_status vid_open(vid_file *v, const void *data, size_t len) {
    pthread_once(&vid_quiet_once, vid_quiet);
    memset(v, 0, sizeof *v);
    if (len == 0) return ts_error(TS_ERR_FORMAT, "video: empty data");
    v->mem = (vid_mem){data, len, 0};
    uint8_t *buf = av_malloc(VID_IO_BUF);
    AVIOContext *io =
        buf ? avio_alloc_context(buf, VID_IO_BUF, 0, &v->mem, vid_read, NULL, vid_seek) : NULL;
    v->fmt = avformat_alloc_context();
    v->pkt = av_packet_alloc();
    if (!io || !v->fmt || !v->pkt) {
        if (!io)
            av_free(buf);
        else
            av_freep(&io->buffer);
        avio_context_free(&io);
        vid_close(v);
        return ts_error(TS_ERR_NOMEM, "video: no memory");
    }
    v->fmt->pb = io;
    v->fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
    v->fmt->io_open = vid_io_open;

    /* Probe first (it reads bytes, runs no demuxer), so that another container can be named */
    const AVInputFormat *ifmt = NULL;
    int r = av_probe_input_buffer2(io, &ifmt, "", NULL, 0, 0);
    ts_status st = TS_OK;
    if (r < 0 || !ifmt)
        st = ts_error(TS_ERR_UNSUPPORTED, "video: not a container that is read (" VID_READ ")");
    else if (av_match_list(ifmt->name, VID_FORMATS, ',') <= 0)
        st = ts_error(TS_ERR_UNSUPPORTED, "video: %s is not read (" VID_READ ")", ifmt->name);
    if (st != TS_OK) {
        vid_close(v);
        return st;
    }
    AVDictionary *opts = NULL;
    av_dict_set(&opts, "format_whitelist", VID_FORMATS, 0);
    av_dict_set(&opts, "protocol_whitelist", "", 0); /* empty: none */
    av_dict_set(&opts, "codec_whitelist", VID_CODECS, 0);
    r = avformat_open_input(&v->fmt, "", ifmt, &opts); /* frees fmt on failure */
    av_dict_free(&opts);
    if (r < 0) {
        v->fmt = NULL;
        av_freep(&io->buffer);
        avio_context_free(&io);
        vid_close(v);
        return vid_averror(TS_ERR_FORMAT, "damaged file: its header cannot be read", r);
    }
    /* the header's size is checked before find_stream_info decodes anything */
    if ((st = vid_find_stream(v, 1)) == TS_OK && (st = vid_stream_info(v)) == TS_OK)
        st = vid_find_stream(v, 0);
    if (st != TS_OK) vid_close(v);
    return st;
}

/* The next packet of the stream: 1, or 0 at the end of the file. */
static int vid_next(vid_file *v, int64_t *n_read, ts_status *st) {
    for (;;) {
        av_packet_unref(v->pkt);
        int r = av_read_frame(v->fmt, v->pkt);
        if (r == AVERROR_EOF) return 0;
        if (r < 0) {
            *st = vid_averror(TS_ERR_FORMAT, "damaged file: a packet cannot be read", r);
            return 0;
        }
        if (++*n_read > VID_MAX_PACKETS) {
            *st =
                ts_error(TS_ERR_RANGE, "video: more than %lld packets", (long long)VID_MAX_PACKETS);
            return 0;
        }
        if (v->pkt->stream_index == v->st->index) return 1;
    }
}

ts_status ts_video_probe(const void *data, size_t len, ts_video_info *out) {
    if (!out || (!data && len)) return ts_error(TS_ERR_INVALID, "video: no data or no output");
    vid_file v;
    TS_TRY(vid_open(&v, data, len));
    const int w = v.st->codecpar->width, h = v.st->codecpar->height;
    const int64_t pixels = (int64_t)w * h;
    /* other streams' packets are not wanted: the demuxer may skip them */
    for (unsigned i = 0; i < v.fmt->nb_streams; i++)
        if (v.fmt->streams[i] != v.st) v.fmt->streams[i]->discard = AVDISCARD_ALL;
    ts_status st = TS_OK;
    int64_t frames = 0, n_read = 0;
    while (st == TS_OK && vid_next(&v, &n_read, &st)) {
        if (++frames > TS_VIDEO_MAX_FRAMES)
            st = ts_error(TS_ERR_RANGE, "video: more than %d frames", TS_VIDEO_MAX_FRAMES);
        else if (frames * pixels > TS_VIDEO_MAX_WORK)
            st = ts_error(TS_ERR_RANGE,
                          "video: %lld frames of %dx%d are over the limit (%lld pixels in all)",
                          (long long)frames, w, h, (long long)TS_VIDEO_MAX_WORK);
    }
    if (st == TS_OK && frames == 0)
        st = ts_error(TS_ERR_FORMAT, "video: the video stream holds no frames");
    if (st == TS_OK) {
        AVRational r = v.st->avg_frame_rate; /* PyAV's stream.average_rate */
        *out = (ts_video_info){.width = w,
                               .height = h,
                               .n_frames = frames,
                               .fps = r.num > 0 && r.den > 0 ? av_q2d(r) : 0.0};
    }
    vid_close(&v);
    return st;
}

/* ---- decoding ---------------------------------------------------------------------------- */

typedef struct {
    AVCodecContext *dec;
    AVFrame *frame;
    const int64_t *indices;
    int n, done;       /* indices[done] is the next frame kept */
    int64_t decoded;   /* frames the decoder has given */
    int64_t work;      /* their pixels: the probe's limits hold here too, unprobed */
    int width, height; /* the output size */
    ts_image **frames;
} vid_decoder;

static ts_status vid_decoder_open(vid_decoder *d, const vid_file *v) {
    d->dec = avcodec_alloc_context3(v->codec);
    d->frame = av_frame_alloc();
    if (!d->dec || !d->frame) return ts_error(TS_ERR_NOMEM, "video: no memory");
    int r = avcodec_parameters_to_context(d->dec, v->st->codecpar);
    if (r < 0) return vid_averror(TS_ERR_FORMAT, "the stream's parameters", r);
    d->dec->pkt_timebase = v->st->time_base;
    AVDictionary *opts = vid_codec_opts(); /* one thread: the server decodes on request threads */
    r = avcodec_open2(d->dec, v->codec, &opts);
    av_dict_free(&opts);
    if (r < 0) return vid_averror(TS_ERR_FORMAT, "the decoder does not take the stream", r);
    return TS_OK;
}

/* Takes the decoded frame when its index is the next one asked for. */
static ts_status vid_take(vid_decoder *d) {
    const int64_t i = d->decoded++;
    if (i != d->indices[d->done]) return TS_OK;
    ts_image *rgb = NULL, *out = NULL;
    TS_TRY(vid_frame_rgb(d->frame, &rgb));
    ts_status st = TS_OK;
    if (rgb->width != d->width || rgb->height != d->height) {
        st = ts_image_resize(rgb, d->width, d->height, &out);
        ts_image_free(rgb);
    } else {
        out = rgb;
    }
    if (st == TS_OK) d->frames[d->done++] = out;
    return st;
}

/* Sends one packet (NULL: the end, flushing the decoder) and takes the frames it gives back, as
 * PyAV's CodecContext.decode does: an error sending is an error; an invalid-data error receiving
 * ends this packet's frames when it gave some, and is an error when it gave none. */
static ts_status vid_send(vid_decoder *d, const AVPacket *pkt) {
    int r = avcodec_send_packet(d->dec, pkt);
    if (r < 0) return vid_averror(TS_ERR_FORMAT, "a frame cannot be decoded", r);
    for (int got = 0; d->done < d->n; got++) {
        r = avcodec_receive_frame(d->dec, d->frame);
        if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) break;
        if (r == AVERROR_INVALIDDATA && got) break;
        if (r < 0) return vid_averror(TS_ERR_FORMAT, "a frame cannot be decoded", r);
        d->work += (int64_t)d->frame->width * d->frame->height;
        if (d->decoded >= TS_VIDEO_MAX_FRAMES || d->work > TS_VIDEO_MAX_WORK) {
            av_frame_unref(d->frame);
            return ts_error(TS_ERR_RANGE, "video: more than %d frames or %lld pixels to decode",
                            TS_VIDEO_MAX_FRAMES, (long long)TS_VIDEO_MAX_WORK);
        }
        ts_status st = vid_take(d);
        av_frame_unref(d->frame);
        TS_TRY(st);
    }
    return TS_OK;
}

static ts_status vid_decode(vid_file *v, vid_decoder *d) {
    TS_TRY(vid_decoder_open(d, v));
    for (unsigned i = 0; i < v->fmt->nb_streams; i++)
        if (v->fmt->streams[i] != v->st) v->fmt->streams[i]->discard = AVDISCARD_ALL;
    ts_status st = TS_OK;
    int64_t n_read = 0;
    while (d->done < d->n && vid_next(v, &n_read, &st))
        TS_TRY(vid_send(d, v->pkt));
    TS_TRY(st);
    if (d->done < d->n) TS_TRY(vid_send(d, NULL));
    if (d->done < d->n)
        return ts_error(TS_ERR_FORMAT,
                        "video: the stream has %lld frames; frame %lld was asked for",
                        (long long)d->decoded, (long long)d->indices[d->done]);
    return TS_OK;
}

ts_status ts_video_decode(const void *data, size_t len, const int64_t *indices, int n, int width,
                          int height, ts_image **frames) {
    if (!frames || !indices || n < 1 || (!data && len))
        return ts_error(TS_ERR_INVALID, "video: no data, no frames asked for or no output");
    for (int i = 0; i < n; i++)
        frames[i] = NULL;
    for (int i = 0; i < n; i++)
        if (indices[i] < 0 || (i && indices[i] <= indices[i - 1]))
            return ts_error(TS_ERR_INVALID,
                            "video: frame indices must be ascending and not negative (index %d "
                            "is %lld)",
                            i, (long long)indices[i]);
    if (width < 1 || height < 1)
        return ts_error(TS_ERR_INVALID, "video: output size %dx%d", width, height);
    TS_TRY(vid_check_size(width, height));
    vid_file v;
    TS_TRY(vid_open(&v, data, len));
    vid_decoder d = {
        .indices = indices, .n = n, .width = width, .height = height, .frames = frames};
    ts_status st = vid_decode(&v, &d);
    avcodec_free_context(&d.dec);
    av_frame_free(&d.frame);
    vid_close(&v);
    if (st != TS_OK)
        for (int i = 0; i < n; i++) {
            ts_image_free(frames[i]);
            frames[i] = NULL;
        }
    return st;
}
