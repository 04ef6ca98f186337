/* ferry_ck_sections.c - splits a checkpoint (ferry-trainer's FERRYCK2, format 2, or
 * ferry-ps's FERRYPS3, format 3; verified whole first: magic, format, lengths, CRCs)
 * into one file per section, DIR/NN-TAG (00-CONF, 03-PARM, ...), for the shell tests:
 * two runs whose configurations differ only in paths compare their parameters,
 * optimizer state and carried state bit for bit with cmp.
 *     ferry_ck_sections FILE DIR */
#include <stdio.h>
#include <string.h>

#include "common/core/ckfile.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: ferry_ck_sections FILE DIR\n");
        return 2;
    }
    static const struct {
        const char *magic;
        uint32_t format;
    } kinds[] = {{"FERRYCK2", 2}, {"FERRYPS3", 3}};
    int k = -1;
    for (int i = 0; i < 2 && k < 0; i++)
        k = ferry_ck_has_magic(argv[1], kinds[i].magic) ? i : -1;
    if (k < 0) {
        fprintf(stderr, "ferry_ck_sections: %s is not a FERRYCK2 or FERRYPS3 file\n", argv[1]);
        return 1;
    }
    ferry_ckr ck;
    if (ferry_ckr_read(argv[1], kinds[k].magic, kinds[k].format, &ck) != FERRY_OK) {
        fprintf(stderr, "ferry_ck_sections: %s\n", ferry_error_last());
        return 1;
    }
    int rc = 0;
    for (uint32_t i = 0; i < ck.n && rc == 0; i++) {
        char tag[5], path[2048];
        ferry_ck_tag_name(ck.sec[i].tag, tag);
        (void)snprintf(path, sizeof path, "%s/%02u-%s", argv[2], i, tag);
        FILE *f = fopen(path, "wb");
        if (f == NULL || fwrite(ck.sec[i].p, 1, ck.sec[i].len, f) != ck.sec[i].len) {
            fprintf(stderr, "ferry_ck_sections: cannot write %s\n", path);
            rc = 1;
        }
        if (f != NULL && fclose(f) != 0)
            rc = 1;
    }
    ferry_ckr_free(&ck);
    return rc;
}
