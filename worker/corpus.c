/* corpus.c - vocabulary (open-addressing hash table over a pool of words) and the corpus
 * loader: each split file is read whole, checked for NUL bytes, then tokenized in one
 * pass that looks every word up in the table. See corpus.h for the conventions. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/corpus.h"
#include "common/core/log.h" /* FERRY_ASSERT */

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME  0x100000001b3ULL

struct ferry_vocab {
    char *pool; /* every word, NUL-terminated, back to back */
    size_t pool_len;
    size_t pool_cap;
    size_t *off;    /* (size + 1,): word id starts at pool[off[id]]; off[size] = pool_len */
    uint64_t *hash; /* (size,): FNV-1a of each word, kept for rehashing and quick compares */
    int32_t size;
    int32_t cap;   /* capacity of hash[] and off[] (off has cap + 1) */
    int32_t *slot; /* (nslot,): an id, or -1 for an empty slot; nslot is a power of two */
    size_t nslot;
};

struct ferry_corpus {
    ferry_vocab *vocab;
    int32_t *ids[FERRY_SPLIT_COUNT]; /* (n[s],) token ids */
    int64_t n[FERRY_SPLIT_COUNT];
    int64_t nunk[FERRY_SPLIT_COUNT];
};

/* Token separators inside a line; '\n' ends the line. Python's str.split() also splits on
 * Unicode spaces, but neither PTB nor WikiText-2 contains any outside ASCII. */
static bool is_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\v' || ch == '\f';
}

static uint64_t fnv1a(uint64_t h, const char *s, size_t len) {
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= FNV_PRIME;
    }
    return h;
}

/* ---- vocabulary ---------------------------------------------------------------------- */

ferry_status ferry_vocab_create(ferry_vocab **out) {
    ferry_vocab *v = calloc(1, sizeof *v);
    if (v == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "out of memory creating a vocabulary");
    v->nslot = 1024;
    v->slot = malloc(v->nslot * sizeof *v->slot);
    v->off = malloc(sizeof *v->off);
    if (v->slot == NULL || v->off == NULL) {
        ferry_vocab_destroy(v);
        return ferry_errorf(FERRY_ERR_NOMEM, "out of memory creating a vocabulary");
    }
    memset(v->slot, 0xff, v->nslot * sizeof *v->slot); /* all -1 */
    v->off[0] = 0;
    *out = v;
    return FERRY_OK;
}

void ferry_vocab_destroy(ferry_vocab *v) {
    if (v == NULL)
        return;
    free(v->pool);
    free(v->off);
    free(v->hash);
    free(v->slot);
    free(v);
}

static size_t vocab_word_len(const ferry_vocab *v, int32_t id) {
    return v->off[id + 1] - v->off[id] - 1;
}

/* Slot index holding the word, or the empty slot where it would go. */
static size_t vocab_probe(const ferry_vocab *v, const char *word, size_t len, uint64_t h) {
    size_t mask = v->nslot - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        int32_t id = v->slot[i];
        if (id < 0)
            return i;
        if (v->hash[id] == h && vocab_word_len(v, id) == len &&
            memcmp(v->pool + v->off[id], word, len) == 0)
            return i;
    }
}

/* Doubles the slot table and re-inserts every id; keeps the load factor under 1/2. */
static ferry_status vocab_rehash(ferry_vocab *v) {
    size_t nslot = v->nslot * 2;
    int32_t *slot = malloc(nslot * sizeof *slot);
    if (slot == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "out of memory growing the vocabulary");
    memset(slot, 0xff, nslot * sizeof *slot);
    for (int32_t id = 0; id < v->size; id++) {
        size_t i = (size_t)v->hash[id] & (nslot - 1);
        while (slot[i] >= 0)
            i = (i + 1) & (nslot - 1);
        slot[i] = id;
    }
    free(v->slot);
    v->slot = slot;
    v->nslot = nslot;
    return FERRY_OK;
}

/* Makes room for one more word of len bytes (id arrays and pool). */
static ferry_status vocab_reserve(ferry_vocab *v, size_t len) {
    if (v->size == v->cap) {
        if (v->cap == INT32_MAX)
            return ferry_errorf(FERRY_ERR_RANGE, "vocabulary exceeds %d words", INT32_MAX);
        int32_t cap = v->cap < 1024 ? 1024 : (v->cap > INT32_MAX / 2 ? INT32_MAX : v->cap * 2);
        uint64_t *hash = realloc(v->hash, (size_t)cap * sizeof *hash);
        if (hash == NULL)
            return ferry_errorf(FERRY_ERR_NOMEM, "out of memory growing the vocabulary");
        v->hash = hash;
        size_t *off = realloc(v->off, ((size_t)cap + 1) * sizeof *off);
        if (off == NULL)
            return ferry_errorf(FERRY_ERR_NOMEM, "out of memory growing the vocabulary");
        v->off = off;
        v->cap = cap;
    }
    if (len + 1 > v->pool_cap - v->pool_len) {
        size_t cap = v->pool_cap < 65536 ? 65536 : v->pool_cap;
        while (len + 1 > cap - v->pool_len)
            cap *= 2;
        char *pool = realloc(v->pool, cap);
        if (pool == NULL)
            return ferry_errorf(FERRY_ERR_NOMEM, "out of memory growing the vocabulary");
        v->pool = pool;
        v->pool_cap = cap;
    }
    if ((size_t)v->size + 1 > v->nslot / 2)
        return vocab_rehash(v);
    return FERRY_OK;
}

/* Adds a word known to be valid, given its hash; the hot path of tokenizing train. */
static ferry_status vocab_add_hashed(ferry_vocab *v, const char *word, size_t len, uint64_t h,
                                     int32_t *id) {
    size_t i = vocab_probe(v, word, len, h);
    if (v->slot[i] >= 0) {
        *id = v->slot[i];
        return FERRY_OK;
    }
    size_t nslot = v->nslot;
    ferry_status st = vocab_reserve(v, len);
    if (st != FERRY_OK)
        return st;
    if (v->nslot != nslot)
        i = vocab_probe(v, word, len, h); /* the table was rebuilt */
    int32_t nid = v->size++;
    memcpy(v->pool + v->pool_len, word, len);
    v->pool[v->pool_len + len] = '\0';
    v->pool_len += len + 1;
    v->off[nid + 1] = v->pool_len;
    v->hash[nid] = h;
    v->slot[i] = nid;
    *id = nid;
    return FERRY_OK;
}

ferry_status ferry_vocab_add(ferry_vocab *v, const char *word, size_t len, int32_t *id) {
    FERRY_ASSERT(v != NULL && (word != NULL || len == 0));
    if (len == 0)
        return ferry_errorf(FERRY_ERR_INVALID, "a vocabulary word cannot be empty");
    for (size_t i = 0; i < len; i++) {
        if (word[i] == '\0' || word[i] == '\n' || is_space(word[i]))
            return ferry_errorf(FERRY_ERR_INVALID,
                                "a vocabulary word cannot contain whitespace or NUL: '%.*s'",
                                (int)(len > 64 ? 64 : len), word);
    }
    int32_t tmp;
    ferry_status st = vocab_add_hashed(v, word, len, fnv1a(FNV_OFFSET, word, len), &tmp);
    if (st == FERRY_OK && id != NULL)
        *id = tmp;
    return st;
}

int32_t ferry_vocab_find(const ferry_vocab *v, const char *word, size_t len) {
    FERRY_ASSERT(v != NULL && (word != NULL || len == 0));
    return v->slot[vocab_probe(v, word, len, fnv1a(FNV_OFFSET, word, len))];
}

int32_t ferry_vocab_size(const ferry_vocab *v) {
    FERRY_ASSERT(v != NULL);
    return v->size;
}

const char *ferry_vocab_word(const ferry_vocab *v, int32_t id) {
    FERRY_ASSERT(v != NULL && id >= 0 && id < v->size);
    return v->pool + v->off[id];
}

uint64_t ferry_vocab_hash(const ferry_vocab *v) {
    FERRY_ASSERT(v != NULL);
    /* The pool is the saved file with '\0' where the file has '\n'. */
    uint64_t h = FNV_OFFSET;
    for (int32_t id = 0; id < v->size; id++) {
        h = fnv1a(h, v->pool + v->off[id], vocab_word_len(v, id));
        h = fnv1a(h, "\n", 1);
    }
    return h;
}

ferry_status ferry_vocab_save(const ferry_vocab *v, const char *path) {
    FERRY_ASSERT(v != NULL && path != NULL);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 8);
    if (tmp == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "out of memory saving the vocabulary");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL) {
        ferry_status st =
            ferry_errorf(FERRY_ERR_IO, "cannot write vocabulary %s: %s", path, strerror(errno));
        free(tmp);
        return st;
    }
    bool ok = true;
    for (int32_t id = 0; id < v->size && ok; id++) {
        size_t len = vocab_word_len(v, id);
        ok = fwrite(v->pool + v->off[id], 1, len, f) == len && fputc('\n', f) != EOF;
    }
    int err = ok ? 0 : errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        err = errno;
    }
    if (!ok)
        (void)remove(tmp);
    free(tmp);
    if (!ok)
        return ferry_errorf(FERRY_ERR_IO, "cannot write vocabulary %s: %s", path,
                            strerror(err != 0 ? err : EIO));
    return FERRY_OK;
}

/* ---- file reading -------------------------------------------------------------------- */

/* Reads the whole file into *buf (malloc'd, NUL-terminated, caller frees); *len excludes
 * the terminator. Refuses directories and reports the system's reason otherwise. */
static ferry_status read_file(const char *path, char **buf, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ferry_errorf(FERRY_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    int err = fstat(fd, &sb) != 0 ? errno : S_ISDIR(sb.st_mode) ? EISDIR : 0;
    if (err != 0) {
        (void)close(fd);
        return ferry_errorf(FERRY_ERR_IO, "cannot read %s: %s", path, strerror(err));
    }
    /* A regular file is read into one allocation of its size (the final read that sees
     * EOF needs one more growth); pipes and the like grow the buffer as they go. */
    size_t cap = S_ISREG(sb.st_mode) ? (size_t)sb.st_size + 1 : 65536;
    size_t n = 0;
    char *p = malloc(cap);
    ferry_status st =
        p == NULL ? ferry_errorf(FERRY_ERR_NOMEM, "out of memory reading %s", path) : FERRY_OK;
    while (st == FERRY_OK) {
        if (n + 1 == cap) {
            char *q = realloc(p, cap * 2);
            if (q == NULL) {
                st = ferry_errorf(FERRY_ERR_NOMEM, "out of memory reading %s", path);
                break;
            }
            p = q;
            cap *= 2;
        }
        ssize_t r = read(fd, p + n, cap - 1 - n);
        if (r > 0)
            n += (size_t)r;
        else if (r == 0)
            break;
        else if (errno != EINTR)
            st = ferry_errorf(FERRY_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    }
    (void)close(fd);
    if (st != FERRY_OK) {
        free(p);
        return st;
    }
    p[n] = '\0';
    *buf = p;
    *len = n;
    return FERRY_OK;
}

/* Fails if the text holds a NUL byte, naming its line: such a file is not text. */
static ferry_status check_no_nul(const char *path, const char *text, size_t len) {
    const char *z = memchr(text, '\0', len);
    if (z == NULL)
        return FERRY_OK;
    int64_t line = 1;
    for (const char *s = text; (s = memchr(s, '\n', (size_t)(z - s))) != NULL; s++)
        line++;
    return ferry_errorf(FERRY_ERR_FORMAT,
                        "%s:%lld: NUL byte at offset %zu; this looks like a binary file, "
                        "not text",
                        path, (long long)line, (size_t)(z - text));
}

ferry_status ferry_vocab_load(const char *path, ferry_vocab **out) {
    FERRY_ASSERT(path != NULL && out != NULL);
    char *text = NULL;
    size_t len = 0;
    ferry_status st = read_file(path, &text, &len);
    if (st != FERRY_OK)
        return st;
    ferry_vocab *v = NULL;
    if ((st = check_no_nul(path, text, len)) != FERRY_OK ||
        (st = ferry_vocab_create(&v)) != FERRY_OK)
        goto done;
    int64_t line = 1;
    for (size_t i = 0; i < len; line++) {
        const char *eol = memchr(text + i, '\n', len - i);
        size_t wlen = (eol != NULL ? (size_t)(eol - text) : len) - i;
        int32_t before = v->size;
        if ((st = ferry_vocab_add(v, text + i, wlen, NULL)) == FERRY_ERR_INVALID) {
            st = ferry_errorf(FERRY_ERR_FORMAT, "%s:%lld: %s", path, (long long)line,
                              wlen == 0 ? "empty line where a word was expected"
                                        : "word contains whitespace");
            goto done;
        }
        if (st != FERRY_OK)
            goto done;
        if (v->size == before) {
            st = ferry_errorf(FERRY_ERR_FORMAT, "%s:%lld: word '%.*s' appears twice", path,
                              (long long)line, (int)(wlen > 64 ? 64 : wlen), text + i);
            goto done;
        }
        i += wlen + 1;
    }
done:
    free(text);
    if (st != FERRY_OK) {
        ferry_vocab_destroy(v);
        return st;
    }
    *out = v;
    return FERRY_OK;
}

/* ---- corpus -------------------------------------------------------------------------- */

const char *ferry_split_name(ferry_split s) {
    static const char *names[FERRY_SPLIT_COUNT] = {"train", "valid", "test"};
    FERRY_ASSERT(s >= 0 && s < FERRY_SPLIT_COUNT);
    return names[s];
}

/* Growable id array of one split. */
typedef struct id_buf {
    int32_t *ids;
    int64_t n;
    int64_t cap;
} id_buf;

static ferry_status id_push(id_buf *b, int32_t id, const char *path) {
    if (b->n == b->cap) {
        int64_t cap = b->cap < 4096 ? 4096 : b->cap * 2;
        int32_t *ids = realloc(b->ids, (size_t)cap * sizeof *ids);
        if (ids == NULL)
            return ferry_errorf(FERRY_ERR_NOMEM, "out of memory tokenizing %s", path);
        b->ids = ids;
        b->cap = cap;
    }
    b->ids[b->n++] = id;
    return FERRY_OK;
}

/* Maps one word to its id: train adds it; valid/test look it up and fall back to unk
 * (-1 when the vocabulary has none, which is an error naming file, line and word). */
static ferry_status corpus_word(ferry_corpus *c, ferry_split s, const char *w, size_t len,
                                const char *path, int64_t line, int32_t unk, int32_t *id) {
    uint64_t h = fnv1a(FNV_OFFSET, w, len);
    if (s == FERRY_SPLIT_TRAIN)
        return vocab_add_hashed(c->vocab, w, len, h, id);
    *id = c->vocab->slot[vocab_probe(c->vocab, w, len, h)];
    if (*id >= 0)
        return FERRY_OK;
    if (unk < 0)
        return ferry_errorf(FERRY_ERR_FORMAT,
                            "%s:%lld: word '%.*s' does not occur in train.txt and the "
                            "vocabulary has no <unk> to map it to",
                            path, (long long)line, (int)(len > 64 ? 64 : len), w);
    *id = unk;
    c->nunk[s]++;
    return FERRY_OK;
}

/* Tokenizes one split's text into c->ids[s]: the words of each line, then <eos>. Train
 * adds "<eos>" when its first line ends, as data.py does; valid/test find it there. */
static ferry_status corpus_tokenize(ferry_corpus *c, ferry_split s, const char *path,
                                    const char *text, size_t len) {
    id_buf b = {0};
    ferry_status st = FERRY_OK;
    int32_t eos = -1;
    int32_t unk = ferry_vocab_find(c->vocab, "<unk>", 5);
    int64_t line = 1;
    size_t i = 0;
    while (i < len && st == FERRY_OK) {
        while (i < len && is_space(text[i]))
            i++;
        if (i == len)
            break;
        if (text[i] == '\n') {
            if (eos < 0 && (st = ferry_vocab_add(c->vocab, "<eos>", 5, &eos)) != FERRY_OK)
                break;
            st = id_push(&b, eos, path);
            line++;
            i++;
            continue;
        }
        size_t w = i;
        while (i < len && text[i] != '\n' && !is_space(text[i]))
            i++;
        int32_t id;
        if ((st = corpus_word(c, s, text + w, i - w, path, line, unk, &id)) == FERRY_OK)
            st = id_push(&b, id, path);
    }
    /* A last line without '\n' is still a line (Python's file iteration yields it). */
    if (st == FERRY_OK && len > 0 && text[len - 1] != '\n') {
        if (eos < 0)
            st = ferry_vocab_add(c->vocab, "<eos>", 5, &eos);
        if (st == FERRY_OK)
            st = id_push(&b, eos, path);
    }
    if (st == FERRY_OK && b.n == 0)
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s has no tokens", path);
    if (st != FERRY_OK) {
        free(b.ids);
        return st;
    }
    c->ids[s] = b.ids;
    c->n[s] = b.n;
    return FERRY_OK;
}

ferry_status ferry_corpus_load(const char *dir, ferry_corpus **out) {
    FERRY_ASSERT(dir != NULL && out != NULL);
    ferry_corpus *c = calloc(1, sizeof *c);
    ferry_status st = FERRY_OK;
    if (c == NULL || (st = ferry_vocab_create(&c->vocab)) != FERRY_OK) {
        ferry_corpus_destroy(c);
        return ferry_errorf(FERRY_ERR_NOMEM, "out of memory loading corpus %s", dir);
    }
    size_t dlen = strlen(dir);
    while (dlen > 1 && dir[dlen - 1] == '/')
        dlen--; /* "data/ptb/" names the same files as "data/ptb" */
    for (int s = 0; s < FERRY_SPLIT_COUNT; s++) {
        char path[4096];
        if (snprintf(path, sizeof path, "%.*s/%s.txt", (int)dlen, dir,
                     ferry_split_name((ferry_split)s)) >= (int)sizeof path) {
            st = ferry_errorf(FERRY_ERR_INVALID, "data directory path too long: %s", dir);
            break;
        }
        char *text = NULL;
        size_t len = 0;
        if ((st = read_file(path, &text, &len)) != FERRY_OK)
            break;
        st = check_no_nul(path, text, len);
        if (st == FERRY_OK)
            st = corpus_tokenize(c, (ferry_split)s, path, text, len);
        free(text);
        if (st != FERRY_OK)
            break;
    }
    if (st != FERRY_OK) {
        ferry_corpus_destroy(c);
        return st;
    }
    *out = c;
    return FERRY_OK;
}

void ferry_corpus_destroy(ferry_corpus *c) {
    if (c == NULL)
        return;
    for (int s = 0; s < FERRY_SPLIT_COUNT; s++)
        free(c->ids[s]);
    ferry_vocab_destroy(c->vocab);
    free(c);
}

const ferry_vocab *ferry_corpus_vocab(const ferry_corpus *c) {
    FERRY_ASSERT(c != NULL);
    return c->vocab;
}

const int32_t *ferry_corpus_ids(const ferry_corpus *c, ferry_split s, int64_t *n) {
    FERRY_ASSERT(c != NULL && s >= 0 && s < FERRY_SPLIT_COUNT);
    if (n != NULL)
        *n = c->n[s];
    return c->ids[s];
}

int64_t ferry_corpus_unk_count(const ferry_corpus *c, ferry_split s) {
    FERRY_ASSERT(c != NULL && s >= 0 && s < FERRY_SPLIT_COUNT);
    return c->nunk[s];
}
