/*
 * idempotency_confirm: a request that needs a person's yes is not executed
 * until it comes with an approval signed for its key and its fingerprint
 * (idem_jws.c).  Without one, the claim leaves a proposal in Redis
 * (awaiting_confirmation) and the client is answered 428 with what to
 * approve.  Called from the handler after the fingerprint, before the
 * claim; docs/confirmation.md describes the flow.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <cjson/cJSON.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_confirm.h"
#include "ngx_http_idempotency_conf.h"
#include "ngx_http_idempotency_json_var.h"
#include "ngx_http_idempotency_reply.h"
#include "ngx_http_idempotency_request.h"


#define NGX_HTTP_IDEM_CONFIRM_HEADER  "Idempotency-Confirmation"


/* ------------------------------------------------------ configuration */

char *
ngx_http_idem_confirm_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t *lcf = conf;

    ngx_str_t                         *value, v;
    ngx_http_compile_complex_value_t   ccv;

    if (lcf->confirm != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        lcf->confirm = NULL;
        return NGX_CONF_OK;
    }

    v = value[1];

    if (ngx_strcmp(v.data, "on") == 0) {
        ngx_str_set(&v, "1");
    }

    lcf->confirm = ngx_palloc(cf->pool, sizeof(ngx_http_complex_value_t));
    if (lcf->confirm == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));
    ccv.cf = cf;
    ccv.value = &v;
    ccv.complex_value = lcf->confirm;

    return ngx_http_compile_complex_value(&ccv) == NGX_OK ? NGX_CONF_OK
                                                           : NGX_CONF_ERROR;
}


/* "idempotency_confirm_key": the directive's name leads every message */
static char *
ngx_http_idem_confirm_key_error(ngx_conf_t *cf, const char *fmt, ngx_str_t *s)
{
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, fmt, s);
    return NGX_CONF_ERROR;
}


/* a kid names one key: rotation gives each key its own */
static char *
ngx_http_idem_confirm_key_add(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *lcf,
    idem_jws_key_t *key, ngx_str_t *kid)
{
    ngx_uint_t       i;
    idem_jws_key_t  *k;

    if (lcf->confirm_keys == NGX_CONF_UNSET_PTR) {
        lcf->confirm_keys = ngx_array_create(cf->pool, 2,
                                             sizeof(idem_jws_key_t));
        if (lcf->confirm_keys == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    k = lcf->confirm_keys->elts;

    for (i = 0; kid && key->kid[0] && i < lcf->confirm_keys->nelts; i++) {
        if (ngx_strcmp(k[i].kid, key->kid) == 0) {
            return ngx_http_idem_confirm_key_error(cf,
                       "\"idempotency_confirm_key\": duplicate \"%V\"",
                       kid);
        }
    }

    k = ngx_array_push(lcf->confirm_keys);
    if (k == NULL) {
        return NGX_CONF_ERROR;
    }

    *k = *key;

    return NGX_CONF_OK;
}


/* idempotency_confirm_key hs256|ed25519 <file> [kid=<id>] */
char *
ngx_http_idem_confirm_key_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idem_loc_conf_t *lcf = conf;

    char                *kid;
    ngx_str_t           *value;
    idem_jws_key_t      *key;
    idem_jws_alg_e       alg;

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "hs256") == 0) {
        alg = IDEM_JWS_HS256;

    } else if (ngx_strcmp(value[1].data, "ed25519") == 0) {
        alg = IDEM_JWS_ED25519;

    } else {
        return ngx_http_idem_confirm_key_error(cf,
                   "\"idempotency_confirm_key\": unknown type \"%V\", "
                   "use hs256 or ed25519", &value[1]);
    }

    kid = NULL;

    if (cf->args->nelts == 4) {
        if (ngx_strncmp(value[3].data, "kid=", 4) != 0) {
            return ngx_http_idem_confirm_key_error(cf,
                       "\"idempotency_confirm_key\": invalid parameter "
                       "\"%V\", expected kid=<id>", &value[3]);
        }

        kid = (char *) value[3].data + 4;
    }

    /* the cleanup owns the key's secret; the array holds a copy of it */
    key = ngx_http_idem_key_file(cf, &value[2], alg, kid,
                                 "idempotency_confirm_key");
    if (key == NULL) {
        return NGX_CONF_ERROR;
    }

    return ngx_http_idem_confirm_key_add(cf, lcf, key,
                                         kid ? &value[3] : NULL);
}


/* "label=Text" after a pointer names it for the person; else the pointer */
static char *
ngx_http_idem_confirm_label(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *lcf,
    ngx_str_t *arg)
{
    ngx_str_t  *label;

    label = lcf->confirm_labels->elts;
    label += lcf->confirm_labels->nelts - 1;

    if (arg->len <= 6 || label->data != NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_confirm_show\": \"%V\" must follow "
                           "a pointer once and name it: label=Text", arg);
        return NGX_CONF_ERROR;
    }

    label->data = arg->data + 6;
    label->len = arg->len - 6;

    return NGX_CONF_OK;
}


/* idempotency_confirm_show /json/pointer [label=Text] ... */
char *
ngx_http_idem_confirm_show_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idem_loc_conf_t *lcf = conf;

    ngx_str_t                *value, *label;
    ngx_uint_t                i;
    ngx_http_idem_pointer_t  *ptr;

    if (lcf->confirm_show != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    lcf->confirm_show = ngx_array_create(cf->pool, cf->args->nelts,
                                         sizeof(ngx_http_idem_pointer_t));
    lcf->confirm_labels = ngx_array_create(cf->pool, cf->args->nelts,
                                           sizeof(ngx_str_t));
    if (lcf->confirm_show == NULL || lcf->confirm_labels == NULL) {
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {
        if (ngx_strncmp(value[i].data, "label=", 6) == 0) {
            if (lcf->confirm_labels->nelts == 0
                || ngx_http_idem_confirm_label(cf, lcf, &value[i])
                   != NGX_CONF_OK)
            {
                return lcf->confirm_labels->nelts ? NGX_CONF_ERROR
                       : "label=Text must follow a pointer";
            }

            continue;
        }

        ptr = ngx_array_push(lcf->confirm_show);
        label = ngx_array_push(lcf->confirm_labels);
        if (ptr == NULL || label == NULL
            || ngx_http_idem_pointer_conf(cf, &cmd->name, &value[i], ptr)
               != NGX_OK)
        {
            return NGX_CONF_ERROR;
        }

        ngx_str_null(label);
    }

    return NGX_CONF_OK;
}


/* a shown value the fingerprint leaves out could change after the yes */
static char *
ngx_http_idem_confirm_check_show(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *conf)
{
    ngx_uint_t                i;
    ngx_http_idem_pointer_t  *ptr;

    if (conf->confirm_show == NULL || conf->fp_exclude == NULL) {
        return NGX_CONF_OK;
    }

    ptr = conf->confirm_show->elts;

    for (i = 0; i < conf->confirm_show->nelts; i++) {
        if (idem_ptr_set_overlaps(conf->fp_exclude, &ptr[i].parsed)) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_confirm_show\" %V is, holds or "
                               "is inside a member that "
                               "\"idempotency_fingerprint_exclude\" leaves "
                               "out of the fingerprint: the person would "
                               "approve a value the request can change",
                               &ptr[i].text);
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


/*
 * A variable of idempotency_confirm_describe is shown to the person as the
 * show pointers are: a JSON variable the fingerprint leaves out, or a
 * header it does not count, could change after the yes.
 */
static char *
ngx_http_idem_confirm_describe_var(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *conf, ngx_str_t *name)
{
    u_char                     c;
    ngx_str_t                 *h;
    ngx_uint_t                 i, j;
    ngx_http_idem_json_var_t  *jv;
    ngx_http_idem_main_conf_t *mcf;

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);
    jv = mcf->json_vars.elts;

    for (i = 0; i < mcf->json_vars.nelts; i++) {
        if (jv[i].name.len == name->len
            && ngx_strncasecmp(jv[i].name.data, name->data, name->len) == 0
            && conf->fp_exclude
            && idem_ptr_set_overlaps(conf->fp_exclude,
                                     &jv[i].pointer.parsed))
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_confirm_describe\" shows "
                               "$%V, whose member %V is, holds or is inside "
                               "a member that "
                               "\"idempotency_fingerprint_exclude\" leaves "
                               "out of the fingerprint: the person would "
                               "approve a value the request can change",
                               name, &jv[i].pointer.text);
            return NGX_CONF_ERROR;
        }
    }

    if (name->len <= 5 || ngx_strncasecmp(name->data, (u_char *) "http_", 5))
    {
        return NGX_CONF_OK;
    }

    h = conf->fp_headers ? conf->fp_headers->elts : NULL;

    for (i = 0; h && i < conf->fp_headers->nelts; i++) {
        if (h[i].len != name->len - 5) {
            continue;
        }

        for (j = 0; j < h[i].len; j++) {
            c = ngx_tolower(name->data[5 + j]);
            if ((c == '_' ? '-' : c) != h[i].data[j]) {
                break;
            }
        }

        if (j == h[i].len) {
            return NGX_CONF_OK;
        }
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"idempotency_confirm_describe\" shows $%V, a "
                       "header that \"idempotency_fingerprint_headers\" "
                       "does not list: the person would approve a value the "
                       "request can change (list the header there)", name);
    return NGX_CONF_ERROR;
}


/* each $name or ${name} of the describe's text */
static char *
ngx_http_idem_confirm_check_describe(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *conf)
{
    u_char     *p, *end;
    ngx_str_t   name;

    if (conf->confirm_describe == NULL || conf->confirm == NULL) {
        return NGX_CONF_OK;
    }

    p = conf->confirm_describe->value.data;
    end = p + conf->confirm_describe->value.len;

    while (p < end) {
        if (*p++ != '$') {
            continue;
        }

        if (p < end && *p == '{') {
            p++;
        }

        name.data = p;

        while (p < end && (*p == '_' || (*p >= 'a' && *p <= 'z')
                           || (*p >= 'A' && *p <= 'Z')
                           || (*p >= '0' && *p <= '9')))
        {
            p++;
        }

        name.len = p - name.data;

        if (name.len
            && ngx_http_idem_confirm_describe_var(cf, conf, &name)
               != NGX_CONF_OK)
        {
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


/* idempotency_confirm_link: an absolute http(s) URL, ?op= is appended */
static char *
ngx_http_idem_confirm_check_link(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *conf)
{
    ngx_str_t  *l;

    l = &conf->confirm_link;

    if (l->len == 0
        || (((l->len > 8 && ngx_strncmp(l->data, "https://", 8) == 0)
             || (l->len > 7 && ngx_strncmp(l->data, "http://", 7) == 0))
            && ngx_strlchr(l->data, l->data + l->len, '#') == NULL
            && ngx_strlchr(l->data, l->data + l->len, '"') == NULL))
    {
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"idempotency_confirm_link\" \"%V\" must be an "
                       "absolute http:// or https:// URL without a fragment",
                       l);

    return NGX_CONF_ERROR;
}


char *
ngx_http_idem_confirm_merge(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *prev,
    ngx_http_idem_loc_conf_t *conf)
{
    ngx_conf_merge_ptr_value(conf->confirm, prev->confirm, NULL);
    ngx_conf_merge_ptr_value(conf->confirm_keys, prev->confirm_keys, NULL);
    if (conf->confirm_show == NGX_CONF_UNSET_PTR) {
        conf->confirm_show = (prev->confirm_show == NGX_CONF_UNSET_PTR)
                             ? NULL : prev->confirm_show;
        conf->confirm_labels = prev->confirm_labels;
    }

    ngx_conf_merge_sec_value(conf->confirm_ttl, prev->confirm_ttl, 3600);
    ngx_conf_merge_ptr_value(conf->confirm_describe, prev->confirm_describe,
                             NULL);
    ngx_conf_merge_str_value(conf->confirm_link, prev->confirm_link, "");
    ngx_conf_merge_ptr_value(conf->approve_identity, prev->approve_identity,
                             NULL);

    if (conf->page_secret && conf->approve_identity == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_approve_page\" needs "
                           "\"idempotency_approve_identity\" (who approves: "
                           "the user nginx authenticated, e.g. $remote_user)");
        return NGX_CONF_ERROR;
    }

    if (ngx_http_idem_confirm_check_show(cf, conf) != NGX_CONF_OK
        || ngx_http_idem_confirm_check_describe(cf, conf) != NGX_CONF_OK
        || ngx_http_idem_confirm_check_link(cf, conf) != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (conf->enable && conf->confirm && conf->confirm_keys == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_confirm\" needs at least one "
                           "\"idempotency_confirm_key\" in the same or an "
                           "enclosing block");
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* ------------------------------------------------------------ request */

/* NGX_OK with *h, NGX_DECLINED when absent, NGX_ERROR when sent twice */
static ngx_int_t
ngx_http_idem_confirm_header(ngx_http_request_t *r, ngx_table_elt_t **found)
{
    ngx_uint_t  n;

    static ngx_str_t  name = ngx_string(NGX_HTTP_IDEM_CONFIRM_HEADER);

    *found = ngx_http_idem_find_header(r, &name, &n);

    if (n > 1) {
        return NGX_ERROR;
    }

    return *found ? NGX_OK : NGX_DECLINED;
}


/* whether the location's idempotency_confirm asks it of this request */
static ngx_int_t
ngx_http_idem_confirm_wanted(ngx_http_request_t *r,
    ngx_http_idem_loc_conf_t *lcf, ngx_uint_t *wanted)
{
    ngx_str_t  v;

    *wanted = 0;

    if (lcf->confirm == NULL) {
        return NGX_OK;
    }

    if (ngx_http_complex_value(r, lcf->confirm, &v) != NGX_OK) {
        return NGX_ERROR;
    }

    *wanted = !(v.len == 0
                || (v.len == 1 && v.data[0] == '0')
                || (v.len == 3 && ngx_strncmp(v.data, "off", 3) == 0));

    return NGX_OK;
}


/*
 * NGX_OK: claim, with ctx->confirm saying how.  A refused approval
 * (ctx->jws_rc) claims as no approval does: only the key's record says
 * whether the refusal is the answer (this request's proposal: 428), or
 * the key belongs to another request (409) or has run (the replay).
 */
ngx_int_t
ngx_http_idem_confirm_check(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_int_t                  rc;
    ngx_uint_t                 wanted;
    ngx_table_elt_t           *h;
    idem_jws_claims_t          claims;
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ctx->conf;
    ctx->confirm = NGX_HTTP_IDEM_CONFIRM_NONE;

    if (ngx_http_idem_confirm_wanted(r, lcf, &wanted) != NGX_OK) {
        return NGX_ERROR;
    }

    if (!wanted) {
        return NGX_OK;
    }

    rc = ngx_http_idem_confirm_header(r, &h);

    /* the claim stores the proposal it makes (the operation id's index) */
    ctx->propose = ngx_http_idem_confirm_proposal;

    if (rc == NGX_DECLINED) {
        ctx->confirm = NGX_HTTP_IDEM_CONFIRM_PROPOSE;
        return NGX_OK;
    }

    ctx->jws_rc = (rc == NGX_OK)
                  ? idem_jws_verify((char *) h->value.data, h->value.len,
                                    lcf->confirm_keys->elts,
                                    lcf->confirm_keys->nelts,
                                    (char *) ctx->key.data, ctx->key.len,
                                    (char *) ctx->fingerprint, ngx_time(),
                                    &claims)
                  : IDEM_JWS_MALFORMED;

    if (ctx->jws_rc != IDEM_JWS_OK) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: approval of key \"%V\" refused: %s",
                      ngx_http_idem_log_key(ctx),
                      idem_jws_reason(ctx->jws_rc));
        ctx->confirm = NGX_HTTP_IDEM_CONFIRM_PROPOSE;
        return NGX_OK;
    }

    ctx->approver.len = ngx_strlen(claims.sub);
    ctx->approver.data = ngx_pnalloc(r->pool, ctx->approver.len);
    if (ctx->approver.data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(ctx->approver.data, claims.sub, ctx->approver.len);
    ctx->confirm = NGX_HTTP_IDEM_CONFIRM_APPROVED;

    ngx_log_error(NGX_LOG_NOTICE, r->connection->log, 0,
                  "idempotency: key \"%V\" approved by \"%V\" (kid \"%s\")",
                  ngx_http_idem_log_key(ctx),
                  ngx_http_idem_log_str(r->pool, &ctx->approver), claims.kid);

    return NGX_OK;
}


/* a NUL-terminated copy for cJSON; NULL when it is not UTF-8 */
static char *
ngx_http_idem_confirm_cstr(ngx_http_request_t *r, u_char *s, size_t len)
{
    u_char  *p;

    /* an empty $args has no data at all */
    if (len == 0) {
        return "";
    }

    if (!idem_utf8_valid((const char *) s, len)
        || ngx_strlchr(s, s + len, '\0'))
    {
        return NULL;
    }

    p = ngx_pnalloc(r->pool, len + 1);
    if (p == NULL) {
        return NULL;
    }

    *ngx_cpymem(p, s, len) = '\0';

    return (char *) p;
}


static void
ngx_http_idem_confirm_add_str(ngx_http_request_t *r, cJSON *o,
    const char *name, u_char *s, size_t len)
{
    char  *c;

    c = ngx_http_idem_confirm_cstr(r, s, len);

    if (c) {
        cJSON_AddStringToObject(o, name, c);

    } else {
        cJSON_AddNullToObject(o, name);
    }
}


/*
 * The values idempotency_confirm_show names, from the body the fingerprint
 * read (parsed once per request, with idempotency_json_var's variables).
 * Only a body that was canonical JSON is read: it has no duplicate member,
 * so what is shown is what the upstream will read.
 */
static void
ngx_http_idem_confirm_show(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    cJSON *proposal)
{
    cJSON                    *root, *show, *labels;
    ngx_str_t                 text, *label;
    ngx_uint_t                i;
    const cJSON              *v;
    ngx_http_idem_pointer_t  *ptr;

    if (ctx->conf->confirm_show == NULL) {
        return;
    }

    show = cJSON_AddObjectToObject(proposal, "show");
    labels = cJSON_AddObjectToObject(proposal, "labels");
    if (show == NULL || labels == NULL) {
        return;
    }

    root = ngx_http_idem_json_body(r, ctx);
    ptr = ctx->conf->confirm_show->elts;
    label = ctx->conf->confirm_labels->elts;

    for (i = 0; i < ctx->conf->confirm_show->nelts; i++) {
        /* a label is configuration text: the page escapes it as any value */
        ngx_http_idem_confirm_add_str(r, labels, (char *) ptr[i].text.data,
                                      label[i].data ? label[i].data
                                                    : ptr[i].text.data,
                                      label[i].data ? label[i].len
                                                    : ptr[i].text.len);

        v = root ? idem_json_pointer_walk(root, &ptr[i].parsed) : NULL;

        /* exactly what the fingerprint reads: cJSON prints 0.3 for ...04 */
        if (v && ngx_http_idem_json_text(r, v, &text) != NGX_OK) {
            v = NULL;
        }

        cJSON_AddItemToObject(show, (char *) ptr[i].text.data,
                              v ? cJSON_CreateRaw((char *) text.data)
                                : cJSON_CreateNull());
    }
}


static void
ngx_http_idem_confirm_approve(ngx_http_idem_ctx_t *ctx, cJSON *proposal)
{
    cJSON           *a, *kids, *claims;
    ngx_uint_t       i;
    idem_jws_key_t  *k;

    a = cJSON_AddObjectToObject(proposal, "approve");
    if (a == NULL) {
        return;
    }

    cJSON_AddStringToObject(a, "header", NGX_HTTP_IDEM_CONFIRM_HEADER);
    cJSON_AddStringToObject(a, "format", "compact JWS, alg EdDSA or HS256, "
                            "see docs/confirmation.md");
    cJSON_AddStringToObject(a, "tool", "idempotency-approve --key FILE");

    kids = cJSON_AddArrayToObject(a, "kids");
    k = ctx->conf->confirm_keys ? ctx->conf->confirm_keys->elts : NULL;

    for (i = 0; kids && k && i < ctx->conf->confirm_keys->nelts; i++) {
        if (k[i].kid[0]) {
            cJSON_AddItemToArray(kids, cJSON_CreateString(k[i].kid));
        }
    }

    claims = cJSON_AddObjectToObject(a, "claims");
    if (claims) {
        cJSON_AddStringToObject(claims, "idk",
                                cJSON_GetStringValue(cJSON_GetObjectItem(
                                    proposal, "idempotency_key")));
        cJSON_AddStringToObject(claims, "fp",
                                cJSON_GetStringValue(cJSON_GetObjectItem(
                                    proposal, "fingerprint")));
    }

    cJSON_AddItemToObject(a, "required_claims",
                          cJSON_CreateStringArray((const char *[]) {
                              "idk", "fp", "sub", "iat", "exp" }, 5));
}


/*
 * Who asked: the audit's identity when the location names one, else the
 * scope as a short digest (its value may be a credential), the scope tag
 * a lock keeps (idem_record.h)
 */
static ngx_int_t
ngx_http_idem_confirm_asker(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    cJSON *proposal)
{
    u_char     buf[IDEM_RECORD_KEY_LEN + 1], text[32], *p;
    ngx_str_t  v;

    if (ctx->conf->audit_identity) {
        if (ngx_http_complex_value(r, ctx->conf->audit_identity, &v)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        ngx_http_idem_confirm_add_str(r, proposal, "requested_by", v.data,
                                      v.len);
        return NGX_OK;
    }

    if (ctx->scope.len == 0) {
        cJSON_AddStringToObject(proposal, "requested_by", "no scope");
        return NGX_OK;
    }

    if (idem_derived_key("idem-scope-v1", (const char *) ctx->scope.data,
                         ctx->scope.len, NULL, 0, IDEM_SCOPE_SUFFIX,
                         (char *) buf) != 0)
    {
        return NGX_ERROR;
    }

    p = ngx_sprintf(text, "scope %*s", (size_t) 12,
                    buf + sizeof(IDEM_RECORD_PREFIX) - 1);
    ngx_http_idem_confirm_add_str(r, proposal, "requested_by", text,
                                  p - text);

    return NGX_OK;
}


/* idempotency_confirm_describe and idempotency_confirm_link */
static ngx_int_t
ngx_http_idem_confirm_person(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    cJSON *proposal)
{
    u_char     *p;
    ngx_str_t   v, *link;

    if (ctx->conf->confirm_describe) {
        if (ngx_http_complex_value(r, ctx->conf->confirm_describe, &v)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        ngx_http_idem_confirm_add_str(r, proposal, "describe", v.data, v.len);
    }

    link = &ctx->conf->confirm_link;

    if (link->len == 0) {
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, link->len + 5 + ctx->op_id.len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    v.data = p;
    p = ngx_cpymem(p, link->data, link->len);
    p = ngx_cpymem(p, ngx_strlchr(link->data, link->data + link->len, '?')
                      ? "&op=" : "?op=", 4);
    p = ngx_cpymem(p, ctx->op_id.data, ctx->op_id.len);
    v.len = p - v.data;

    ngx_http_idem_confirm_add_str(r, proposal, "approve_url", v.data, v.len);

    return NGX_OK;
}


/* the proposal's end, as RFC 3339 UTC */
static void
ngx_http_idem_confirm_expiry(ngx_http_idem_ctx_t *ctx, cJSON *proposal)
{
    u_char    buf[32], *p;
    ngx_tm_t  tm;

    ngx_gmtime((time_t) (ctx->proposal_expires / 1000), &tm);

    p = ngx_sprintf(buf, "%4d-%02d-%02dT%02d:%02d:%02dZ", tm.ngx_tm_year,
                    tm.ngx_tm_mon, tm.ngx_tm_mday, tm.ngx_tm_hour,
                    tm.ngx_tm_min, tm.ngx_tm_sec);
    *p = '\0';

    cJSON_AddStringToObject(proposal, "expires_at", (char *) buf);
    cJSON_AddNumberToObject(proposal, "expires",
                            (double) (ctx->proposal_expires / 1000));
}


static cJSON *
ngx_http_idem_proposal(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    cJSON  *o;

    o = cJSON_CreateObject();
    if (o == NULL) {
        return NULL;
    }

    ngx_http_idem_confirm_add_str(r, o, "operation_id", ctx->op_id.data,
                                  ctx->op_id.len);
    ngx_http_idem_confirm_add_str(r, o, "idempotency_key", ctx->key.data,
                                  ctx->key.len);
    ngx_http_idem_confirm_add_str(r, o, "fingerprint", ctx->fingerprint,
                                  IDEM_FP_HEX_LEN);
    ngx_http_idem_confirm_add_str(r, o, "method", r->method_name.data,
                                  r->method_name.len);
    /* as the client wrote it, port included */
    if (r->headers_in.host) {
        ngx_http_idem_confirm_add_str(r, o, "host",
                                      r->headers_in.host->value.data,
                                      r->headers_in.host->value.len);
    }

    ngx_http_idem_confirm_add_str(r, o, "route", ctx->route.data,
                                  ctx->route.len);
    ngx_http_idem_confirm_add_str(r, o, "query", r->args.data, r->args.len);

    if (ngx_http_idem_confirm_person(r, ctx, o) != NGX_OK
        || ngx_http_idem_confirm_asker(r, ctx, o) != NGX_OK)
    {
        cJSON_Delete(o);
        return NULL;
    }

    ngx_http_idem_confirm_show(r, ctx, o);
    ngx_http_idem_confirm_expiry(ctx, o);
    ngx_http_idem_confirm_approve(ctx, o);

    return o;
}


/* the JSON text of o in the pool, freed here */
static ngx_int_t
ngx_http_idem_confirm_text(ngx_http_request_t *r, cJSON *o, ngx_str_t *out)
{
    char  *text;

    text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);

    if (text == NULL) {
        return NGX_ERROR;
    }

    out->len = ngx_strlen(text);
    out->data = ngx_pnalloc(r->pool, out->len);

    if (out->data == NULL) {
        cJSON_free(text);
        return NGX_ERROR;
    }

    ngx_memcpy(out->data, text, out->len);
    cJSON_free(text);

    return NGX_OK;
}


/*
 * ctx->proposal, made once: the 428 carries it, and the operation id's
 * index keeps it as it was shown (the approval page, idempotency-approve
 * and the status endpoint by operation id show that, never what a client
 * hands over)
 */
ngx_int_t
ngx_http_idem_confirm_proposal(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx)
{
    if (ctx->proposal.len) {
        return NGX_OK;
    }

    return ngx_http_idem_confirm_text(r, ngx_http_idem_proposal(r, ctx),
                                      &ctx->proposal);
}


/* ctx->problem_extra: ",\"name\":" and the JSON text */
static ngx_int_t
ngx_http_idem_confirm_extra(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    const char *name, ngx_str_t *text)
{
    u_char  *p;

    p = ngx_pnalloc(r->pool, text->len + ngx_strlen(name) + 4);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ctx->problem_extra.data = p;
    p = ngx_sprintf(p, ",\"%s\":", name);
    p = ngx_cpymem(p, text->data, text->len);
    ctx->problem_extra.len = p - ctx->problem_extra.data;

    return NGX_OK;
}


/* the 428 answers: a proposal, or why the approval was refused */
ngx_int_t
ngx_http_idem_confirm_send(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_int_t                rc;
    ngx_str_t                reason;
    ngx_http_idem_problem_e  problem;

    ctx->outcome = NGX_HTTP_IDEM_OUT_CONFIRM_REQUIRED;

    if (ctx->answer == NGX_HTTP_IDEM_ANS_CONFIRM
        && ctx->jws_rc == IDEM_JWS_OK)
    {
        problem = NGX_HTTP_IDEM_P_CONFIRM_REQUIRED;
        rc = ngx_http_idem_confirm_proposal(r, ctx);

        if (rc == NGX_OK) {
            rc = ngx_http_idem_confirm_extra(r, ctx, "proposal",
                                             &ctx->proposal);
        }

    } else if (ctx->jws_rc == IDEM_JWS_EXPIRED
               || ctx->answer == NGX_HTTP_IDEM_ANS_APPROVAL_EXPIRED)
    {
        problem = NGX_HTTP_IDEM_P_CONFIRM_EXPIRED;
        rc = NGX_OK;

    } else {
        problem = NGX_HTTP_IDEM_P_CONFIRM_INVALID;
        rc = ngx_http_idem_confirm_text(r,
                 cJSON_CreateString(idem_jws_reason(ctx->jws_rc)), &reason);

        if (rc == NGX_OK) {
            rc = ngx_http_idem_confirm_extra(r, ctx, "reason", &reason);
        }
    }

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* nginx has no reason phrase of its own for 428 (RFC 6585) */
    ngx_str_set(&r->headers_out.status_line, "428 Precondition Required");

    return ngx_http_idem_send_problem(r, ctx, problem, NULL);
}
