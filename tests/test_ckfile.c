/* test_ckfile.c - checkpoint files (common/core/ckfile.h): a file written whole reads
 * back; each kind of damage (bad magic, another format, a flipped bit in any section,
 * truncation anywhere, bytes appended) is refused with a message naming it; and the
 * streaming verifier (ferry_ck_verify, what ferry-ps's probes use) gives exactly the
 * whole-file reader's verdict and message on every one of them, keeping the section it
 * was asked for. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common/core/ckfile.h"

#define MAGIC "FERRYTST"

static char dir[] = "/tmp/ferry-ckfile.XXXXXX";

static void remove_dir(void) {
    char cmd[300];
    (void)snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    (void)system(cmd);
}

/* dir/name; the directory is made on first use and removed at exit. */
static void path_of(char *out, size_t cap, const char *name) {
    static int made;
    if (!made) {
        CHECK(mkdtemp(dir) != NULL);
        CHECK_EQ(atexit(remove_dir), 0);
        made = 1;
    }
    (void)snprintf(out, cap, "%s/%s", dir, name);
}

/* A file of three sections: META (12 bytes), a 3 MiB PARM (past one 1 MiB read),
 * an empty NONE. */
static void write_good(const char *path) {
    ferry_ckw *w = NULL;
    CHECK_OK(ferry_ckw_open(path, MAGIC, 7, 3, &w));
    CHECK_OK(ferry_ckw_begin(w, FERRY_CK_TAG("META"), 12));
    ferry_ckw_u64(w, 42);
    ferry_ckw_u32(w, 2);
    CHECK_OK(ferry_ckw_end(w));
    size_t n = (size_t)3 << 18; /* floats: 3 MiB */
    float *p = malloc(n * sizeof *p);
    CHECK(p != NULL);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)i * 0.5f;
    CHECK_OK(ferry_ckw_begin(w, FERRY_CK_TAG("PARM"), n * sizeof *p));
    ferry_ckw_f32s(w, p, n);
    CHECK_OK(ferry_ckw_end(w));
    free(p);
    CHECK_OK(ferry_ckw_section(w, FERRY_CK_TAG("NONE"), "", 0));
    CHECK_OK(ferry_ckw_commit(w));
}

static size_t file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    CHECK_EQ(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    (void)fclose(f);
    return (size_t)n;
}

/* Both readers on path: the same status and message. Returns the status. */
static ferry_status both(const char *path, uint32_t format, const char *want_phrase) {
    ferry_ckr r;
    ferry_status a = ferry_ckr_read(path, MAGIC, format, &r);
    char msg_a[1024];
    (void)snprintf(msg_a, sizeof msg_a, "%s", a == FERRY_OK ? "" : ferry_error_last());
    if (a == FERRY_OK)
        ferry_ckr_free(&r);
    uint8_t meta[64];
    size_t len = 0;
    uint32_t n = 0;
    ferry_status b =
        ferry_ck_verify(path, MAGIC, format, FERRY_CK_TAG("META"), meta, sizeof meta, &len, &n);
    char msg_b[1024];
    (void)snprintf(msg_b, sizeof msg_b, "%s", b == FERRY_OK ? "" : ferry_error_last());
    if (a != b || strcmp(msg_a, msg_b) != 0)
        fprintf(stderr, "%s: read %d '%s' / verify %d '%s'\n", path, a, msg_a, b, msg_b);
    CHECK_EQ(a, b);
    CHECK(strcmp(msg_a, msg_b) == 0);
    if (want_phrase != NULL && strstr(msg_a, want_phrase) == NULL)
        fprintf(stderr, "want '%s' in '%s'\n", want_phrase, msg_a);
    CHECK(want_phrase == NULL || strstr(msg_a, want_phrase) != NULL);
    if (b == FERRY_OK) {
        CHECK_EQ(n, 3u);
        CHECK_EQ(len, (size_t)12);
        ferry_ckcur c = {meta, meta + len, 0};
        CHECK_EQ(ferry_ckcur_u64(&c), (uint64_t)42);
        CHECK_EQ(ferry_ckcur_u32(&c), 2u);
        CHECK(!c.bad);
    }
    return a;
}

/* A copy of good with byte at offset XOR-ed with x, cut to len bytes, or extended. */
static void variant(const char *good, const char *out, size_t offset, uint8_t x, size_t len,
                    size_t append) {
    size_t n = file_size(good);
    uint8_t *b = calloc(n + append + 1, 1);
    CHECK(b != NULL);
    FILE *f = fopen(good, "rb");
    CHECK(f != NULL && fread(b, 1, n, f) == n);
    (void)fclose(f);
    if (offset < n)
        b[offset] ^= x;
    size_t m = len < n ? len : n + append;
    f = fopen(out, "wb");
    CHECK(f != NULL && fwrite(b, 1, m, f) == m);
    (void)fclose(f);
    free(b);
}

TEST(good_file) {
    char good[256];
    path_of(good, sizeof good, "good.ck");
    write_good(good);
    CHECK_OK(both(good, 7, NULL));
}

TEST(damage_is_named_alike) {
    char good[256], bad[256];
    path_of(good, sizeof good, "good.ck");
    path_of(bad, sizeof bad, "bad.ck");
    write_good(good);
    size_t n = file_size(good);
    /* header: 16 bytes; META: 12 + 12 + 4; PARM: 12 + 3 MiB + 4; NONE: 12 + 0 + 4 */
    size_t parm = 16 + 28, none = parm + 12 + ((size_t)3 << 20) + 4;
    CHECK_EQ(n, none + 16);
    CHECK_EQ(both(good, 8, "format 7, this build reads format 8"), FERRY_ERR_FORMAT);
    variant(good, bad, 0, 0x01, n, 0);
    CHECK_EQ(both(bad, 7, "bad magic"), FERRY_ERR_FORMAT);
    variant(good, bad, 16 + 12 + 3, 0x10, n, 0); /* in META's payload */
    CHECK_EQ(both(bad, 7, "section 1 of 3 (META, 12 bytes) fails its CRC-32"), FERRY_ERR_FORMAT);
    variant(good, bad, parm + 12 + ((size_t)2 << 20) + 5, 0x80, n, 0); /* PARM, third MiB */
    CHECK_EQ(both(bad, 7, "section 2 of 3 (PARM"), FERRY_ERR_FORMAT);
    variant(good, bad, none + 12, 0x01, n, 0); /* NONE's CRC itself */
    CHECK_EQ(both(bad, 7, "section 3 of 3 (NONE, 0 bytes) fails its CRC-32"), FERRY_ERR_FORMAT);
    size_t cuts[] = {8, 16, 20, parm + 5, parm + 12 + 1000, none - 2, none + 3, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        variant(good, bad, n, 0, cuts[i], 0);
        CHECK_EQ(both(bad, 7, NULL), FERRY_ERR_FORMAT);
    }
    variant(good, bad, n, 0, n, 100);
    CHECK_EQ(both(bad, 7, "100 bytes after the last section"), FERRY_ERR_FORMAT);
    path_of(bad, sizeof bad, "missing.ck");
    CHECK_EQ(both(bad, 7, NULL), FERRY_ERR_IO);
}

TEST(kept_section_bounded) {
    char good[256];
    path_of(good, sizeof good, "good.ck");
    write_good(good);
    uint8_t small[8];
    size_t len;
    uint32_t n;
    CHECK_EQ(ferry_ck_verify(good, MAGIC, 7, FERRY_CK_TAG("META"), small, sizeof small, &len, &n),
             FERRY_ERR_FORMAT);
    CHECK(strstr(ferry_error_last(), "has 12 bytes, at most 8") != NULL);
}

FERRY_TEST_MAIN(T(good_file) T(damage_is_named_alike) T(kept_section_bounded))
