/* stream_compute: how fast can a loop with a given amount of arithmetic per byte stream its
 * input from DRAM on two threads, next to how fast it runs on data in L2?
 *
 * It answers whether a quantized decode kernel that streams below the machine's bandwidth is
 * held back by its arithmetic or by how it asks for memory: the loop reads the access pattern of
 * a regrouped Q4_K row (chunks of 144 bytes, two 64-byte code loads at +16 and +80, a 16-byte
 * scale load at +4), does `alu` dependent vector operations on each code load and two VNNI dot
 * products a chunk, and prefetches each line `pf` bytes ahead (prefetcht1, as the kernels do;
 * 0: no software prefetch). "hot" runs 512 KiB a thread 400 times (in L2); "dram" one pass over
 * 512 MiB a thread (fresh lines every time). Raise `alu` until "hot" matches the kernel's own hot
 * rate (`test_quant --bench hot avx512 Q4_K`), then compare "dram" with the kernel's
 * (`test_quant --bench decode avx512 Q4_K`): bench/RESULTS.md has a run.
 *
 * Not part of the build (it needs AVX-512 VNNI):
 *   cc -O2 -march=native -pthread bench/stream_compute.c -o stream_compute
 *   ./stream_compute [alu 8] [chunk 144] [pf 2304]                                            */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef struct {
    const unsigned char *p;
    size_t bytes;
    int reps, alu, chunk, pf;
    size_t read; /* bytes the loop covered: a chunk's loads stop 4 KiB short of the end */
    int sink;
} stream_arg;

/* where each thread leaves its sums, so that the compiler keeps the loads that make them */
static volatile int stream_sink;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *stream(void *v) {
    stream_arg *a = v;
    const __m512i k = _mm512_set1_epi8(3);
    __m512i acc[8];
    for (int i = 0; i < 8; i++)
        acc[i] = _mm512_setzero_si512();
    int j = 0;
    /* the chunks the loop below covers, counted here rather than in it (a store a chunk would
     * slow the lightest settings) */
    const size_t chunks = a->bytes > (size_t)a->chunk + 4096
                              ? (a->bytes - (size_t)a->chunk - 4096 - 1) / (size_t)a->chunk + 1
                              : 0;
    a->read = chunks * (size_t)a->chunk * (size_t)a->reps;
    for (int r = 0; r < a->reps; r++) {
        size_t next_pf = 0; /* every line is asked for once, pf bytes before its chunk */
        for (size_t i = 0; i + (size_t)a->chunk + 4096 < a->bytes; i += (size_t)a->chunk) {
            for (; a->pf && next_pf < i + (size_t)a->chunk; next_pf += 64)
                _mm_prefetch((const char *)a->p + ((next_pf + (size_t)a->pf) & ~(size_t)63),
                             _MM_HINT_T1);
            __m512i x0 = _mm512_loadu_si512(a->p + i + 16), x1 = _mm512_loadu_si512(a->p + i + 80);
            const __m128i sc = _mm_loadu_si128((const __m128i *)(a->p + i + 4));
            for (int q = 0; q < a->alu; q++) {
                x0 = _mm512_ternarylogic_epi32(x0, k, _mm512_srli_epi16(x0, 1), 0x96);
                x1 = _mm512_ternarylogic_epi32(x1, k, _mm512_srli_epi16(x1, 1), 0x96);
            }
            acc[j & 7] = _mm512_dpbusd_epi32(acc[j & 7], x0, k);
            acc[(j + 1) & 7] =
                _mm512_dpbusd_epi32(acc[(j + 1) & 7], x1, _mm512_broadcast_i32x4(sc));
            j += 2;
        }
    }
    __m512i s = acc[0];
    for (int i = 1; i < 8; i++)
        s = _mm512_add_epi32(s, acc[i]);
    a->sink = _mm512_reduce_add_epi32(s);
    return NULL;
}

/* GB/s of two threads, each over its own `bytes` from buf, reps times (the bytes they read) */
static double two_threads(const unsigned char *buf, size_t bytes, int reps, int alu, int chunk,
                          int pf) {
    stream_arg a[2] = {{buf, bytes, reps, alu, chunk, pf, 0, 0},
                       {buf + bytes, bytes, reps, alu, chunk, pf, 0, 0}};
    pthread_t t;
    double t0 = now_s();
    if (pthread_create(&t, NULL, stream, &a[1]) != 0) return 0.0;
    stream(&a[0]);
    pthread_join(t, NULL);
    const double s = now_s() - t0;
    stream_sink = a[0].sink + a[1].sink;
    return (double)(a[0].read + a[1].read) / s * 1e-9;
}

int main(int argc, char **argv) {
    const int alu = argc > 1 ? atoi(argv[1]) : 8;
    const int chunk = argc > 2 ? atoi(argv[2]) : 144;
    const int pf = argc > 3 ? atoi(argv[3]) : 2304;
    if (alu < 0 || chunk < 96 || chunk > 4096 || pf < 0 || pf > (1 << 20)) {
        fprintf(stderr, "usage: stream_compute [alu >= 0] [chunk 96..4096] [pf 0..1048576]\n");
        return 2;
    }
    const size_t per = (size_t)512 << 20; /* a thread's DRAM share */
    unsigned char *buf =
        mmap(NULL, 4 * per, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        perror("stream_compute: mmap");
        return 1;
    }
    madvise(buf, 4 * per, MADV_HUGEPAGE);
    memset(buf, 1, 4 * per);
    double hot = 0.0, dram = 0.0;
    for (int r = 0; r < 3; r++) { /* best of three; DRAM passes alternate two buffers */
        double h = two_threads(buf, 512 << 10, 400, alu, chunk, pf);
        double d = two_threads(buf + (size_t)(r & 1) * 2 * per, per, 1, alu, chunk, pf);
        hot = h > hot ? h : hot;
        dram = d > dram ? d : dram;
    }
    printf("alu %d, chunk %d, prefetch %d: hot %.1f GB/s, dram %.1f GB/s\n", alu, chunk, pf, hot,
           dram);
    munmap(buf, 4 * per);
    return 0;
}
