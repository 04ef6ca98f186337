/* test_corpus.c - vocabulary and corpus loading: the real PTB and WikiText-2 counts and
 * id streams (checksums computed independently with Python, pytorch/examples data.py
 * rules), the tokenization rules on tiny files, and one precise error per bad input.
 * The permission check runs as an unprivileged user in every run: under root, in a
 * child that drops to nobody (uid and gid 65534) first. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* setgroups */
#include <grp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "common/core/log.h" /* ferry_now */
#include "worker/corpus.h"   /* ferry_corpus_*, ferry_vocab_* */

/* ---- helpers ------------------------------------------------------------------------- */

static char tmp_root[64];

/* A fresh directory under /tmp for one test; the files are removed by rm_tree. */
static const char *tmp_dir(void) {
    (void)snprintf(tmp_root, sizeof tmp_root, "/tmp/ferry-corpus-XXXXXX");
    CHECK(mkdtemp(tmp_root) != NULL);
    return tmp_root;
}

static void write_file(const char *dir, const char *name, const char *text, size_t len) {
    char path[256];
    (void)snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(text, 1, len, f) == len);
    CHECK(fclose(f) == 0);
}

static void write_str(const char *dir, const char *name, const char *text) {
    write_file(dir, name, text, strlen(text));
}

static void rm_tree(const char *dir) {
    char cmd[256];
    (void)snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* Loads dir expecting failure with status want and a message containing each needle. */
static void expect_load_error(const char *dir, ferry_status want, const char *needle1,
                              const char *needle2) {
    ferry_corpus *c = (ferry_corpus *)(uintptr_t)0x1; /* must stay untouched */
    ferry_error_clear();
    CHECK_STATUS(ferry_corpus_load(dir, &c), want);
    CHECK(c == (ferry_corpus *)(uintptr_t)0x1);
    const char *msg = ferry_error_last();
    fprintf(stderr, "  error: %s\n", msg);
    CHECK(strchr(msg, '\n') == NULL);
    CHECK(strstr(msg, needle1) != NULL);
    CHECK(needle2 == NULL || strstr(msg, needle2) != NULL);
}

/* Loads dir as a user that file permissions apply to: this process if it is not
 * root, else a child that drops to nobody (65534) first; checks fail in the child and
 * so in the parent. want_ok: the load must succeed; else it must fail with
 * FERRY_ERR_IO naming both needles (expect_load_error). */
static void load_unprivileged(const char *dir, int want_ok, const char *needle1,
                              const char *needle2) {
    int forked = geteuid() == 0;
    pid_t pid = forked ? fork() : 0;
    CHECK(pid >= 0);
    if (pid > 0) {
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        return;
    }
    if (forked) {
        CHECK(setgroups(0, NULL) == 0 && setgid(65534) == 0 && setuid(65534) == 0);
        CHECK(geteuid() == 65534 && getegid() == 65534);
    }
    if (want_ok) {
        ferry_corpus *c = NULL;
        CHECK_OK(ferry_corpus_load(dir, &c));
        ferry_corpus_destroy(c);
    } else {
        expect_load_error(dir, FERRY_ERR_IO, needle1, needle2);
    }
    if (forked)
        _exit(0); /* the child: its parent reports */
}

/* The same rolling checksum as the Python reference: h = h * 1000003 + id (mod 2^64). */
static uint64_t stream_sum(const int32_t *ids, int64_t n) {
    uint64_t h = 0;
    for (int64_t i = 0; i < n; i++)
        h = h * 1000003u + (uint64_t)ids[i];
    return h;
}

typedef struct corpus_ref {
    const char *dir;
    int64_t n[3];
    int32_t V, eos, unk;
    uint64_t sum[3];
    uint64_t vocab_hash;
} corpus_ref;

static void check_reference(const corpus_ref *r) {
    ferry_corpus *c;
    double t0 = ferry_now();
    CHECK_OK(ferry_corpus_load(ferry_test_path(r->dir), &c));
    /* Reported, not checked: speed is bench/'s business. */
    fprintf(stderr, "  %s loaded in %.3f s\n", r->dir, ferry_now() - t0);
    const ferry_vocab *v = ferry_corpus_vocab(c);
    CHECK_EQ(ferry_vocab_size(v), r->V);
    CHECK_EQ(ferry_vocab_find(v, "<eos>", 5), r->eos);
    CHECK_EQ(ferry_vocab_find(v, "<unk>", 5), r->unk);
    CHECK_EQ(ferry_vocab_hash(v), r->vocab_hash);
    for (int s = 0; s < FERRY_SPLIT_COUNT; s++) {
        int64_t n;
        const int32_t *ids = ferry_corpus_ids(c, (ferry_split)s, &n);
        CHECK_EQ(n, r->n[s]);
        CHECK_EQ(stream_sum(ids, n), r->sum[s]);
        CHECK_EQ(ferry_corpus_unk_count(c, (ferry_split)s), 0);
        for (int64_t i = 0; i < n; i++)
            CHECK(ids[i] >= 0 && ids[i] < r->V);
    }
    ferry_corpus_destroy(c);
}

/* ---- real corpora -------------------------------------------------------------------- */

TEST(ptb) {
    static const corpus_ref r = {
        .dir = "data/ptb",
        .n = {929589, 73760, 82430},
        .V = 10000,
        .eos = 24,
        .unk = 26,
        .sum = {0x1217ae0490dee5f9u, 0xec454019b5517bf0u, 0xc4dbe3897bac5201u},
        .vocab_hash = 0xfd6e2d43e1a1600au,
    };
    check_reference(&r);
    /* The first line is " aer banknote berlitz ... " with twelve new words then <eos>. */
    ferry_corpus *c;
    CHECK_OK(ferry_corpus_load(ferry_test_path("data/ptb/"), &c)); /* trailing '/' is fine */
    const int32_t *ids = ferry_corpus_ids(c, FERRY_SPLIT_TRAIN, NULL);
    for (int i = 0; i < 12; i++)
        CHECK_EQ(ids[i], i);
    CHECK(strcmp(ferry_vocab_word(ferry_corpus_vocab(c), 0), "aer") == 0);
    ferry_corpus_destroy(c);
}

TEST(wikitext2) {
    static const corpus_ref r = {
        .dir = "data/wikitext-2",
        .n = {2088628, 217646, 245569},
        .V = 33278,
        .eos = 0,
        .unk = 9,
        .sum = {0xc1519f1244450db6u, 0x322755c81ac4226bu, 0x21a337286afff591u},
        .vocab_hash = 0xb342444211ef13f3u,
    };
    check_reference(&r);
}

/* ---- tokenization rules -------------------------------------------------------------- */

TEST(tokenize_rules) {
    const char *dir = tmp_dir();
    /* Blank line -> one <eos>; tabs and \r separate words; a last line without '\n'
     * still ends with <eos>; words unseen in train become <unk>. */
    write_str(dir, "train.txt", "a b\n\n  c\ta \r\n<unk> d");
    write_str(dir, "valid.txt", "a zz b\nyy\n");
    write_str(dir, "test.txt", "d");
    ferry_corpus *c;
    CHECK_OK(ferry_corpus_load(dir, &c));
    const ferry_vocab *v = ferry_corpus_vocab(c);
    /* ids: a0 b1 <eos>2 c3 <unk>4 d5 */
    CHECK_EQ(ferry_vocab_size(v), 6);
    static const char *words[] = {"a", "b", "<eos>", "c", "<unk>", "d"};
    for (int32_t i = 0; i < 6; i++)
        CHECK(strcmp(ferry_vocab_word(v, i), words[i]) == 0);
    static const int32_t train[] = {0, 1, 2, 2, 3, 0, 2, 4, 5, 2};
    static const int32_t valid[] = {0, 4, 1, 2, 4, 2};
    static const int32_t test[] = {5, 2};
    const int32_t *want[] = {train, valid, test};
    int64_t nwant[] = {10, 6, 2};
    for (int s = 0; s < FERRY_SPLIT_COUNT; s++) {
        int64_t n;
        const int32_t *ids = ferry_corpus_ids(c, (ferry_split)s, &n);
        CHECK_EQ(n, nwant[s]);
        for (int64_t i = 0; i < n; i++)
            CHECK_EQ(ids[i], want[s][i]);
    }
    CHECK_EQ(ferry_corpus_unk_count(c, FERRY_SPLIT_VALID), 2);
    CHECK_EQ(ferry_corpus_unk_count(c, FERRY_SPLIT_TEST), 0);
    CHECK_EQ(ferry_vocab_find(v, "zz", 2), -1);
    ferry_corpus_destroy(c);
    rm_tree(dir);
}

TEST(unknown_word_without_unk) {
    const char *dir = tmp_dir();
    write_str(dir, "train.txt", "the cat\nsat on\n");
    write_str(dir, "valid.txt", "the cat\n");
    write_str(dir, "test.txt", "the cat\nthe dog sat\n");
    char want[128];
    (void)snprintf(want, sizeof want, "%s/test.txt:2: word 'dog'", dir);
    expect_load_error(dir, FERRY_ERR_FORMAT, want, "<unk>");
    rm_tree(dir);
}

/* ---- bad input ----------------------------------------------------------------------- */

TEST(missing_files) {
    expect_load_error("/nonexistent/ferry/x", FERRY_ERR_IO,
                      "cannot open /nonexistent/ferry/x/train.txt: No such file or directory",
                      NULL);
    const char *dir = tmp_dir();
    write_str(dir, "train.txt", "a b\n");
    write_str(dir, "test.txt", "a b\n");
    char want[128];
    (void)snprintf(want, sizeof want, "cannot open %s/valid.txt: No such file or directory", dir);
    expect_load_error(dir, FERRY_ERR_IO, want, NULL);
    rm_tree(dir);
}

TEST(directory_as_file) {
    const char *dir = tmp_dir();
    char sub[128];
    (void)snprintf(sub, sizeof sub, "%s/train.txt", dir);
    CHECK(mkdir(sub, 0755) == 0);
    char want[160];
    (void)snprintf(want, sizeof want, "cannot read %s: Is a directory", sub);
    expect_load_error(dir, FERRY_ERR_IO, want, NULL);
    rm_tree(dir);
}

TEST(unreadable_file) {
    const char *dir = tmp_dir();
    write_str(dir, "valid.txt", "a b\n");
    write_str(dir, "test.txt", "a b\n");
    char path[128];
    (void)snprintf(path, sizeof path, "%s/train.txt", dir);
    /* A file that opens but cannot be read, even by root: reading address 0 of this
     * process's memory fails with EIO. */
    CHECK(symlink("/proc/self/mem", path) == 0);
    char want[160];
    (void)snprintf(want, sizeof want, "cannot read %s: Input/output error", path);
    expect_load_error(dir, FERRY_ERR_IO, want, NULL);
    /* A file without read permission, read by a user it applies to (root reads any
     * file): the same directory loads while train.txt is readable, so the error is
     * the file's mode and nothing else. */
    CHECK(unlink(path) == 0);
    write_str(dir, "train.txt", "a b\n");
    CHECK(chmod(dir, 0755) == 0);
    static const char *const names[] = {"train.txt", "valid.txt", "test.txt"};
    for (int i = 0; i < 3; i++) {
        char p[160];
        (void)snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        CHECK(chmod(p, 0644) == 0);
    }
    load_unprivileged(dir, 1, NULL, NULL);
    CHECK(chmod(path, 0) == 0);
    load_unprivileged(dir, 0, "cannot open", "Permission denied");
    rm_tree(dir);
}

TEST(empty_split) {
    const char *dir = tmp_dir();
    write_str(dir, "train.txt", "");
    write_str(dir, "valid.txt", "a\n");
    write_str(dir, "test.txt", "a\n");
    char want[128];
    (void)snprintf(want, sizeof want, "%s/train.txt has no tokens", dir);
    expect_load_error(dir, FERRY_ERR_FORMAT, want, NULL);
    write_str(dir, "train.txt", "a\n");
    write_str(dir, "test.txt", "");
    (void)snprintf(want, sizeof want, "%s/test.txt has no tokens", dir);
    expect_load_error(dir, FERRY_ERR_FORMAT, want, NULL);
    rm_tree(dir);
}

TEST(binary_file) {
    const char *dir = tmp_dir();
    static const char garbage[] = "ok line\n\x7f"
                                  "ELF\x02\x01\x01\0\0\0\xff\xfe\n";
    write_file(dir, "train.txt", garbage, sizeof garbage - 1);
    write_str(dir, "valid.txt", "a\n");
    write_str(dir, "test.txt", "a\n");
    char want[128];
    (void)snprintf(want, sizeof want, "%s/train.txt:2: NUL byte", dir);
    expect_load_error(dir, FERRY_ERR_FORMAT, want, "binary");
    rm_tree(dir);
}

/* ---- vocabulary ---------------------------------------------------------------------- */

/* FNV-1a over a file's bytes, independent of the library's implementation. */
static uint64_t file_fnv(const char *path) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    uint64_t h = 0xcbf29ce484222325u;
    int ch;
    while ((ch = fgetc(f)) != EOF)
        h = (h ^ (uint64_t)ch) * 0x100000001b3u;
    CHECK(fclose(f) == 0);
    return h;
}

TEST(vocab_save_load) {
    ferry_corpus *c;
    CHECK_OK(ferry_corpus_load(ferry_test_path("data/ptb"), &c));
    const ferry_vocab *v = ferry_corpus_vocab(c);
    const char *dir = tmp_dir();
    char path[128];
    (void)snprintf(path, sizeof path, "%s/vocab.txt", dir);
    CHECK_OK(ferry_vocab_save(v, path));
    CHECK_EQ(file_fnv(path), ferry_vocab_hash(v));
    ferry_vocab *w;
    CHECK_OK(ferry_vocab_load(path, &w));
    CHECK_EQ(ferry_vocab_size(w), ferry_vocab_size(v));
    for (int32_t i = 0; i < ferry_vocab_size(v); i++)
        CHECK(strcmp(ferry_vocab_word(w, i), ferry_vocab_word(v, i)) == 0);
    CHECK_EQ(ferry_vocab_hash(w), ferry_vocab_hash(v));
    /* One more word changes the hash. */
    int32_t id;
    CHECK_OK(ferry_vocab_add(w, "ferry-ps", 8, &id));
    CHECK_EQ(id, 10000);
    CHECK(ferry_vocab_hash(w) != ferry_vocab_hash(v));
    ferry_vocab_destroy(w);
    ferry_corpus_destroy(c);

    /* Bad vocabulary files name the line. */
    write_str(dir, "dup.txt", "a\nb\na\n");
    (void)snprintf(path, sizeof path, "%s/dup.txt", dir);
    w = NULL;
    CHECK_STATUS(ferry_vocab_load(path, &w), FERRY_ERR_FORMAT);
    CHECK(w == NULL && strstr(ferry_error_last(), "dup.txt:3: word 'a' appears twice"));
    write_str(dir, "gap.txt", "a\n\nb");
    (void)snprintf(path, sizeof path, "%s/gap.txt", dir);
    CHECK_STATUS(ferry_vocab_load(path, &w), FERRY_ERR_FORMAT);
    CHECK(strstr(ferry_error_last(), "gap.txt:2: empty line"));
    write_str(dir, "sp.txt", "a\nb c\n");
    (void)snprintf(path, sizeof path, "%s/sp.txt", dir);
    CHECK_STATUS(ferry_vocab_load(path, &w), FERRY_ERR_FORMAT);
    CHECK(strstr(ferry_error_last(), "sp.txt:2: word contains whitespace"));
    CHECK_STATUS(ferry_vocab_load("/nonexistent/vocab.txt", &w), FERRY_ERR_IO);
    CHECK(w == NULL);
    (void)snprintf(path, sizeof path, "%s/no/such/dir/vocab.txt", dir);
    ferry_vocab *e;
    CHECK_OK(ferry_vocab_create(&e));
    CHECK_STATUS(ferry_vocab_save(e, path), FERRY_ERR_IO);
    CHECK(strstr(ferry_error_last(), "No such file or directory"));
    ferry_vocab_destroy(e);
    rm_tree(dir);
}

TEST(vocab_add_find) {
    ferry_vocab *v;
    CHECK_OK(ferry_vocab_create(&v));
    /* Enough words to force several rehashes; ids stay dense and stable. */
    char word[32];
    for (int i = 0; i < 50000; i++) {
        int32_t id;
        int n = snprintf(word, sizeof word, "w%d", i);
        CHECK_OK(ferry_vocab_add(v, word, (size_t)n, &id));
        CHECK_EQ(id, i);
    }
    for (int i = 0; i < 50000; i += 7) {
        int n = snprintf(word, sizeof word, "w%d", i);
        CHECK_EQ(ferry_vocab_find(v, word, (size_t)n), i);
        int32_t id;
        CHECK_OK(ferry_vocab_add(v, word, (size_t)n, &id)); /* existing: same id */
        CHECK_EQ(id, i);
    }
    CHECK_EQ(ferry_vocab_size(v), 50000);
    CHECK_EQ(ferry_vocab_find(v, "w50000", 6), -1);
    CHECK_EQ(ferry_vocab_find(v, "w1", 1), -1); /* "w" alone: the length matters */
    CHECK_STATUS(ferry_vocab_add(v, "", 0, NULL), FERRY_ERR_INVALID);
    CHECK_STATUS(ferry_vocab_add(v, "a b", 3, NULL), FERRY_ERR_INVALID);
    CHECK_STATUS(ferry_vocab_add(v, "a\0b", 3, NULL), FERRY_ERR_INVALID);
    CHECK_EQ(ferry_vocab_size(v), 50000);
    ferry_vocab_destroy(v);
    ferry_vocab_destroy(NULL);
    ferry_corpus_destroy(NULL);
}

FERRY_TEST_MAIN(T(ptb) T(wikitext2) T(tokenize_rules) T(unknown_word_without_unk) T(missing_files)
                    T(directory_as_file) T(unreadable_file) T(empty_split) T(binary_file)
                        T(vocab_save_load) T(vocab_add_find))
