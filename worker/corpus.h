/* corpus.h - the word-level language-model corpus: a vocabulary (word <-> id) and the
 * three splits of a data directory as int32 id streams.
 * Tokenization follows pytorch/examples word_language_model data.py: the tokens of a
 * line are its whitespace-separated words followed by one "<eos>", and ids are given in
 * first-seen order over train.txt. Valid/test words that train never showed map to
 * "<unk>" when the vocabulary has it (PTB and WikiText-2 do), otherwise loading fails.
 *
 *     ferry_corpus *c;
 *     ferry_status st = ferry_corpus_load("data/ptb", &c);
 *     if (st != FERRY_OK) { fprintf(stderr, "%s\n", ferry_error_last()); return 1; }
 *     int64_t n;
 *     const int32_t *train = ferry_corpus_ids(c, FERRY_SPLIT_TRAIN, &n);   (n,) ids
 *     int32_t V = ferry_vocab_size(ferry_corpus_vocab(c));
 *     ...
 *     ferry_corpus_destroy(c);
 */
#ifndef FERRY_WORKER_CORPUS_H
#define FERRY_WORKER_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/status.h"

/* ---- vocabulary ---------------------------------------------------------------------- */

typedef struct ferry_vocab ferry_vocab; /* opaque: words with dense ids 0..size-1 */

/* Creates an empty vocabulary in *out; release it with ferry_vocab_destroy().
 * Returns FERRY_ERR_NOMEM; *out is unchanged on failure. */
ferry_status ferry_vocab_create(ferry_vocab **out);
void ferry_vocab_destroy(ferry_vocab *v); /* NULL is a no-op */

/* Returns the id of the len bytes at word, adding the word with the next id if it is
 * new; stores the id in *id (id may be NULL). A word is a non-empty byte string without
 * whitespace or NUL (FERRY_ERR_INVALID otherwise, so that a saved vocabulary always
 * reads back). FERRY_ERR_RANGE past INT32_MAX words, FERRY_ERR_NOMEM. */
ferry_status ferry_vocab_add(ferry_vocab *v, const char *word, size_t len, int32_t *id);

/* The id of the len bytes at word, or -1 if the vocabulary does not hold it. */
int32_t ferry_vocab_find(const ferry_vocab *v, const char *word, size_t len);

/* Number of words (V). */
int32_t ferry_vocab_size(const ferry_vocab *v);

/* The NUL-terminated word with this id (0 <= id < size, asserted). The pointer stays
 * valid until the next ferry_vocab_add() or ferry_vocab_destroy(). */
const char *ferry_vocab_word(const ferry_vocab *v, int32_t id);

/* FNV-1a (64-bit) over every word followed by '\n', in id order: exactly the hash of
 * the file ferry_vocab_save() writes. Two vocabularies hash equal iff (up to FNV
 * collisions) they map the same words to the same ids, so a checkpoint can store it and
 * refuse to resume on a different corpus. O(total word bytes). */
uint64_t ferry_vocab_hash(const ferry_vocab *v);

/* Writes one word per line in id order to path, through a temporary file renamed into
 * place, so a reader never sees half a vocabulary. FERRY_ERR_IO with the path and the
 * system's reason if the file cannot be written. */
ferry_status ferry_vocab_save(const ferry_vocab *v, const char *path);

/* Reads a file written by ferry_vocab_save() into a new vocabulary in *out (line i is
 * id i; a final line without '\n' is accepted). FERRY_ERR_IO if it cannot be read;
 * FERRY_ERR_FORMAT, naming the line, for an empty line, a NUL byte, whitespace inside a
 * word or a repeated word; FERRY_ERR_NOMEM. *out is unchanged on failure. */
ferry_status ferry_vocab_load(const char *path, ferry_vocab **out);

/* ---- corpus -------------------------------------------------------------------------- */

typedef enum ferry_split {
    FERRY_SPLIT_TRAIN = 0,
    FERRY_SPLIT_VALID = 1,
    FERRY_SPLIT_TEST = 2,
    FERRY_SPLIT_COUNT = 3,
} ferry_split;

/* "train", "valid" or "test" (the split's file name without ".txt"). */
const char *ferry_split_name(ferry_split s);

typedef struct ferry_corpus ferry_corpus; /* opaque: vocabulary + three id streams */

/* Reads dir/train.txt, dir/valid.txt and dir/test.txt, builds the vocabulary over train
 * and stores the corpus in *out; release it with ferry_corpus_destroy(). Lines end with
 * '\n' (a last line without one still counts); words are separated by spaces, tabs,
 * '\r', '\v' or '\f'. Every failure is one ferry_errorf line naming the file:
 *   FERRY_ERR_IO      cannot open or read a file (missing, unreadable, a directory);
 *   FERRY_ERR_FORMAT  a NUL byte (a binary file), a split with no tokens at all, or a
 *                     valid/test word unseen in train while the vocabulary has no <unk>
 *                     (the message gives file, line and word);
 *   FERRY_ERR_RANGE   more than INT32_MAX distinct words;
 *   FERRY_ERR_NOMEM.
 * *out is unchanged on failure. Loads PTB (5 MB) in a few tens of milliseconds. */
ferry_status ferry_corpus_load(const char *dir, ferry_corpus **out);
void ferry_corpus_destroy(ferry_corpus *c); /* NULL is a no-op */

/* The vocabulary built over train (owned by the corpus). */
const ferry_vocab *ferry_corpus_vocab(const ferry_corpus *c);

/* The split's token ids, (n,) int32 in [0, V), owned by the corpus; stores the token
 * count in *n (n may be NULL). */
const int32_t *ferry_corpus_ids(const ferry_corpus *c, ferry_split s, int64_t *n);

/* How many tokens of the split were unseen in train and became <unk> (0 for train). */
int64_t ferry_corpus_unk_count(const ferry_corpus *c, ferry_split s);

#endif /* FERRY_WORKER_CORPUS_H */
