/* Shared by the libFuzzer targets: a private scratch directory for the readers that only take a
 * path, and a sink that keeps reads from being optimised away. */
#ifndef TS_FUZZ_UTIL_H
#define TS_FUZZ_UTIL_H

#include <dirent.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile unsigned long fz_sink;

static inline void fz_touch(const void *p, size_t n) {
    if (p && n) fz_sink += ((const unsigned char *)p)[0] + ((const unsigned char *)p)[n - 1];
}

static char fz_dir[64];

/* The directory is flat: removes its files, then itself (at exit). */
static void fz_cleanup(void) {
    DIR *d = opendir(fz_dir);
    if (!d) return;
    char p[320];
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", fz_dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(fz_dir);
}

/* A directory made once per process; on /dev/shm when there, so a write per input stays in
 * memory. Removed at exit. */
static inline const char *fz_tmpdir(void) {
    char *dir = fz_dir;
    if (dir[0]) return dir;
    snprintf(dir, sizeof fz_dir, "%s/tsfuzz.XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(fz_cleanup);
    return dir;
}

/* Writes data to <tmpdir>/name (replacing it) and returns the path in a static buffer. */
static inline const char *fz_write(const char *name, const void *data, size_t size) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", fz_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror("fuzz: write");
        abort();
    }
    return path;
}

#ifndef TS_SOURCE_DIR
#define TS_SOURCE_DIR "."
#endif

/* The tokenizer the text targets load once: TS_FUZZ_TOKENIZER, else the small Qwen3.5 stand-in
 * of the fixtures. */
static inline const char *fz_tokenizer_path(void) {
    const char *path = getenv("TS_FUZZ_TOKENIZER");
    return path ? path : TS_SOURCE_DIR "/tests/fixtures/tokenizer/small/tokenizer.json";
}

/* Aborts with a message: an invariant of the code under test does not hold. */
#define FZ_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz: %s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);     \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
