/*
 * The configuration of idempotency-mcp (docs/agents.md, "MCP"): the state
 * dir and the targets an agent may name.  The secrets (header values) are
 * resolved here, once, and live only in the targets' header lists: never
 * in a result, a log line or an error message.
 */

#ifndef MCP_CONFIG_H
#define MCP_CONFIG_H

#include <curl/curl.h>


typedef struct {
    char               *name;
    char               *base_url;       /* without a trailing "/" */
    char               *status_url;     /* or NULL */
    struct curl_slist  *headers;        /* "Name: value", the secrets */
    char              **header_names;   /* the names, for refusals */
    int                 nheaders;
    char              **methods;
    int                 nmethods;
    char              **paths;
    int                 npaths;
    long                max_time_ms;
    long                deadline_ms;
} mcp_target_t;


typedef struct {
    char           *state_dir;      /* or NULL: idempotency-call's default */
    mcp_target_t   *targets;
    int             ntargets;
} mcp_config_t;


/* 0, or -1 with a message naming the member in err */
int mcp_config_load(const char *path, mcp_config_t *cf, char *err,
    size_t errlen);
void mcp_config_free(mcp_config_t *cf);
const mcp_target_t *mcp_config_target(const mcp_config_t *cf,
    const char *name);

#endif /* MCP_CONFIG_H */
