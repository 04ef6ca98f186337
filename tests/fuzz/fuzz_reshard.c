/* fuzz_reshard.c - libFuzzer target for what `ferry-ctl reshard` reads: a job's server
 * checkpoint files (server/reshard.c over server/checkpoint.c), which whoever runs the
 * command hands it. The input describes 1..3 files section by section; each file is
 * written as a ckfile with every length and CRC right (so the fuzzer gets past the
 * container's checks to the META and MODL payloads: module headers, packed configs,
 * parameter blocks and optimizer states), and the set is cut for 1..4 servers into a
 * temporary directory. A refusal is fine; a crash, a leak or a sanitizer report is a
 * finding.
 *
 * Input: u8 files-1 (mod 3) | u8 servers-1 (mod 4), then per file: u8 sections, then
 * per section: u8 tag (even: META, odd: MODL) | u32 length (LE, clamped to what is
 * left) | payload. Seeds (tests/fuzz/corpus/fuzz_reshard) are real files of a tiny
 * 2-server job in this form (scripts/fuzz-reshard-seeds.sh). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/core/ckfile.h"
#include "common/core/log.h"
#include "server/ps-impl.h"

#define FUZZ_ASSERT(c)                                                                             \
    do {                                                                                           \
        if (!(c))                                                                                  \
            abort();                                                                               \
    } while (0)

static char dir[64];

static void dir_empty(void) {
    DIR *d = opendir(dir);
    FUZZ_ASSERT(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char path[400];
        (void)snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        (void)unlink(path);
    }
    (void)closedir(d);
}

static void dir_remove(void) {
    dir_empty();
    (void)rmdir(dir);
}

typedef struct reader {
    const uint8_t *p;
    size_t n, at;
} reader;

static uint32_t take(reader *r, size_t bytes) {
    uint32_t v = 0;
    for (size_t i = 0; i < bytes && r->at < r->n; i++)
        v |= (uint32_t)r->p[r->at++] << (8 * i);
    return v;
}

/* One file from the input: its sections, written with their lengths and CRCs. */
static void write_file(reader *r, const char *path) {
    uint32_t nsec = take(r, 1) % 8 + 1;
    ferry_ckw *w = NULL;
    FUZZ_ASSERT(ferry_ckw_open(path, "FERRYPS3", 3, nsec, &w) == FERRY_OK);
    for (uint32_t s = 0; s < nsec; s++) {
        uint32_t tag = take(r, 1) & 1 ? FERRY_CK_TAG("MODL") : FERRY_CK_TAG("META");
        size_t len = take(r, 4);
        if (len > r->n - r->at)
            len = r->n - r->at;
        FUZZ_ASSERT(ferry_ckw_section(w, tag, r->p + r->at, len) == FERRY_OK);
        r->at += len;
    }
    FUZZ_ASSERT(ferry_ckw_commit(w) == FERRY_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (dir[0] == '\0') {
        ferry_log_set_level(FERRY_LOG_LEVEL_ERROR);
        (void)snprintf(dir, sizeof dir, "/tmp/fuzz-reshard.XXXXXX");
        FUZZ_ASSERT(mkdtemp(dir) != NULL);
        FUZZ_ASSERT(atexit(dir_remove) == 0);
    }
    reader r = {data, size, 0};
    int k = (int)take(&r, 1) % 3 + 1, k2 = (int)take(&r, 1) % 4 + 1;
    char paths[3][128];
    const char *in[3];
    for (int s = 0; s < k; s++) {
        (void)snprintf(paths[s], sizeof paths[s], "%s/in%d-job-step1.ckpt", dir, s);
        write_file(&r, paths[s]);
        in[s] = paths[s];
    }
    ferry__ps_reshard_src *src = NULL;
    if (ferry__ps_reshard_open(in, k, &src) == FERRY_OK) {
        for (int t = 0; t < k2; t++) {
            char name[32];
            uint64_t bytes = 0;
            (void)snprintf(name, sizeof name, "out%d.ckpt", t);
            if (ferry__ps_reshard_write(src, k2, t, dir, name, &bytes) != FERRY_OK)
                break;
        }
        ferry__ps_reshard_close(src);
    }
    dir_empty();
    return 0;
}
