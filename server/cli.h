/* cli.h - ferry-ps's command line (cli.c): the flag table and the environment
 * variables --help lists. */
#ifndef FERRY_PS_CLI_H
#define FERRY_PS_CLI_H

#include <stdbool.h>

#include "common/core/flags.h"
#include "server/ps.h"

#define FERRY_PS_MAX_FLAGS 96

/* The flags over one configuration, and the values that are the command line's own. */
typedef struct ferry_ps_cli {
    int log_level, log_format;
    /* sizes in MiB, made bytes in the configuration (0: the server's default) */
    int max_message_mb, max_module_mb, max_model_mb, max_context_mb, max_contexts_mb;
    int id_contexts_mb, id_model_mb, pending_reply_mb;
    const char *port_file;
    const char *token_file, *admin_token_file;
    const char *tls_cert, *tls_key, *tls_ca;
    bool insecure;
    const char *metrics_listen, *metrics_token_file;
    ferry_flag flags[FERRY_PS_MAX_FLAGS];
    int nflags;
} ferry_ps_cli;

/* Fills cli's table with every flag, each pointing into cfg or cli, and cli's
 * defaults (log level info, messages up to 256 MiB). */
void ferry_ps_cli_init(ferry_ps_cli *cli, ferry_ps_config *cfg);

/* NULL-terminated "NAME", "what it does" pairs (ferry_flags.env). */
extern const char *const ferry_ps_env[];

#endif /* FERRY_PS_CLI_H */
