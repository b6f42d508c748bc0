/*
 * The MCP side of idempotency-mcp: JSON-RPC 2.0 over stdio, one message a
 * line; stdout carries protocol messages only, written whole under one
 * lock; each tools/call runs on its own thread, so a call waiting on
 * Retry-After holds up neither ping nor another call.
 */

#ifndef MCP_RPC_H
#define MCP_RPC_H

#include <pthread.h>

#include <cjson/cJSON.h>

#include "mcp_config.h"

#define MCP_LINE_MAX   (4 * 1024 * 1024)
#define MCP_CALLS_MAX  256     /* calls in flight: a thread each */


typedef struct mcp_call_s  mcp_call_t;

struct mcp_call_s {
    cJSON          *id;
    char           *tool;
    cJSON          *args;
    volatile int    cancel;         /* stops the waits */
    int             unanswered;     /* notifications/cancelled: no answer */
    mcp_call_t     *next;
    void           *srv;
};


typedef struct {
    const mcp_config_t  *cf;
    pthread_mutex_t      out_lock;
    pthread_mutex_t      calls_lock;
    pthread_cond_t       calls_done;
    mcp_call_t          *calls;
    int                  ncalls;
    int                  initialized;
} mcp_server_t;


void mcp_server_init(mcp_server_t *s, const mcp_config_t *cf);
void mcp_handle_line(mcp_server_t *s, const char *line, size_t len);
int mcp_serve(mcp_server_t *s, int fd);
void mcp_log(const char *fmt, ...);

#endif /* MCP_RPC_H */
