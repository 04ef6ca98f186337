/* ckfile.h - checkpoint files that are committed whole or not at all, and that say
 * exactly what is wrong when they are damaged. Both ferry-ps's shard checkpoints
 * and ferry-trainer's are written with it.
 *
 * Layout, every integer little-endian:
 *   magic[8] | u32 format | u32 section count
 *   per section: u32 tag | u64 length | payload[length] | u32 CRC-32 of the payload
 *   (nothing after the last section)
 * A file is written to a fresh temporary name in the target's directory (mkostemp,
 * O_EXCL), fsynced, renamed over the target (a symlink there is replaced, never
 * followed) and the directory is fsynced, so a crash leaves the old file or the new
 * one. A reader loads the whole file and checks magic, format, every length and
 * every CRC before anything is used: truncation, a flipped bit, appended bytes or
 * a missing section are each an error naming the file and the section.
 *
 *     ferry_ckw *w;
 *     ferry_ckw_open(path, "FERRYCK2", 2, 2, &w);
 *     ferry_ckw_section(w, FERRY_CK_TAG("CONF"), text, strlen(text));
 *     ferry_ckw_begin(w, FERRY_CK_TAG("PARM"), n * 4); ferry_ckw_f32s(w, p, n); ferry_ckw_end(w);
 *     ferry_ckw_commit(w);                      // or ferry_ckw_abort(w)
 *
 *     ferry_ckr r;
 *     ferry_ckr_read(path, "FERRYCK2", 2, &r);   // verified
 *     ferry_ckcur c = ferry_ckr_section(&r, FERRY_CK_TAG("PARM"));
 *     ferry_ckcur_f32s(&c, dst, n);  if (c.bad) ...;  ferry_ckr_free(&r);
 */
#ifndef FERRY_CKFILE_H
#define FERRY_CKFILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry/status.h"

#define FERRY_CK_TAG(s)                                                                            \
    ((uint32_t)(uint8_t)(s)[0] | (uint32_t)(uint8_t)(s)[1] << 8 | (uint32_t)(uint8_t)(s)[2] << 16 | \
     (uint32_t)(uint8_t)(s)[3] << 24)

/* ---- writing ---- */

typedef struct ferry_ckw ferry_ckw;

/* Starts path's replacement: a temporary file beside it. nsections is how many
 * sections will follow (the reader insists on exactly that many). */
ferry_status ferry_ckw_open(const char *path, const char magic[8], uint32_t format,
                            uint32_t nsections, ferry_ckw **out);
/* A section of `len` bytes, written by ferry_ckw_bytes / _u32 / _u64 / _f32s /
 * _f64 calls totalling exactly len, then ferry_ckw_end. */
ferry_status ferry_ckw_begin(ferry_ckw *w, uint32_t tag, uint64_t len);
void ferry_ckw_bytes(ferry_ckw *w, const void *p, size_t n);
void ferry_ckw_u32(ferry_ckw *w, uint32_t v);
void ferry_ckw_u64(ferry_ckw *w, uint64_t v);
void ferry_ckw_f64(ferry_ckw *w, double v);
void ferry_ckw_f32s(ferry_ckw *w, const float *p, size_t n);
ferry_status ferry_ckw_end(ferry_ckw *w);
/* A whole section from memory. */
ferry_status ferry_ckw_section(ferry_ckw *w, uint32_t tag, const void *p, uint64_t len);
/* fsync, rename over the target, fsync the directory; frees w. On an error the
 * temporary file is removed and the target is untouched. */
ferry_status ferry_ckw_commit(ferry_ckw *w);
void ferry_ckw_abort(ferry_ckw *w);
/* Bytes written so far. */
uint64_t ferry_ckw_size(const ferry_ckw *w);

/* ---- reading ---- */

typedef struct ferry_cksec {
    uint32_t tag;
    uint64_t len;
    const uint8_t *p;
} ferry_cksec;

typedef struct ferry_ckr {
    char path[1024];
    uint8_t *data;
    size_t size;
    uint32_t format;
    uint32_t n;
    ferry_cksec *sec;
} ferry_ckr;

/* Reads and verifies path. FERRY_ERR_IO when it cannot be read (ENOENT included),
 * FERRY_ERR_FORMAT for anything damaged or foreign, with a message naming the file
 * and what is wrong ("section 3 (PARM): CRC mismatch", "truncated in section 2",
 * "100 bytes after the last section", "format 1, this build reads 2"). */
ferry_status ferry_ckr_read(const char *path, const char magic[8], uint32_t format, ferry_ckr *r);
/* Verifies path as ferry_ckr_read does (same checks, same messages) while reading it
 * in 1 MiB pieces, so that checking a file of any size costs 1 MiB of memory. The
 * first section tagged keep_tag is copied into keep (at most keep_cap bytes; longer:
 * FERRY_ERR_FORMAT), its length into *keep_len; *nsections receives the count. */
ferry_status ferry_ck_verify(const char *path, const char magic[8], uint32_t format,
                             uint32_t keep_tag, uint8_t *keep, size_t keep_cap, size_t *keep_len,
                             uint32_t *nsections);
/* 1 when path starts with magic (a cheap test before a full read). */
int ferry_ck_has_magic(const char *path, const char magic[8]);

/* The steps of the checkpoint files of one set in dir: step_of returns 1 and sets
 * *step for a name of the set (it may look at the file too), 0 for any other entry.
 * *steps (malloc'd, ascending; free it) and *n receive them. FERRY_ERR_IO when dir
 * cannot be read (nothing listed); FERRY_ERR_NOMEM keeps what was listed so far. The
 * one directory scan under ferry-ps's job checkpoints and ferry-trainer's parts. */
ferry_status ferry_ck_list_steps(const char *dir,
                                 int (*step_of)(const char *name, void *user, uint64_t *step),
                                 void *user, uint64_t **steps, size_t *n);

/* Removes what writes of `magic` files in dir left when a kill interrupted them: the
 * temporary files ferry_ckw_open makes, ".<name>.XXXXXX" (mkostemp's six letters and
 * digits), whose <name> `match` accepts (NULL: any), that are regular files of this
 * user (not symlinks) and start with the magic or hold a prefix of it (a write killed
 * before its first flush leaves an empty file). Never call it while this process may
 * be writing such a file there. Returns how many it removed, their bytes in *bytes
 * (may be NULL); -1 when dir cannot be read. */
int ferry_ck_sweep_temps(const char *dir, const char magic[8],
                         int (*match)(const char *name, size_t len, const void *user),
                         const void *user, uint64_t *bytes);
void ferry_ckr_free(ferry_ckr *r);

/* A bounded reader over one section; `bad` is set (and stays set) when a read runs
 * past the end, so callers check once at the end. */
typedef struct ferry_ckcur {
    const uint8_t *p, *end;
    int bad;
} ferry_ckcur;

/* The first section with tag; an empty, bad cursor when there is none. */
ferry_ckcur ferry_ckr_section(const ferry_ckr *r, uint32_t tag);
ferry_ckcur ferry_ckcur_of(const ferry_cksec *s);
uint32_t ferry_ckcur_u32(ferry_ckcur *c);
uint64_t ferry_ckcur_u64(ferry_ckcur *c);
double ferry_ckcur_f64(ferry_ckcur *c);
void ferry_ckcur_f32s(ferry_ckcur *c, float *dst, size_t n);
/* n bytes in place (NULL and bad when fewer remain). */
const void *ferry_ckcur_bytes(ferry_ckcur *c, size_t n);
size_t ferry_ckcur_left(const ferry_ckcur *c);

/* A section's name for messages: "PARM". */
void ferry_ck_tag_name(uint32_t tag, char out[5]);

#endif /* FERRY_CKFILE_H */
