/*
 * What ngx_http_idempotency_close_batch.c exports: the completions of one
 * turn of the event loop sent together.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_CLOSE_BATCH_H
#define NGX_HTTP_IDEMPOTENCY_CLOSE_BATCH_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


ngx_int_t ngx_http_idem_close_send(ngx_http_idem_cmd_t *cmd,
    ngx_http_idem_reply_pt handler, void *data);

#endif /* NGX_HTTP_IDEMPOTENCY_CLOSE_BATCH_H */
