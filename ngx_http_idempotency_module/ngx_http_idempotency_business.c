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
#include "ngx_http_idempotency_business.h"


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


/*
 * "tickets:$a-${b}" gives "$a" and "${b}": each variable of the value,
 * which ngx_http_compile_complex_value() has already found well formed
 */
static ngx_int_t
ngx_http_idem_business_vars(ngx_conf_t *cf, ngx_str_t *text,
    ngx_http_idem_business_t *b)
{
    u_char                    *p, *end;
    ngx_str_t                  one;
    ngx_http_complex_value_t  *cv;

    b->vars = ngx_array_create(cf->pool, 2, sizeof(ngx_http_complex_value_t));
    if (b->vars == NULL) {
        return NGX_ERROR;
    }

    end = text->data + text->len;

    for (p = text->data; p + 1 < end; p++) {
        if (*p != '$') {
            continue;
        }

        one.data = p;

        if (p[1] == '{') {
            for (p += 2; p < end && *p != '}'; p++) { /* void */ }
            one.len = p - one.data + 1;

        } else {
            for (p++; p < end && (*p == '_' || isalnum(*p)); p++) {
                /* void */
            }

            one.len = p-- - one.data;

            if (one.len == 1) {
                continue;
            }
        }

        cv = ngx_array_push(b->vars);
        if (cv == NULL
            || ngx_http_idem_business_compile(cf, &one, cv) != NGX_CONF_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/*
 * The option after the value: "shared=NAME" of idempotency_unique (the
 * locations that mean one identity), "optional" of idempotency_lock (an
 * empty value takes no lock instead of being refused)
 */
static char *
ngx_http_idem_business_option(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_str_t *opt, ngx_http_idem_business_t *b)
{
    size_t      i;
    ngx_uint_t  unique;

    unique = (cmd->offset == offsetof(ngx_http_idem_loc_conf_t, unique));

    if (!unique && opt->len == 8
        && ngx_strncmp(opt->data, "optional", 8) == 0)
    {
        b->optional = 1;
        return NGX_CONF_OK;
    }

    if (!unique || opt->len <= 7 || ngx_strncmp(opt->data, "shared=", 7))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\": invalid parameter \"%V\", expected %s",
                           &cmd->name, opt,
                           unique ? "shared=NAME" : "optional");
        return NGX_CONF_ERROR;
    }

    /* a name, not a value: the same on every host that shares Redis */
    for (i = 7; i < opt->len; i++) {
        if (!(isalnum(opt->data[i]) || ngx_strchr("._:-/", opt->data[i]))) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"%V\": \"%V\": the name is 1 to 64 "
                               "characters of A-Z a-z 0-9 . _ : - /",
                               &cmd->name, opt);
            return NGX_CONF_ERROR;
        }
    }

    if (opt->len - 7 > 64) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\": \"%V\": the name is 1 to 64 "
                           "characters of A-Z a-z 0-9 . _ : - /",
                           &cmd->name, opt);
        return NGX_CONF_ERROR;
    }

    b->shared.data = opt->data + 7;
    b->shared.len = opt->len - 7;

    return NGX_CONF_OK;
}


/*
 * idempotency_unique value [shared=NAME] | off;
 * idempotency_lock value [optional] | off;
 */
char *
ngx_http_idem_business_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    ngx_str_t                  *value;
    ngx_http_idem_business_t  **bv, *b;

    bv = (ngx_http_idem_business_t **) (p + cmd->offset);

    if (*bv != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        if (cf->args->nelts > 2) {
            return "takes no parameter after \"off\"";
        }

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
        || ngx_http_idem_business_vars(cf, &value[1], b) != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (cf->args->nelts > 2
        && ngx_http_idem_business_option(cf, cmd, &value[2], b)
           != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    /* a constant would make every request of the location one identity */
    if (b->vars->nelts == 0
        && cmd->offset == offsetof(ngx_http_idem_loc_conf_t, unique))
    {
        return "has no variable: every request of the location would be "
               "one business identity (use a variable, such as "
               "\"tickets:$source_event_id\")";
    }

    *bv = b;

    return NGX_CONF_OK;
}


/*
 * Whether the value names nothing: an identity when one of its variables
 * is empty, a lock when all of them are
 */
static ngx_int_t
ngx_http_idem_business_none(ngx_http_request_t *r,
    ngx_http_idem_business_t *b, ngx_uint_t any, ngx_uint_t *none)
{
    ngx_str_t                  v;
    ngx_uint_t                 i, empty;
    ngx_http_complex_value_t  *cv;

    cv = b->vars->elts;
    empty = 0;

    for (i = 0; i < b->vars->nelts; i++) {
        if (ngx_http_complex_value(r, &cv[i], &v) != NGX_OK) {
            return NGX_ERROR;
        }

        empty += (v.len == 0);
    }

    *none = b->vars->nelts
            && (any ? empty != 0 : empty == b->vars->nelts);

    return NGX_OK;
}


/*
 * The key of one value, or "" (nothing to check; *none says the value
 * named nothing).  An identity's value is preceded by its namespace
 * (ns, the location's or shared=NAME) and a NUL, which neither holds:
 * the same event id of two locations is two identities.
 */
static ngx_int_t
ngx_http_idem_business_key(ngx_http_request_t *r, ngx_http_idem_business_t *b,
    ngx_uint_t any, const char *domain, ngx_str_t *scope, ngx_str_t *ns,
    const char *suffix, u_char *out, ngx_uint_t *none)
{
    u_char     *p;
    ngx_str_t   v;

    out[0] = '\0';
    *none = 0;

    if (b == NULL) {
        return NGX_OK;
    }

    if (ngx_http_idem_business_none(r, b, any, none) != NGX_OK) {
        return NGX_ERROR;
    }

    if (*none) {
        return NGX_OK;
    }

    if (ngx_http_complex_value(r, &b->value, &v) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ns) {
        p = ngx_pnalloc(r->pool, ns->len + 1 + v.len);
        if (p == NULL) {
            return NGX_ERROR;
        }

        ngx_memcpy(p, ns->data, ns->len);
        p[ns->len] = '\0';
        ngx_memcpy(p + ns->len + 1, v.data, v.len);
        v.data = p;
        v.len += ns->len + 1;
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
    ngx_str_t                  none = ngx_null_string, *scope;
    ngx_uint_t                 no_identity, no_lock;
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ctx->conf;

    if (ctx->business || (lcf->unique == NULL && lcf->lock == NULL)) {
        return NGX_OK;
    }

    ctx->business = 1;
    scope = &ctx->scope;

    if (ngx_http_idem_business_key(r, lcf->unique, 1, "idem-unique-v2",
                                   scope, &lcf->unique_ns, IDEM_UNIQUE_SUFFIX,
                                   ctx->ukey, &no_identity)
        != NGX_OK
        || ngx_http_idem_business_key(r, lcf->lock, 0, "idem-lock-v1", &none,
                                      NULL, IDEM_LOCK_SUFFIX, ctx->lkey,
                                      &no_lock)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    /* a lock the request does not name is refused, unless optional */
    ctx->lock_missing = no_lock && !lcf->lock->optional;

    if (ctx->lkey[0] == '\0') {
        return NGX_OK;
    }

    /* the lock's name beside the record, for the status endpoint */
    idem_sibling_key((const char *) ctx->rkey, IDEM_HOLDS_SUFFIX,
                     (char *) ctx->hkey);

    return idem_derived_key("idem-scope-v1", (const char *) scope->data,
                            scope->len, "", 0, IDEM_SCOPE_SUFFIX,
                            (char *) ctx->stag)
           == 0 ? NGX_OK : NGX_ERROR;
}


/*
 * The extra keys of a script that takes or keeps the unique and lock keys
 * (claim, renew): the unique key, the lock key and the key that names the
 * lock beside the record (NGX_HTTP_IDEM_BUSINESS_KEYS), the record key
 * for one the request lacks, or none at all.
 */
ngx_uint_t
ngx_http_idem_business_args(ngx_http_idem_ctx_t *ctx, u_char **keys)
{
    /*
     * on a Redis Cluster they are in other slots than the record: taken
     * and kept by ngx_http_idempotency_bkeys.c, never by a record's script
     */
    if (ctx->conf->redis->topology == NGX_HTTP_IDEM_TOPO_CLUSTER) {
        return 0;
    }

    /* an absent one is the record key: an ACL refuses an empty name */
    keys[0] = ctx->ukey[0] ? ctx->ukey : ctx->rkey;
    keys[1] = ctx->lkey[0] ? ctx->lkey : ctx->rkey;
    keys[2] = ctx->lkey[0] ? ctx->hkey : ctx->rkey;

    return (ctx->ukey[0] || ctx->lkey[0]) ? NGX_HTTP_IDEM_BUSINESS_KEYS : 0;
}


/*
 * Two locations whose default namespace is the same (servers without a
 * server_name, or with the same first one, and the same location name; or
 * "location = /x" beside "location /x" in one server) would answer one's event with the other's stored body.  An address in
 * the name would tell them apart but differ between the hosts of a cluster
 * sharing one Redis, so the configuration is refused instead.  An "if" or
 * "limit_except" block is its location's own (noname), never a second one.
 */
static char *
ngx_http_idem_unique_ns_check(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *conf,
    ngx_http_core_srv_conf_t *cscf, ngx_http_core_loc_conf_t *clcf)
{
    ngx_str_t                  *ns;
    ngx_uint_t                  i;
    ngx_http_idem_main_conf_t  *mcf;

    if (conf->unique == NULL || conf->unique->shared.len || clcf->noname) {
        return NGX_CONF_OK;
    }

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    if (mcf->unique_nss == NULL) {
        mcf->unique_nss = ngx_array_create(cf->pool, 4, sizeof(ngx_str_t));
        if (mcf->unique_nss == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    ns = mcf->unique_nss->elts;

    for (i = 0; i < mcf->unique_nss->nelts; i++) {
        if (ns[i].len == conf->unique_ns.len
            && ngx_strncmp(ns[i].data, conf->unique_ns.data, ns[i].len) == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_unique\" of location \"%V\" "
                               "shares its identities with another location "
                               "of the same name (in a server with the same "
                               "server_name \"%V\", or \"=\", \"^~\" or a "
                               "regular expression beside a prefix): one's "
                               "event would be answered with the other's "
                               "body; give the servers distinct server_name "
                               "values, or name the identity with "
                               "shared=NAME",
                               &clcf->name, &cscf->server_name);
            return NGX_CONF_ERROR;
        }
    }

    ns = ngx_array_push(mcf->unique_nss);
    if (ns == NULL) {
        return NGX_CONF_ERROR;
    }

    *ns = conf->unique_ns;

    return NGX_CONF_OK;
}


/*
 * A location's name for its identities and their holders: the same on
 * every host with this configuration and across reloads (the server's
 * first server_name and the location's name, never an address or a
 * position in the file), or the shared=NAME its locations agree on.
 */
char *
ngx_http_idem_guard_names(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *conf)
{
    u_char                    *p;
    size_t                     len;
    ngx_http_core_srv_conf_t  *cscf;
    ngx_http_core_loc_conf_t  *clcf;

    cscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_core_module);
    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    /* a server_name has no space: "location:<server> <location>" is one */
    len = sizeof("location:") + cscf->server_name.len + clcf->name.len;

    p = ngx_pnalloc(cf->pool, len);
    if (p == NULL) {
        return NGX_CONF_ERROR;
    }

    conf->unique_ns.data = p;
    p = ngx_sprintf(p, "location:%V %V", &cscf->server_name, &clcf->name);
    conf->unique_ns.len = p - conf->unique_ns.data;

    if (idem_derived_key("idem-location-v1", "", 0,
                         (const char *) conf->unique_ns.data,
                         conf->unique_ns.len, IDEM_SCOPE_SUFFIX,
                         (char *) conf->loc_tag)
        != 0)
    {
        return NGX_CONF_ERROR;
    }

    if (ngx_http_idem_unique_ns_check(cf, conf, cscf, clcf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    if (conf->unique && conf->unique->shared.len) {
        len = sizeof("shared:") - 1 + conf->unique->shared.len;

        p = ngx_pnalloc(cf->pool, len);
        if (p == NULL) {
            return NGX_CONF_ERROR;
        }

        conf->unique_ns.data = p;
        conf->unique_ns.len = ngx_sprintf(p, "shared:%V",
                                          &conf->unique->shared) - p;
    }

    return NGX_CONF_OK;
}
