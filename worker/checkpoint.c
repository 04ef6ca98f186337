/* checkpoint.c - see checkpoint.h. Layout (little-endian):
 *   "FERRYCK1" | u32 version | i64 V, E, H | i32 L | u64 vocab hash |
 *   i32 epoch | i64 step | f32 lr | i64 numel | f32 params[numel] | optimizer state
 * The parameter block is copied through the host so any backend can save. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/checkpoint.h"
#include "common/core/log.h"

#define CK_MAGIC "FERRYCK1"
#define CK_VERSION 1u

typedef struct ck_header {
    char magic[8];
    uint32_t version;
    int32_t L;
    int64_t V, E, H;
    uint64_t vocab_hash;
    int32_t epoch;
    float lr;
    int64_t step;
    int64_t numel;
} ck_header;

ferry_status ferry_checkpoint_save(const char *path, const ferry_lm *lm, const ferry_optim *opt,
                                   uint64_t vocab_hash, int epoch, int64_t step, float lr) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return ferry_errorf(FERRY_ERR_INVALID, "checkpoint path too long");
    ck_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CK_MAGIC, 8);
    h.version = CK_VERSION;
    h.V = lm->cfg.V;
    h.E = lm->cfg.E;
    h.H = lm->cfg.H;
    h.L = lm->cfg.L;
    h.vocab_hash = vocab_hash;
    h.epoch = epoch;
    h.step = step;
    h.lr = lr;
    h.numel = lm->P.numel;
    float *host = malloc((size_t)h.numel * sizeof(float));
    if (host == NULL)
        return FERRY_ERR_NOMEM;
    ferry_status st = ferry_backend_copy(lm->be, host, lm->P.data, (size_t)h.numel * 4,
                                         FERRY_COPY_DEVICE_TO_HOST);
    FILE *f = st == FERRY_OK ? fopen(tmp, "wb") : NULL;
    if (st == FERRY_OK && f == NULL)
        st = ferry_errorf(FERRY_ERR_IO, "cannot write checkpoint %s: %s", tmp, strerror(errno));
    if (st == FERRY_OK && (fwrite(&h, sizeof h, 1, f) != 1 ||
                           fwrite(host, sizeof(float), (size_t)h.numel, f) != (size_t)h.numel))
        st = ferry_errorf(FERRY_ERR_IO, "cannot write checkpoint %s: %s", tmp, strerror(errno));
    if (st == FERRY_OK)
        st = ferry_optim_state_save(opt, f);
    if (f != NULL) {
        if (fflush(f) != 0 || fsync(fileno(f)) != 0)
            st = st ? st : ferry_errorf(FERRY_ERR_IO, "cannot flush %s: %s", tmp, strerror(errno));
        if (fclose(f) != 0 && st == FERRY_OK)
            st = ferry_errorf(FERRY_ERR_IO, "cannot close %s: %s", tmp, strerror(errno));
    }
    free(host);
    if (st == FERRY_OK && rename(tmp, path) != 0)
        st = ferry_errorf(FERRY_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st != FERRY_OK)
        (void)remove(tmp);
    else
        FERRY_LOG_INFO("checkpoint written: %s (epoch %d, step %lld)", path, epoch,
                       (long long)step);
    return st;
}

static ferry_status check_header(const char *path, const ck_header *h, const ferry_lm *lm,
                                 uint64_t vocab_hash) {
    if (memcmp(h->magic, CK_MAGIC, 8) != 0)
        return ferry_errorf(FERRY_ERR_FORMAT, "%s is not a ferry checkpoint", path);
    if (h->version != CK_VERSION)
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: checkpoint version %u, this build reads %u",
                            path, h->version, CK_VERSION);
    int same_shape =
        h->V == lm->cfg.V && h->E == lm->cfg.E && h->H == lm->cfg.H && h->L == lm->cfg.L;
    if (same_shape && h->numel != lm->P.numel)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "%s was written by a %s trainer; this one is %s (the embedding and "
                            "decoder live on ferry-ps only in distributed runs)",
                            path, ferry_lm_is_remote(lm) ? "local" : "distributed",
                            ferry_lm_is_remote(lm) ? "distributed" : "local");
    if (!same_shape)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "%s holds a model of shape V=%lld E=%lld H=%lld L=%d, this model is "
                            "V=%lld E=%lld H=%lld L=%d",
                            path, (long long)h->V, (long long)h->E, (long long)h->H, h->L,
                            (long long)lm->cfg.V, (long long)lm->cfg.E, (long long)lm->cfg.H,
                            lm->cfg.L);
    if (h->vocab_hash != vocab_hash)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "%s was trained on another vocabulary (hash %016llx, corpus %016llx)",
                            path, (unsigned long long)h->vocab_hash,
                            (unsigned long long)vocab_hash);
    return FERRY_OK;
}

ferry_status ferry_checkpoint_load(const char *path, ferry_lm *lm, ferry_optim *opt,
                                   uint64_t vocab_hash, ferry_checkpoint_info *info) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return ferry_errorf(FERRY_ERR_IO, "cannot open checkpoint %s: %s", path,
                            strerror(errno));
    ck_header h;
    ferry_status st = FERRY_OK;
    float *host = NULL;
    if (fread(&h, sizeof h, 1, f) != 1)
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s is truncated or not a ferry checkpoint", path);
    if (st == FERRY_OK)
        st = check_header(path, &h, lm, vocab_hash);
    if (st == FERRY_OK && (host = malloc((size_t)h.numel * sizeof(float))) == NULL)
        st = FERRY_ERR_NOMEM;
    if (st == FERRY_OK && fread(host, sizeof(float), (size_t)h.numel, f) != (size_t)h.numel)
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s is truncated (parameters)", path);
    if (st == FERRY_OK)
        st = ferry_optim_state_load(opt, f);
    if (st == FERRY_OK)
        st = ferry_backend_copy(lm->be, lm->P.data, host, (size_t)h.numel * 4,
                                FERRY_COPY_HOST_TO_DEVICE);
    free(host);
    (void)fclose(f);
    if (st == FERRY_OK) {
        info->epoch = h.epoch;
        info->step = h.step;
        info->lr = h.lr;
    }
    return st;
}
