/*
 * idempotency_approve_page: (work in progress)
 */

#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency.h"
