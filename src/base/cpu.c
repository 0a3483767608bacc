#include "base/cpu.h"

#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect(ts_cpu_features *f) {
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d)) { /* the vendor string is in b, d, c */
        if (b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e) f->vendor = TS_CPU_VENDOR_INTEL;
        if (b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163) f->vendor = TS_CPU_VENDOR_AMD;
    }
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    f->family = (a >> 8) & 0xf;
    if (f->family == 0xf) f->family += (a >> 20) & 0xff;
    int osxsave = (c >> 27) & 1;
    int fma = (c >> 12) & 1, f16c = (c >> 29) & 1, avx = (c >> 28) & 1;
    if (!osxsave || !avx) return;
    uint64_t xcr0 = xgetbv0();
    int ymm_ok = (xcr0 & 0x6) == 0x6;
    int zmm_ok = ymm_ok && (xcr0 & 0xe0) == 0xe0;
    int amx_ok = (xcr0 & 0x60000) == 0x60000;
    unsigned maxleaf = __get_cpuid_max(0, 0);
    if (maxleaf < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    f->fma = ymm_ok && fma;
    f->f16c = ymm_ok && f16c;
    f->avx2 = ymm_ok && ((b >> 5) & 1);
    f->avx512f = zmm_ok && ((b >> 16) & 1);
    f->avx512dq = zmm_ok && ((b >> 17) & 1);
    f->avx512bw = zmm_ok && ((b >> 30) & 1);
    f->avx512vl = zmm_ok && ((b >> 31) & 1);
    f->avx512vnni = zmm_ok && ((c >> 11) & 1);
    f->amx_bf16 = amx_ok && ((d >> 22) & 1);
    f->amx_tile = amx_ok && ((d >> 24) & 1);
    f->amx_int8 = amx_ok && ((d >> 25) & 1);
    __cpuid_count(7, 1, a, b, c, d);
    f->avx512bf16 = zmm_ok && ((a >> 5) & 1);
}
#else
static void detect(ts_cpu_features *f) { (void)f; }
#endif

static ts_cpu_features feats;
static pthread_once_t feats_once = PTHREAD_ONCE_INIT;

static void detect_once(void) { detect(&feats); }

const ts_cpu_features *ts_cpu_get_features(void) {
    pthread_once(&feats_once, detect_once);
    return &feats;
}

int ts_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
