/*
 * The module's variables for log_format and the like: what the module did
 * with the request, and which key, fingerprint and operation it used.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_variables.h"
#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_metrics.h"   /* the outcomes it counts */


ngx_str_t  ngx_http_idem_outcome_names[] = {
    ngx_null_string,
    ngx_string("executed"),
    ngx_string("replayed"),
    ngx_string("conflict"),
    ngx_string("in_progress"),
    ngx_string("unknown"),
    ngx_string("rejected"),
    ngx_string("bypassed"),
    ngx_string("confirm_required"),
    ngx_string("reused"),
    ngx_string("locked")
};

typedef char  ngx_http_idem_outcome_names_complete_t[
    sizeof(ngx_http_idem_outcome_names) / sizeof(ngx_str_t)
    == NGX_HTTP_IDEM_NOUTCOME_NAMES
    && NGX_HTTP_IDEM_NOUTCOME_NAMES == NGX_HTTP_IDEM_METRICS_OUTCOMES + 1
    ? 1 : -1];


enum {
    NGX_HTTP_IDEM_VAR_KEY = 0,
    NGX_HTTP_IDEM_VAR_OUTCOME,
    NGX_HTTP_IDEM_VAR_FINGERPRINT,
    NGX_HTTP_IDEM_VAR_OPERATION_ID,
    NGX_HTTP_IDEM_VAR_BODY_FORM,
    NGX_HTTP_IDEM_VAR_APPROVER
};


static ngx_int_t
ngx_http_idem_variable(ngx_http_request_t *r, ngx_http_variable_value_t *v,
    uintptr_t data)
{
    const char           *s;
    ngx_str_t             value;
    ngx_http_idem_ctx_t  *ctx;

    ctx = ngx_http_idem_get_ctx(r->main);

    ngx_str_null(&value);

    if (ctx) {
        switch (data) {

        case NGX_HTTP_IDEM_VAR_KEY:
            value = ctx->key;
            break;

        case NGX_HTTP_IDEM_VAR_OUTCOME:
            value = ngx_http_idem_outcome_names[ctx->outcome];
            break;

        case NGX_HTTP_IDEM_VAR_FINGERPRINT:
            if (ctx->fingerprinted) {
                value.data = ctx->fingerprint;
                value.len = IDEM_FP_HEX_LEN;
            }
            break;

        case NGX_HTTP_IDEM_VAR_OPERATION_ID:
            value = ctx->op_id;
            break;

        case NGX_HTTP_IDEM_VAR_APPROVER:
            value = ctx->approver;
            break;

        default: /* NGX_HTTP_IDEM_VAR_BODY_FORM */
            if (ctx->fingerprinted) {
                s = idem_body_form_name(ctx->body_form);
                value.data = (u_char *) s;
                value.len = ngx_strlen(s);
            }
            break;
        }
    }

    if (value.len == 0) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->len = value.len;
    v->data = value.data;
    v->valid = 1;
    v->no_cacheable = 0;
    v->not_found = 0;

    return NGX_OK;
}


static ngx_http_variable_t  ngx_http_idem_vars[] = {

    { ngx_string("idempotency_key"), NULL, ngx_http_idem_variable,
      NGX_HTTP_IDEM_VAR_KEY, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("idempotency_outcome"), NULL, ngx_http_idem_variable,
      NGX_HTTP_IDEM_VAR_OUTCOME, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("idempotency_fingerprint"), NULL, ngx_http_idem_variable,
      NGX_HTTP_IDEM_VAR_FINGERPRINT, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("idempotency_operation_id"), NULL, ngx_http_idem_variable,
      NGX_HTTP_IDEM_VAR_OPERATION_ID, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("idempotency_body_form"), NULL, ngx_http_idem_variable,
      NGX_HTTP_IDEM_VAR_BODY_FORM, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("idempotency_approver"), NULL, ngx_http_idem_variable,
      NGX_HTTP_IDEM_VAR_APPROVER, NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


ngx_int_t
ngx_http_idem_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_idem_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}
