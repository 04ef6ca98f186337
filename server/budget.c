/* budget.c - the memory budgets of a ferry-ps. Every allocation a request can cause
 * is bounded by one of them: a module's weights and optimizer state (per module and
 * for all modules), what a context keeps between calls (per context and for all
 * contexts, charged before allocating: ctx-table.c), the scratch one call may use,
 * and the reply (the rpc layer refuses a reply over the message limit before it is
 * built). A refusal is FERRY_ERR_RESOURCE, sent as RESOURCE_EXHAUSTED, and names the
 * budget and the flag that sets it. */
#include <malloc.h>
#include <stdio.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define FERRY_PS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FERRY_PS_ASAN 1
#endif
#endif
#ifdef FERRY_PS_ASAN
/* The sanitizer runtime's (sanitizer/allocator_interface.h, which only clang ships). */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

#include "server/ps-impl.h"

#define MIB (1024.0 * 1024.0)

static int64_t physical_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return (int64_t)8 << 30; /* unknown: assume a small 8 GiB machine */
    return (int64_t)pages * (int64_t)page;
}

static int64_t pick(size_t given, int64_t dflt) {
    if (given == 0)
        return dflt;
    return given > (size_t)INT64_MAX ? INT64_MAX : (int64_t)given;
}

void ferry__ps_limits_resolve(const ferry_ps_config *cfg, ferry__ps_limits *out) {
    int64_t phys = physical_bytes();
    out->module_bytes = pick(cfg->max_module_bytes, (int64_t)2 << 30);
    out->model_bytes = pick(cfg->max_model_bytes, phys / 2);
    out->context_bytes = pick(cfg->max_context_bytes, (int64_t)1 << 30);
    out->contexts_bytes = pick(cfg->max_contexts_bytes, phys / 4);
    out->contexts = cfg->max_contexts > 0 ? cfg->max_contexts : 16384;
    /* One identity's share: half of the contexts' budgets by default (another identity
     * can always train), the whole of the modules' unless set. */
    out->id_contexts = cfg->max_contexts_per_identity > 0 ? cfg->max_contexts_per_identity
                                                          : (out->contexts + 1) / 2;
    out->id_contexts_bytes = pick(cfg->max_contexts_bytes_per_identity, out->contexts_bytes / 2);
    out->id_modules = cfg->max_modules_per_identity > 0 ? cfg->max_modules_per_identity : 65536;
    out->id_model_bytes = pick(cfg->max_model_bytes_per_identity, out->model_bytes);
    out->jobs = cfg->max_jobs > 0 ? cfg->max_jobs : 1024;
    out->id_jobs = cfg->max_jobs_per_identity > 0 ? cfg->max_jobs_per_identity : 64;
}

ferry_status ferry__ps_over_budget(const char *what, int64_t need, const char *budget,
                                   int64_t limit, int64_t used, const char *flag) {
    if (used > 0)
        return ferry_errorf(
            FERRY_ERR_RESOURCE, "%s needs %.1f MiB, over %s (%.1f MiB, %.1f MiB in use; %s)", what,
            (double)need / MIB, budget, (double)limit / MIB, (double)used / MIB, flag);
    return ferry_errorf(FERRY_ERR_RESOURCE, "%s needs %.1f MiB, over %s (%.1f MiB; %s)", what,
                        (double)need / MIB, budget, (double)limit / MIB, flag);
}

ferry_status ferry__ps_scratch_check(const ferry__ps_module *m, int64_t bytes, const char *what) {
    if (bytes >= 0 && bytes <= m->lim->context_bytes)
        return FERRY_OK;
    char w[FERRY_RPC_NAME_MAX + 96];
    (void)snprintf(w, sizeof w, "%s '%s': %s", ferry__ps_kind_name(m->kind), m->name, what);
    return ferry__ps_over_budget(w, bytes < 0 ? INT64_MAX : bytes, "the per-call budget",
                                 m->lim->context_bytes, 0, "--max-context-mb");
}

int64_t ferry__ps_heap_bytes(void) {
#if defined(FERRY_PS_ASAN)
    return (int64_t)__sanitizer_get_current_allocated_bytes(); /* ASan's own allocator */
#elif defined(__GLIBC__)
    struct mallinfo2 mi = mallinfo2(); /* every arena; mmapped blocks too */
    return (int64_t)(mi.uordblks + mi.hblkhd);
#else
    return -1;
#endif
}

int64_t ferry__ps_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL)
        return 0;
    long long size = 0, resident = 0;
    int n = fscanf(f, "%lld %lld", &size, &resident);
    (void)fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return n == 2 && page > 0 ? (int64_t)resident * page : 0;
}
