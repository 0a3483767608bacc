/* What the CPU we run on can do, read from cpuid once (never what the compiler assumed). */
#ifndef TS_BASE_CPU_H
#define TS_BASE_CPU_H

#include <stdbool.h>

typedef enum { TS_CPU_VENDOR_OTHER, TS_CPU_VENDOR_INTEL, TS_CPU_VENDOR_AMD } ts_cpu_vendor;

typedef struct {
    ts_cpu_vendor vendor;
    unsigned family; /* cpuid's display family: AMD 0x19 Zen 3 / Zen 4, 0x1a Zen 5 */
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16;
    bool amx_tile, amx_int8, amx_bf16;
} ts_cpu_features;

/* Filled on first call; thread-safe (idempotent detection). */
const ts_cpu_features *ts_cpu_get_features(void);
int ts_cpu_count(void);

#endif
