/* main.c - ferry-ps: parses flags into a ferry_ps_config, then create, run (until
 * SIGINT, SIGTERM or a Shutdown call has drained the calls in flight), destroy.
 * Exit codes: 0 clean shutdown, 1 the server failed, 2 bad command line. */
#include <stdio.h>
#include <string.h>

#ifdef FERRY_WITH_CUDA
#include "ferry/cuda.h"
#endif
#include "common/backend/cpu/cpu.h"
#include "common/rpc/rpc.h"
#include "common/core/flags.h"
#include "common/core/log.h"
#include "server/ps.h"

/* Writes the bound port for scripts that started the server on port 0. */
static int write_port_file(const char *path, int port) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return -1;
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return -1;
    int ok = fprintf(f, "%d\n", port) > 0;
    ok = fclose(f) == 0 && ok;
    /* The rename makes the file appear complete or not at all. */
    return ok && rename(tmp, path) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    ferry_cpu_ensure_blas_kernels(argv);
#ifdef FERRY_WITH_CUDA
    ferry_cuda_register(); /* --device cuda[:N] */
#endif
    ferry_log_init("ferry-ps");
    /* Large RPC payloads: keep freed pages instead of faulting them in again. */
    (void)ferry_rpc_tune_malloc(0);
    ferry_ps_config cfg;
    ferry_ps_config_default(&cfg);
    cfg.handle_signals = 1;
    int log_level = FERRY_LOG_LEVEL_INFO, max_message_mb = 256;
    int max_module_mb = 0, max_model_mb = 0, max_context_mb = 0, max_contexts_mb = 0;
    const char *port_file = NULL;
    const ferry_flag flags[] = {
        {.name = "listen",
         .type = FERRY_FLAG_STRING,
         .ptr = &cfg.listen,
         .metavar = "HOST:PORT",
         .help = "address to serve on (port 0: an ephemeral port, see --port-file)"},
        {.name = "port-file",
         .type = FERRY_FLAG_STRING,
         .ptr = &port_file,
         .metavar = "FILE",
         .help = "write the bound port to FILE once listening"},
        {.name = "threads",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.threads,
         .min = 1,
         .max = 64,
         .help = "threads running calls"},
        {.name = "context-ttl",
         .type = FERRY_FLAG_DOUBLE,
         .ptr = &cfg.context_ttl_s,
         .min = 0.001,
         .max = 1e7,
         .metavar = "SECONDS",
         .help = "free a context after this long without a call (its trainer died)"},
        {.name = "max-message-mb",
         .type = FERRY_FLAG_INT,
         .ptr = &max_message_mb,
         .min = 1,
         .max = 2047,
         .help = "largest request or reply, in MiB"},
        {.name = "max-module-mb",
         .type = FERRY_FLAG_INT,
         .ptr = &max_module_mb,
         .min = 0,
         .max = 1 << 30,
         .help = "largest module (weights + optimizer state), in MiB (0: 2048)"},
        {.name = "max-model-mb",
         .type = FERRY_FLAG_INT,
         .ptr = &max_model_mb,
         .min = 0,
         .max = 1 << 30,
         .help = "all modules together, in MiB (0: half the physical memory)"},
        {.name = "max-context-mb",
         .type = FERRY_FLAG_INT,
         .ptr = &max_context_mb,
         .min = 0,
         .max = 1 << 30,
         .help = "one context's saved inputs and gradients, and one call's scratch, in MiB "
                 "(0: 1024)"},
        {.name = "max-contexts-mb",
         .type = FERRY_FLAG_INT,
         .ptr = &max_contexts_mb,
         .min = 0,
         .max = 1 << 30,
         .help = "all contexts together, in MiB (0: a quarter of the physical memory)"},
        {.name = "max-contexts",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.max_contexts,
         .min = 0,
         .max = 1 << 24,
         .help = "contexts alive at once (0: 16384)"},
        {.name = "checkpoint-keep",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.checkpoint_keep,
         .min = 0,
         .max = 1 << 20,
         .help = "checkpoints kept in --checkpoint-dir, older ones deleted (0: 4)"},
        {.name = "checkpoint-dir",
         .type = FERRY_FLAG_STRING,
         .ptr = &cfg.checkpoint_dir,
         .metavar = "DIR",
         .help = "where Checkpoint calls write (none: checkpoints refused)"},
        {.name = "restore",
         .type = FERRY_FLAG_STRING,
         .ptr = &cfg.restore,
         .metavar = "FILE",
         .help = "recreate the modules of this checkpoint before serving"},
        {.name = "server-id",
         .type = FERRY_FLAG_STRING,
         .ptr = &cfg.server_id,
         .help = "name reported by Hello (default ferry-ps@HOST:PORT)"},
        {.name = "shutdown-grace-ms",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.shutdown_grace_ms,
         .min = 0,
         .max = 600000,
         .help = "time calls in flight get on SIGINT/SIGTERM"},
        {.name = "log-level",
         .type = FERRY_FLAG_ENUM,
         .ptr = &log_level,
         .choices = "error|warn|info|debug",
         .help = "log verbosity"},
    };
    ferry_flags fs = {"ferry-ps", "hosts model shards and their optimizers for ferry trainers",
                      flags, (int)(sizeof flags / sizeof flags[0])};
    bool help = false;
    if (ferry_flags_parse(&fs, argc, argv, &help) != FERRY_OK) {
        fprintf(stderr, "ferry-ps: %s\n", ferry_error_last());
        return 2;
    }
    if (help)
        return 0;
    ferry_log_set_level((ferry_log_level)log_level);
    cfg.max_message_bytes = (size_t)max_message_mb << 20;
    cfg.max_module_bytes = (size_t)max_module_mb << 20;
    cfg.max_model_bytes = (size_t)max_model_mb << 20;
    cfg.max_context_bytes = (size_t)max_context_mb << 20;
    cfg.max_contexts_bytes = (size_t)max_contexts_mb << 20;
    ferry_ps_server *s;
    ferry_status st = ferry_ps_server_create(&cfg, &s);
    if (st != FERRY_OK) {
        fprintf(stderr, "ferry-ps: %s\n",
                ferry_error_last()[0] ? ferry_error_last() : ferry_status_str(st));
        return 1;
    }
    if (port_file != NULL && write_port_file(port_file, ferry_ps_server_port(s)) != 0) {
        fprintf(stderr, "ferry-ps: cannot write --port-file %s\n", port_file);
        ferry_ps_server_destroy(s);
        return 1;
    }
    st = ferry_ps_server_run(s);
    if (st != FERRY_OK)
        FERRY_LOG_ERROR("%s (%s)", ferry_status_str(st), ferry_error_last());
    ferry_ps_server_destroy(s);
    return st == FERRY_OK ? 0 : 1;
}
