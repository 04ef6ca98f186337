/* test_ps_install.c - what ferry-ps takes from a replica's checkpoint that a client
 * sends (Job install, a recover that restores it): the bytes are the caller's, so a
 * file is taken only when its META and every module in it belong to the expected
 * identity (ferry__ps_checkpoint_check_owner), and a restore of a job's checkpoint
 * refuses, before changing anything, a file that names another identity's module
 * (ferry__ps_checkpoint_read with `only`); a job's modules sent to move them between
 * servers (Job reshard ADOPT) are taken only when the file is of the step asked, its
 * owner and every module's is the job's, and every module is the job's by name
 * ("<job>/x", not job "<job>/y"'s "<job>/y/x"), all before anything changes. The files
 * are written with the ckfile writer in ferry-ps's format, as a client could craft
 * them. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/core/ckfile.h"
#include "server/ps-impl.h"

static char dir[] = "/tmp/ferry-install.XXXXXX";
static const char *craft_module = "j/emb"; /* the name of every module craft writes */

static void remove_dir(void) {
    char cmd[300];
    (void)snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    (void)system(cmd);
}

/* A FERRYPS3 file at dir/name: META (step 5, owner meta) and one module section per
 * owner in mods, each a header (name, owner) and no more: the owner checks come
 * first, so a refusal must come before the rest of a module is read. */
static void craft(char *path, size_t cap, const char *name, const char *meta, const char **mods,
                  int n) {
    static int made;
    if (!made) {
        CHECK(mkdtemp(dir) != NULL);
        atexit(remove_dir);
        made = 1;
    }
    (void)snprintf(path, cap, "%s/%s", dir, name);
    ferry_ckw *w = NULL;
    CHECK_EQ(ferry_ckw_open(path, "FERRYPS3", 3, (uint32_t)n + 1, &w), FERRY_OK);
    CHECK_EQ(ferry_ckw_begin(w, FERRY_CK_TAG("META"), 8 + 4 + 4 + strlen(meta)), FERRY_OK);
    ferry_ckw_u64(w, 5);
    ferry_ckw_u32(w, (uint32_t)n);
    ferry_ckw_u32(w, (uint32_t)strlen(meta));
    ferry_ckw_bytes(w, meta, strlen(meta));
    CHECK_EQ(ferry_ckw_end(w), FERRY_OK);
    for (int i = 0; i < n; i++) {
        const char *mod = craft_module;
        CHECK_EQ(ferry_ckw_begin(w, FERRY_CK_TAG("MODL"), 8 + strlen(mod) + strlen(mods[i])),
                 FERRY_OK);
        ferry_ckw_u32(w, (uint32_t)strlen(mod));
        ferry_ckw_bytes(w, mod, strlen(mod));
        ferry_ckw_u32(w, (uint32_t)strlen(mods[i]));
        ferry_ckw_bytes(w, mods[i], strlen(mods[i]));
        CHECK_EQ(ferry_ckw_end(w), FERRY_OK);
    }
    CHECK_EQ(ferry_ckw_commit(w), FERRY_OK);
}

TEST(owner_of_every_module_checked) {
    char path[512];
    uint64_t step = 0;
    const char *mine[] = {"bob", "bob"}, *mixed[] = {"bob", "alice"};
    craft(path, sizeof path, "mine.ckpt", "bob", mine, 2);
    CHECK_EQ(ferry__ps_checkpoint_check_owner(path, "bob", &step), FERRY_OK);
    CHECK_EQ(step, 5);
    CHECK_EQ(ferry__ps_checkpoint_check_owner(path, "alice", &step), FERRY_ERR_DENIED);
    CHECK(strstr(ferry_error_last(), "a checkpoint of 'bob', not of 'alice'") != NULL);
    /* bob's META over alice's module: the attack the check is for. */
    craft(path, sizeof path, "mixed.ckpt", "bob", mixed, 2);
    CHECK_EQ(ferry__ps_checkpoint_check_owner(path, "bob", &step), FERRY_ERR_DENIED);
    CHECK(strstr(ferry_error_last(), "belongs to 'alice', not to 'bob'") != NULL);
}

TEST(restore_refuses_before_changing_anything) {
    char path[512];
    const char *mixed[] = {"alice"};
    craft(path, sizeof path, "restore.ckpt", "bob", mixed, 1);
    /* No registry is touched: the refusal comes first (a NULL registry would crash). */
    CHECK_EQ(ferry__ps_checkpoint_read(NULL, NULL, path, "bob", NULL), FERRY_ERR_DENIED);
    CHECK(strstr(ferry_error_last(), "belongs to 'alice', not to 'bob'") != NULL);
}

/* adopt of crafted bytes: each refusal before the registry (NULL: a crash) is touched */
static ferry_status adopt(const char *file, const char *owner, const char *prefix, uint64_t step,
                          int *changed) {
    FILE *f = fopen(file, "rb");
    CHECK(f != NULL);
    static uint8_t buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    uint32_t mods = 0;
    *changed = -1;
    return ferry__ps_checkpoint_adopt(NULL, NULL, dir, buf, n, owner, prefix, step, &mods, changed);
}

TEST(adopt_refuses_before_changing_anything) {
    char path[512];
    int changed = 0;
    const char *bob[] = {"bob"}, *alice[] = {"alice"};
    craft(path, sizeof path, "a1.ckpt", "bob", alice, 1); /* another identity's module */
    CHECK_EQ(adopt(path, "bob", "j/", 5, &changed), FERRY_ERR_DENIED);
    CHECK(strstr(ferry_error_last(), "belongs to 'alice', not to 'bob'") != NULL);
    CHECK_EQ(changed, 0);
    craft(path, sizeof path, "a2.ckpt", "bob", bob, 1); /* another job's module */
    CHECK_EQ(adopt(path, "bob", "k/", 5, &changed), FERRY_ERR_DENIED);
    CHECK(strstr(ferry_error_last(), "module 'j/emb' is not one of the job's (k/...)") != NULL);
    CHECK_EQ(changed, 0);
    CHECK_EQ(adopt(path, "bob", "j/", 6, &changed), FERRY_ERR_FORMAT); /* another step */
    CHECK(strstr(ferry_error_last(), "of step 5, not 6") != NULL);
    CHECK_EQ(changed, 0);
    CHECK_EQ(adopt(path, "alice", "j/", 5, &changed), FERRY_ERR_DENIED); /* another owner */
    CHECK_EQ(changed, 0);
    craft_module = "j/x/emb"; /* job "j/x"'s module, sent as job "j"'s */
    craft(path, sizeof path, "a3.ckpt", "bob", bob, 1);
    craft_module = "j/emb";
    CHECK_EQ(adopt(path, "bob", "j/", 5, &changed), FERRY_ERR_DENIED);
    CHECK(strstr(ferry_error_last(), "'j/x/emb' is not one of the job's") != NULL);
    CHECK_EQ(changed, 0);
    /* a torn file */
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    CHECK(fseek(f, -3, SEEK_END) == 0 && fputc('x', f) != EOF);
    fclose(f);
    CHECK(adopt(path, "bob", "j/", 5, &changed) != FERRY_OK);
    CHECK_EQ(changed, 0);
}

FERRY_TEST_MAIN(T(owner_of_every_module_checked) T(restore_refuses_before_changing_anything)
                    T(adopt_refuses_before_changing_anything))
