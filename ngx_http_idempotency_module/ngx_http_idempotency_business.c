/*
 * idempotency_unique and idempotency_lock: the names, in Redis, of a
 * request's business identity (within its scope) and of its lock (across
 * scopes).  claim.lua checks and takes both in the step that claims the
 * key, so what is decided here is only which keys it is given.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency.h"


static char *
ngx_http_idem_business_compile(ngx_conf_t *cf, ngx_str_t *text,
    ngx_http_complex_value_t *cv)
{
    ngx_http_compile_complex_value_t  ccv;

    ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));
    ccv.cf = cf;
    ccv.value = text;
    ccv.complex_value = cv;

    return ngx_http_compile_complex_value(&ccv) == NGX_OK ? NGX_CONF_OK
                                                           : NGX_CONF_ERROR;
}


/* "tickets:$a-${b}" gives "${a}${b}": the value's variables alone */
static ngx_int_t
ngx_http_idem_business_vars(ngx_conf_t *cf, ngx_str_t *text, ngx_str_t *vars)
{
    u_char  *p, *end, *name, *q;

    vars->data = ngx_pnalloc(cf->pool, 3 * text->len);
    if (vars->data == NULL) {
        return NGX_ERROR;
    }

    q = vars->data;
    end = text->data + text->len;

    for (p = text->data; p < end; p++) {
        if (*p != '$' || p + 1 == end) {
            continue;
        }

        if (p[1] == '{') {
            name = p + 2;
            for (p = name; p < end && *p != '}'; p++) { /* void */ }

        } else {
            name = p + 1;
            for (p = name; p < end && (*p == '_' || isalnum(*p)); p++) {
                /* void */
            }
        }

        if (p > name) {
            q = ngx_sprintf(q, "${%*s}", (size_t) (p - name), name);
        }

        p--;
    }

    vars->len = q - vars->data;

    return NGX_OK;
}


/* idempotency_unique | idempotency_lock off | value */
char *
ngx_http_idem_business_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    ngx_str_t                  *value, vars;
    ngx_http_idem_business_t  **bv, *b;

    bv = (ngx_http_idem_business_t **) (p + cmd->offset);

    if (*bv != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        *bv = NULL;
        return NGX_CONF_OK;
    }

    if (value[1].len == 0) {
        return "needs a value (such as \"tickets:$source_event_id\"), "
               "or \"off\"";
    }

    b = ngx_pcalloc(cf->pool, sizeof(ngx_http_idem_business_t));
    if (b == NULL
        || ngx_http_idem_business_compile(cf, &value[1], &b->value)
           != NGX_CONF_OK
        || ngx_http_idem_business_vars(cf, &value[1], &vars) != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    b->has_vars = (vars.len != 0);

    if (b->has_vars
        && ngx_http_idem_business_compile(cf, &vars, &b->vars) != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    /* a constant would make every request of the location one identity */
    if (!b->has_vars
        && cmd->offset == offsetof(ngx_http_idem_loc_conf_t, unique))
    {
        return "has no variable: every request of the location would be "
               "one business identity (use a variable, such as "
               "\"tickets:$source_event_id\")";
    }

    *bv = b;

    return NGX_CONF_OK;
}


/* the key of one value: "" (nothing to check) when its variables are empty */
static ngx_int_t
ngx_http_idem_business_key(ngx_http_request_t *r, ngx_http_idem_business_t *b,
    const char *domain, ngx_str_t *scope, const char *suffix, u_char *out)
{
    ngx_str_t  v;

    out[0] = '\0';

    if (b == NULL) {
        return NGX_OK;
    }

    if (b->has_vars) {
        if (ngx_http_complex_value(r, &b->vars, &v) != NGX_OK) {
            return NGX_ERROR;
        }

        if (v.len == 0) {
            return NGX_OK;
        }
    }

    if (ngx_http_complex_value(r, &b->value, &v) != NGX_OK) {
        return NGX_ERROR;
    }

    /* a value of any length is a digest in Redis, never stored raw */
    if (idem_derived_key(domain, (const char *) scope->data, scope->len,
                         (const char *) v.data, v.len, suffix, (char *) out)
        != 0)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * Once the request is fingerprinted (the values are mostly
 * idempotency_json_var variables, which read the body only then): the
 * unique key within the scope, the lock key across scopes, and the
 * scope's tag, which tells the holder of a lock whether a refused request
 * is of its own scope.
 */
ngx_int_t
ngx_http_idem_business_keys(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_str_t                  none = ngx_null_string, value, *scope;
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ctx->conf;

    if (ctx->business || (lcf->unique == NULL && lcf->lock == NULL)) {
        return NGX_OK;
    }

    ctx->business = 1;
    scope = &value;
    ngx_str_null(scope);

    if (lcf->scope && ngx_http_complex_value(r, lcf->scope, scope) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_idem_business_key(r, lcf->unique, "idem-unique-v1", scope,
                                   IDEM_UNIQUE_SUFFIX, ctx->ukey)
        != NGX_OK
        || ngx_http_idem_business_key(r, lcf->lock, "idem-lock-v1", &none,
                                      IDEM_LOCK_SUFFIX, ctx->lkey)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ctx->lkey[0] == '\0') {
        return NGX_OK;
    }

    return idem_derived_key("idem-scope-v1", (const char *) scope->data,
                            scope->len, "", 0, IDEM_SCOPE_SUFFIX,
                            (char *) ctx->stag)
           == 0 ? NGX_OK : NGX_ERROR;
}


/*
 * The extra keys of a script that takes or keeps the unique and lock keys
 * (claim, renew): both, "" for one the request lacks, or none at all.
 */
ngx_uint_t
ngx_http_idem_business_args(ngx_http_idem_ctx_t *ctx, u_char **keys)
{
    keys[0] = ctx->ukey;
    keys[1] = ctx->lkey;

    return (ctx->ukey[0] || ctx->lkey[0]) ? 2 : 0;
}
