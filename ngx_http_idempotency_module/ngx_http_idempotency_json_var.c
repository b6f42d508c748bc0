/*
 * idempotency_json_var $name /json/pointer: a variable whose value is the
 * member of the request's JSON body that the pointer (RFC 6901) names.
 * It is evaluated when read, from the body the module already read for
 * the fingerprint; the body is parsed once per request, however many such
 * variables are read, and the tree lives as long as the request's pool.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_json_var.h"
#include "ngx_http_idempotency_ctx.h"

#include <cjson/cJSON.h>

#include "idem_jcs.h"
#include "idem_json.h"


/* bodies larger than this are not parsed for variables or a proposal */
#define NGX_HTTP_IDEM_JSON_BODY_MAX   (1024 * 1024)



static void
ngx_http_idem_json_var_free(void *data)
{
    cJSON_Delete(data);
}


/* the request body in one buffer, NULL when there is none or too much */
static u_char *
ngx_http_idem_json_var_body(ngx_http_request_t *r, size_t *len)
{
    u_char       *buf, *p;
    size_t        size;
    ssize_t       n;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    if (r->request_body == NULL) {
        return NULL;
    }

    size = 0;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;
        size += ngx_buf_in_memory(b) ? (size_t) (b->last - b->pos)
                : b->in_file ? (size_t) (b->file_last - b->file_pos) : 0;
    }

    if (size == 0 || size > NGX_HTTP_IDEM_JSON_BODY_MAX) {
        return NULL;
    }

    buf = ngx_pnalloc(r->pool, size);
    if (buf == NULL) {
        return NULL;
    }

    p = buf;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;

        if (ngx_buf_in_memory(b)) {
            p = ngx_cpymem(p, b->pos, b->last - b->pos);
            continue;
        }

        if (b->in_file) {
            n = ngx_read_file(b->file, p, b->file_last - b->file_pos,
                              b->file_pos);
            if (n != b->file_last - b->file_pos) {
                return NULL;
            }

            p += n;
        }
    }

    *len = size;

    return buf;
}


/*
 * The parsed body, NULL when there is none to read: no fingerprinted
 * body, or one that was not canonical JSON (so no duplicate member can
 * make what a variable gives differ from what the upstream reads).
 */
cJSON *
ngx_http_idem_json_body(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    u_char              *body;
    size_t               len;
    ngx_pool_cleanup_t  *cln;

    if (ctx->json_parsed) {
        return ctx->json_root;
    }

    /* read too early (a "set" before the body is read): nothing yet */
    if (!ctx->fingerprinted) {
        return NULL;
    }

    ctx->json_parsed = 1;

    if (ctx->body_form != IDEM_BODY_JSON) {
        return NULL;
    }

    body = ngx_http_idem_json_var_body(r, &len);
    if (body == NULL) {
        return NULL;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    ctx->json_root = cJSON_ParseWithLength((char *) body, len);
    cln->handler = ngx_http_idem_json_var_free;
    cln->data = ctx->json_root;

    return ctx->json_root;
}


typedef struct {
    ngx_pool_t  *pool;
    ngx_str_t   *out;
    size_t       size;
} ngx_http_idem_json_var_sink_t;


/* the canonical text, appended to a pool buffer that doubles when full */
static int
ngx_http_idem_json_var_write(idem_sink_t *sink, const char *p, size_t n)
{
    ngx_http_idem_json_var_sink_t *s = sink->data;

    u_char  *buf;
    size_t   size;

    if (s->out->len + n > s->size) {
        size = ngx_max(2 * s->size, s->out->len + n);

        buf = ngx_pnalloc(s->pool, size);
        if (buf == NULL) {
            return -1;
        }

        /* the first growth starts from no buffer at all */
        if (s->out->len) {
            ngx_memcpy(buf, s->out->data, s->out->len);
        }

        s->out->data = buf;
        s->size = size;
    }

    ngx_memcpy(s->out->data + s->out->len, p, n);
    s->out->len += n;

    return 0;
}


/*
 * node's RFC 8785 text (members sorted, numbers exactly as ECMAScript
 * prints them), in the request's pool and NUL-terminated: the form the
 * fingerprint reads a member in, and the one a proposal shows.
 */
ngx_int_t
ngx_http_idem_json_text(ngx_http_request_t *r, const cJSON *node,
    ngx_str_t *text)
{
    idem_sink_t                     sink;
    ngx_http_idem_json_var_sink_t   out;

    ngx_str_null(text);
    out.pool = r->pool;
    out.out = text;
    out.size = 0;
    sink.write = ngx_http_idem_json_var_write;
    sink.data = &out;

    if (idem_json_canonical(node, &sink) != 0
        || sink.write(&sink, "", 1) != 0)
    {
        return NGX_ERROR;
    }

    text->len--;

    return NGX_OK;
}


/*
 * A string member gives its value; anything else its RFC 8785 text, so
 * equal values give equal variables.
 */
static ngx_int_t
ngx_http_idem_json_var_text(ngx_http_request_t *r, const cJSON *node,
    ngx_str_t *value)
{
    if (cJSON_IsString(node)) {
        value->data = (u_char *) node->valuestring;
        value->len = ngx_strlen(node->valuestring);
        return NGX_OK;
    }

    return ngx_http_idem_json_text(r, node, value);
}


static ngx_int_t
ngx_http_idem_json_var_get(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_idem_json_var_t *jv = (ngx_http_idem_json_var_t *) data;

    ngx_str_t             value;
    cJSON                *root;
    const cJSON          *node;
    ngx_http_idem_ctx_t  *ctx;

    ctx = ngx_http_idem_get_ctx(r->main);
    root = ctx ? ngx_http_idem_json_body(r->main, ctx) : NULL;
    node = root ? idem_json_pointer_walk(root, &jv->pointer.parsed) : NULL;

    /*
     * null is no value, as an absent member is: two events whose id is
     * null must not be one identity, nor null a lock's value
     */
    if (node && cJSON_IsNull(node)) {
        node = NULL;
    }

    /* a guard read the body: one of another media type is refused */
    if (ctx && ctx->fingerprinted) {
        ctx->json_read = 1;
    }

    /* a JSON body the variable could not read: the decisions refuse it */
    if (root == NULL && ctx && ctx->fingerprinted
        && ctx->body_form != IDEM_BODY_RAW)
    {
        ctx->json_unreadable = 1;
    }

    ngx_str_null(&value);

    if (node && ngx_http_idem_json_var_text(r, node, &value) != NGX_OK) {
        return NGX_ERROR;
    }

    v->data = value.data;
    v->len = value.len;
    v->valid = 1;
    /* a read before the body is read must not stick */
    v->no_cacheable = 1;
    v->not_found = (node == NULL);

    return NGX_OK;
}


static char *
ngx_http_idem_json_var_check(ngx_conf_t *cf, ngx_http_idem_main_conf_t *mcf,
    ngx_str_t *value)
{
    ngx_uint_t                 i;
    ngx_http_idem_json_var_t  *jv;

    if (value[1].len < 2 || value[1].data[0] != '$') {
        return "needs a variable name that starts with \"$\"";
    }

    jv = mcf->json_vars.elts;

    for (i = 0; i < mcf->json_vars.nelts; i++) {
        if (jv[i].name.len == value[1].len - 1
            && ngx_strncasecmp(jv[i].name.data, value[1].data + 1,
                               jv[i].name.len) == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_json_var\": duplicate "
                               "variable \"%V\"", &value[1]);
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


static void
ngx_http_idem_pointer_free(void *data)
{
    idem_ptr_free(data);
}


/*
 * A pointer of nginx.conf parsed once, freed with the configuration;
 * nginx -t names the directive and the fault of one that is not a
 * member's pointer.
 */
ngx_int_t
ngx_http_idem_pointer_conf(ngx_conf_t *cf, ngx_str_t *directive,
    ngx_str_t *text, ngx_http_idem_pointer_t *ptr)
{
    idem_ptr_rc_t        rc;
    ngx_pool_cleanup_t  *cln;

    /* the cleanup's own copy: ptr may move with the array that holds it */
    cln = ngx_pool_cleanup_add(cf->pool, sizeof(idem_ptr_t));
    if (cln == NULL) {
        return NGX_ERROR;
    }

    ptr->text = *text;
    rc = idem_ptr_parse((char *) text->data, text->len, cln->data);

    if (rc != IDEM_PTR_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\": \"%V\" is not a JSON pointer (RFC 6901) "
                           "of a member: %s", directive, text,
                           idem_ptr_strerror(rc));
        return NGX_ERROR;
    }

    cln->handler = ngx_http_idem_pointer_free;
    ptr->parsed = *(idem_ptr_t *) cln->data;

    return NGX_OK;
}


char *
ngx_http_idem_json_var(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_main_conf_t *mcf = conf;

    char                      *rv;
    ngx_str_t                 *value;
    ngx_http_variable_t       *var;
    ngx_http_idem_json_var_t  *jv;

    value = cf->args->elts;

    rv = ngx_http_idem_json_var_check(cf, mcf, value);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    jv = ngx_array_push(&mcf->json_vars);
    if (jv == NULL) {
        return NGX_CONF_ERROR;
    }

    jv->name.data = value[1].data + 1;
    jv->name.len = value[1].len - 1;

    if (ngx_http_idem_pointer_conf(cf, &cmd->name, &value[2], &jv->pointer)
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    var = ngx_http_add_variable(cf, &jv->name, 0);
    if (var == NULL) {
        return NGX_CONF_ERROR;
    }

    var->get_handler = ngx_http_idem_json_var_get;
    var->data = (uintptr_t) jv;

    return NGX_CONF_OK;
}
