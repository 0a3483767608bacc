/* base/cpu: what cpuid says of the CPU, against what the kernel says in /proc/cpuinfo - the
 * vendor and family (which pick the decode kernels' prefetch distance and row order) and the
 * instruction sets (which pick the kernels). Skipped where /proc/cpuinfo names no x86 vendor. */
#include "base/cpu.h"
#include "testutil.h"

#include <string.h>

/* The value of "key : value" in the first processor's block, or NULL. */
static const char *cpuinfo_value(const char *text, const char *key, char *out, size_t n) {
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len == 0) break; /* the end of the first processor's block */
        const char *colon = memchr(line, ':', len);
        if (colon && strncmp(line, key, strlen(key)) == 0 &&
            (line[strlen(key)] == ' ' || line[strlen(key)] == '\t')) {
            const char *v = colon + 1;
            while (*v == ' ')
                v++;
            size_t vl = (size_t)(line + len - v);
            if (vl >= n) vl = n - 1;
            memcpy(out, v, vl);
            out[vl] = 0;
            return out;
        }
        line = end ? end + 1 : NULL;
    }
    return NULL;
}

static bool has_flag(const char *flags, const char *name) {
    size_t n = strlen(name);
    for (const char *p = flags; (p = strstr(p, name)); p += n)
        if ((p == flags || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return true;
    return false;
}

int main(void) {
    static char text[1 << 16];
    FILE *f = fopen("/proc/cpuinfo", "r");
    size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[got] = 0;
    char vendor[64], family[16];
    static char flags[8192];
    if (!cpuinfo_value(text, "vendor_id", vendor, sizeof vendor) ||
        !cpuinfo_value(text, "cpu family", family, sizeof family) ||
        !cpuinfo_value(text, "flags", flags, sizeof flags) ||
        (strcmp(vendor, "GenuineIntel") && strcmp(vendor, "AuthenticAMD"))) {
        printf("test_cpu: skipped (no x86 vendor in /proc/cpuinfo)\n");
        return 0;
    }
    const ts_cpu_features *c = ts_cpu_get_features();
    ts_cpu_vendor want =
        strcmp(vendor, "GenuineIntel") == 0 ? TS_CPU_VENDOR_INTEL : TS_CPU_VENDOR_AMD;
    CHECKF(c->vendor == want, "vendor %d, /proc/cpuinfo says %s", (int)c->vendor, vendor);
    CHECKF(c->family == (unsigned)atoi(family), "family 0x%x, /proc/cpuinfo says %s", c->family,
           family);
    /* the kernel lists a flag only when the OS supports its state, as our check of XCR0 does */
    const struct {
        bool have;
        const char *flag;
    } isa[] = {{c->avx2, "avx2"},
               {c->fma, "fma"},
               {c->f16c, "f16c"},
               {c->avx512f, "avx512f"},
               {c->avx512bw, "avx512bw"},
               {c->avx512vl, "avx512vl"},
               {c->avx512dq, "avx512dq"},
               {c->avx512vnni, "avx512_vnni"},
               {c->avx512bf16, "avx512_bf16"},
               {c->amx_tile, "amx_tile"},
               {c->amx_int8, "amx_int8"},
               {c->amx_bf16, "amx_bf16"}};
    for (size_t i = 0; i < sizeof isa / sizeof *isa; i++)
        CHECKF(isa[i].have == has_flag(flags, isa[i].flag), "%s: cpuid %d, /proc/cpuinfo %d",
               isa[i].flag, isa[i].have, has_flag(flags, isa[i].flag));
    printf("test_cpu: %s family 0x%x\n", vendor, c->family);
    return tu_report("test_cpu");
}
