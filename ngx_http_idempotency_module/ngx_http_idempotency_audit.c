/*
 * idempotency_audit: the audit stream's directives, and the entries that
 * ride along with the scripts that change records (docs/audit.md).
 *
 * An entry is hashed here, against the head of the stream this worker
 * expects (redis-scripts/audit.lua checks that head before it writes
 * anything).  Each worker keeps, per stream, the head it predicts once
 * its commands in flight have run, so that commands follow each other
 * without waiting for a reply.  A command that finds another head (a
 * worker or a host appended meanwhile) wrote nothing: it is hashed again
 * against the head Redis reported and sent again; the commands sent after
 * it, chained on its entries, fail the same way and are hashed again in
 * their turn, on top of it.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <openssl/evp.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_audit.h"
#include "ngx_http_idempotency_audit_file.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_conf.h"
#include "ngx_http_idempotency_metrics.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_request.h"
#include "ngx_http_idempotency_tokens.h"


#define NGX_HTTP_IDEM_AUDIT_STREAM   "idem:audit"
#define NGX_HTTP_IDEM_AUDIT_ANCHOR   1000

/* races a command may lose before it gives up (a claim is answered 503) */
#define NGX_HTTP_IDEM_AUDIT_TRIES    100

/* events of one command at most: one stream entry (idem_audit.h) */
#define NGX_HTTP_IDEM_AUDIT_MAX      IDEM_AUDIT_BATCH_MAX

/*
 * completes.lua: two events a completion, one entry; no named args, then
 * each completion's owner, value and ttl at ARGV[3i+4..3i+6], in
 * complete.lua's order
 */
typedef char ngx_http_idem_audit_batch_fits_t[
    (NGX_HTTP_IDEM_AUDIT_BATCH * 2 <= IDEM_AUDIT_BATCH_MAX
     && NGX_HTTP_IDEM_COMPLETES_NARGS == 0
     && NGX_HTTP_IDEM_COMPLETE_NARGS == 3
     && NGX_HTTP_IDEM_COMPLETE_OWNER == 0
     && NGX_HTTP_IDEM_COMPLETE_VALUE == 1
     && NGX_HTTP_IDEM_COMPLETE_TTL == 2) ? 1 : -1];


/* a worker's view of one stream */
typedef struct {
    ngx_http_idem_audit_t       *audit;
    uint64_t                     seq;       /* predicted head */
    u_char                       hash[IDEM_AUDIT_PREV_MAX];
    size_t                       hash_len;
    ngx_uint_t                   gen;       /* of the prediction */
    int64_t                      offset;    /* Redis's clock - ours, ms */
    int64_t                      checked;   /* our ms of the last time sent */
    ngx_uint_t                   scratch;   /* a waiting completion's own:
                                               its entry is not hashed */
} ngx_http_idem_audit_head_t;


/*
 * Kept in the command's block just before its audit arguments (bytes no
 * argument points to, so they are never sent): what a rebuild needs.
 */
typedef struct {
    ngx_http_idem_audit_head_t  *head;
    ngx_uint_t                   gen;
    ngx_uint_t                   tries;
    size_t                       room;      /* meta and arguments */
} ngx_http_idem_audit_meta_t;


/* the arguments after the script's own (audit.lua) */
enum {
    NGX_HTTP_IDEM_AUDIT_EXPECT = 0,
    NGX_HTTP_IDEM_AUDIT_SEQ,
    NGX_HTTP_IDEM_AUDIT_HEAD,        /* "<seq>:<hash>" chained on */
    NGX_HTTP_IDEM_AUDIT_TIME,
    NGX_HTTP_IDEM_AUDIT_ENTRIES
};

/* completes.lua reads the first completion's owner at ARGV[7] */
typedef char ngx_http_idem_audit_completes_at_t[
    (NGX_HTTP_IDEM_AUDIT_ENTRIES + 2 == 6) ? 1 : -1];


static ngx_array_t  *ngx_http_idem_audit_heads;


/* ---- configuration */

/* idempotency_audit_stream <name> [anchor=<n>] */
char *
ngx_http_idem_audit_stream_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    size_t      i;
    ngx_int_t   n;
    ngx_str_t  *value;

    if (lcf->audit_stream.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    for (i = 0; i < value[1].len; i++) {
        if (value[1].data[i] <= 0x20 || value[1].data[i] >= 0x7f) {
            break;
        }
    }

    if (value[1].len == 0 || value[1].len > 200 || i < value[1].len) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_audit_stream\": \"%V\" is not a "
                           "stream name (1 to 200 printable bytes, no "
                           "spaces)", &value[1]);
        return NGX_CONF_ERROR;
    }

    lcf->audit_stream = value[1];
    lcf->audit_anchor = NGX_HTTP_IDEM_AUDIT_ANCHOR;

    if (cf->args->nelts == 2) {
        return NGX_CONF_OK;
    }

    n = NGX_ERROR;

    if (value[2].len > 7 && ngx_strncmp(value[2].data, "anchor=", 7) == 0) {
        n = ngx_atoi(value[2].data + 7, value[2].len - 7);
    }

    if (n <= 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_audit_stream\": invalid parameter "
                           "\"%V\" (anchor=<appends>)", &value[2]);
        return NGX_CONF_ERROR;
    }

    lcf->audit_anchor = (ngx_uint_t) n;

    return NGX_CONF_OK;
}


/* idempotency_audit_key <file>: the chain's HMAC-SHA256 key */
char *
ngx_http_idem_audit_key_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    ngx_str_t  *value;

    if (lcf->audit_key != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    /* the format of an HS256 secret: the file's bytes, at least 32 */
    lcf->audit_key = ngx_http_idem_key_file(cf, &value[1], IDEM_JWS_HS256,
                                            NULL, "idempotency_audit_key");

    return lcf->audit_key ? NGX_CONF_OK : NGX_CONF_ERROR;
}


/* idempotency_audit_ref_header <name>: never one that carries a secret */
char *
ngx_http_idem_audit_ref_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    ngx_str_t   *value;
    ngx_uint_t   i;

    static ngx_str_t  secret[] = {
        ngx_string("set-cookie"), ngx_string("cookie"),
        ngx_string("authorization"), ngx_string("proxy-authorization"),
        ngx_string("www-authenticate"), ngx_null_string
    };

    if (lcf->audit_ref.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    for (i = 0; secret[i].len; i++) {
        if (value[1].len == secret[i].len
            && ngx_strncasecmp(value[1].data, secret[i].data, secret[i].len)
               == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_audit_ref_header\": \"%V\" "
                               "carries secrets, the audit stream never "
                               "keeps it", &value[1]);
            return NGX_CONF_ERROR;
        }
    }

    lcf->audit_ref = value[1];

    return NGX_CONF_OK;
}


/* the identity is the caller's name, never its credentials or the scope */
static char *
ngx_http_idem_audit_check_identity(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *conf)
{
    ngx_str_t   *v;
    ngx_uint_t   i;

    static const char  *secret[] = {
        "$http_authorization", "$http_proxy_authorization", "$http_cookie",
        "$cookie_", NULL
    };

    if (conf->audit_identity == NULL) {
        return NGX_CONF_OK;
    }

    v = &conf->audit_identity->value;

    if (conf->scope && conf->scope->value.len == v->len
        && ngx_strncmp(conf->scope->value.data, v->data, v->len) == 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_audit_identity\" is the scope: the "
                           "audit stream never keeps the scope (it may be a "
                           "secret); name the authenticated caller, e.g. "
                           "$remote_user");
        return NGX_CONF_ERROR;
    }

    for (i = 0; secret[i]; i++) {
        if (ngx_strlcasestrn(v->data, v->data + v->len,
                             (u_char *) secret[i], ngx_strlen(secret[i]) - 1)
            != NULL)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_audit_identity\" \"%V\" holds "
                               "%s: credentials never go into the audit "
                               "stream", v, secret[i]);
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


static ngx_uint_t
ngx_http_idem_audit_same_key(idem_jws_key_t *a, idem_jws_key_t *b)
{
    if (a == NULL || b == NULL) {
        return a == b;
    }

    return a->secret_len == b->secret_len
           && CRYPTO_memcmp(a->secret, b->secret, a->secret_len) == 0;
}


/* the stream of (redis, name), one per configuration */
static char *
ngx_http_idem_audit_find(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *conf)
{
    ngx_uint_t                  i;
    ngx_http_idem_audit_t      *a, **all;
    ngx_http_idem_main_conf_t  *mcf;

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);
    all = mcf->audits.elts;

    for (i = 0; i < mcf->audits.nelts; i++) {
        a = all[i];

        if (a->redis != conf->redis
            || a->on_stream != (conf->audit_on != 0)
            || a->file != conf->audit_file
            || (a->on_stream
                && (a->stream.len != conf->audit_stream.len
                    || ngx_strncmp(a->stream.data, conf->audit_stream.data,
                                   a->stream.len) != 0)))
        {
            continue;
        }

        if (!ngx_http_idem_audit_same_key(a->key, conf->audit_key)
            || a->anchor != conf->audit_anchor)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "audit stream \"%V\" is written with two "
                               "different \"idempotency_audit_key\" or "
                               "anchor= settings: one chain has one key",
                               &a->stream);
            return NGX_CONF_ERROR;
        }

        conf->audit = a;
        return NGX_CONF_OK;
    }

    a = ngx_pcalloc(cf->pool, sizeof(ngx_http_idem_audit_t));
    all = ngx_array_push(&mcf->audits);
    if (a == NULL || all == NULL) {
        return NGX_CONF_ERROR;
    }

    a->redis = conf->redis;
    a->stream = conf->audit_stream;

    a->head_key.len = a->stream.len + sizeof(":head") - 1;
    a->head_key.data = ngx_pnalloc(cf->pool, a->head_key.len + 1);
    if (a->head_key.data == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_sprintf(a->head_key.data, "%V:head%Z", &a->stream);
    a->anchor = conf->audit_anchor;
    a->key = conf->audit_key;
    a->file = conf->audit_file;
    a->on_stream = conf->audit_on != 0;
    *all = a;
    conf->audit = a;

    return NGX_CONF_OK;
}


char *
ngx_http_idem_audit_merge(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *prev,
    ngx_http_idem_loc_conf_t *conf)
{
    ngx_str_t                   name = ngx_string("request_id");
    ngx_http_idem_main_conf_t  *mcf;

    /* the devices go together: "file=" alone turns the stream off */
    if (conf->audit_on == NGX_CONF_UNSET) {
        conf->audit_on = prev->audit_on;
        conf->audit_file = prev->audit_file;
    }

    ngx_conf_merge_value(conf->audit_on, prev->audit_on, 0);
    ngx_conf_merge_ptr_value(conf->audit_file, prev->audit_file, NULL);

    if (conf->audit_stream.data == NULL) {
        conf->audit_stream = prev->audit_stream;
        conf->audit_anchor = prev->audit_anchor;
    }

    if (conf->audit_stream.data == NULL) {
        ngx_str_set(&conf->audit_stream, NGX_HTTP_IDEM_AUDIT_STREAM);
        conf->audit_anchor = NGX_HTTP_IDEM_AUDIT_ANCHOR;
    }

    ngx_conf_merge_ptr_value(conf->audit_key, prev->audit_key, NULL);
    ngx_conf_merge_str_value(conf->audit_ref, prev->audit_ref, "");

    if (conf->audit_identity == NULL) {
        conf->audit_identity = prev->audit_identity;
    }

    if (ngx_http_idem_audit_check_identity(cf, conf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    if ((!conf->audit_on && conf->audit_file == NULL) || conf->redis == NULL)
    {
        return NGX_CONF_OK;
    }

    /* a script changes a record and appends to the stream in one step */
    if (conf->audit_on && conf->redis->topology == NGX_HTTP_IDEM_TOPO_CLUSTER
        && (conf->enable || conf->ops))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_audit\" cannot be used with "
                           "\"idempotency_redis_cluster\": its stream is in "
                           "another hash slot than the records, and Redis "
                           "Cluster runs a script on the keys of one slot "
                           "only");
        return NGX_CONF_ERROR;
    }

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    if (mcf->request_id == NGX_CONF_UNSET) {
        mcf->request_id = ngx_http_get_variable_index(cf, &name);
        if (mcf->request_id == NGX_ERROR) {
            return NGX_CONF_ERROR;
        }
    }

    if (conf->audit_file
        && ngx_http_idem_audit_file_merge(cf, conf->audit_file,
                                          conf->audit_key, conf->audit_anchor)
           != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    return ngx_http_idem_audit_find(cf, conf);
}


void
ngx_http_idem_audit_init_process(void)
{
    ngx_http_idem_audit_heads = NULL;
}


/* ---- a request's part of its entries */

static void
ngx_http_idem_audit_cut(ngx_pool_t *pool, ngx_str_t *dst, u_char *src,
    size_t len)
{
    len = ngx_min(len, IDEM_AUDIT_TEXT_MAX);

    dst->data = ngx_pnalloc(pool, len);
    dst->len = dst->data ? len : 0;

    if (len && dst->data) {
        ngx_memcpy(dst->data, src, len);
    }
}


/* once per request: the caller's identity and the request's id */
ngx_int_t
ngx_http_idem_audit_prepare(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_str_t                   id;
    ngx_http_variable_value_t  *vv;
    ngx_http_idem_main_conf_t  *mcf;

    if (ctx->audit_prepared) {
        return NGX_OK;
    }

    if (ctx->conf->audit_identity) {
        if (ngx_http_complex_value(r, ctx->conf->audit_identity, &id)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        ngx_http_idem_audit_cut(r->pool, &ctx->audit_identity, id.data,
                                id.len);
    }

    mcf = ngx_http_get_module_main_conf(r, ngx_http_idempotency_module);
    vv = &r->variables[mcf->request_id];

    /* not evaluated yet: the entries' id is this request's $request_id */
    if (!vv->valid && !vv->not_found) {
        (void) ngx_http_idem_request_id(r, vv);
    }

    vv = ngx_http_get_indexed_variable(r, mcf->request_id);

    if (vv && !vv->not_found && vv->len == IDEM_TOKEN_LEN) {
        ctx->audit_request.data = vv->data;
        ctx->audit_request.len = vv->len;
    }

    ctx->audit_prepared = 1;

    return NGX_OK;
}


/* the upstream's idempotency_audit_ref_header, from its response */
void
ngx_http_idem_audit_capture_ref(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx)
{
    ngx_table_elt_t  *h;

    if (ctx->conf->audit == NULL || ctx->conf->audit_ref.len == 0) {
        return;
    }

    h = ngx_http_idem_header_out(r, ctx->conf->audit_ref.data,
                                 ctx->conf->audit_ref.len);
    if (h) {
        ngx_http_idem_audit_cut(r->pool, &ctx->audit_ref, h->value.data,
                                h->value.len);
    }
}


/* the reference header among a record's stored headers, for a replay */
void
ngx_http_idem_audit_stored_ref(ngx_http_idem_ctx_t *ctx,
    idem_audit_entry_t *e)
{
    size_t             nlen, vlen;
    ngx_str_t         *name;
    const char        *n, *v;
    idem_hdrs_iter_t   it;

    name = &ctx->conf->audit_ref;
    it.pos = (const char *) ctx->stored_headers.data;
    it.end = it.pos + ctx->stored_headers.len;

    while (name->len && idem_hdrs_next(&it, &n, &nlen, &v, &vlen) == 1) {
        if (nlen == name->len
            && ngx_strncasecmp((u_char *) n, name->data, nlen) == 0)
        {
            e->ref.data = v;
            e->ref.len = ngx_min(vlen, IDEM_AUDIT_TEXT_MAX);
            return;
        }
    }
}


/* what every entry of this request says */
void
ngx_http_idem_audit_entry(ngx_http_idem_ctx_t *ctx, idem_audit_event_e event,
    ngx_uint_t status, idem_audit_entry_t *e)
{
    ngx_memzero(e, sizeof(idem_audit_entry_t));

    e->event = event;
    e->status = (int) status;
    e->op.data = (const char *) ctx->op_id.data;
    e->op.len = ctx->op_id.len;
    e->key.data = (const char *) ctx->key.data;
    e->key.len = ctx->key.len;
    e->route.data = (const char *) ctx->route.data;
    e->route.len = ctx->route.len;
    e->identity.data = (const char *) ctx->audit_identity.data;
    e->identity.len = ctx->audit_identity.len;
    e->request.data = (const char *) ctx->audit_request.data;
    e->request.len = ctx->audit_request.len;
    e->approver.data = (const char *) ctx->approver.data;
    e->approver.len = ngx_min(ctx->approver.len, IDEM_AUDIT_TEXT_MAX);

    if (ctx->fingerprinted) {
        e->fp.data = (const char *) ctx->fingerprint;
        e->fp.len = IDEM_FP_HEX_LEN;
    }
}


/* SHA-256 in hex of a response body: a chain of buffers, or one string */
ngx_int_t
ngx_http_idem_audit_digest(ngx_pool_t *pool, ngx_chain_t *cl,
    ngx_str_t *body, idem_str_t *hex)
{
    int                  ok;
    u_char              *out;
    unsigned int         n;
    unsigned char        digest[EVP_MAX_MD_SIZE];
    static EVP_MD_CTX   *md;

    /*
     * one context for the process: a completion's digest then costs no
     * allocation of a context.  Only the event loop may call this, never
     * a thread pool's task (ngx_http_idem_body_run).
     */
    if (md == NULL) {
        md = EVP_MD_CTX_new();
    }

    out = ngx_pnalloc(pool, IDEM_AUDIT_HASH_LEN + 1);

    ok = out && md && EVP_DigestInit_ex(md, idem_sha256(), NULL);

    if (ok && body && body->len) {
        ok = EVP_DigestUpdate(md, body->data, body->len);
    }

    for ( /* void */ ; ok && cl; cl = cl->next) {
        if (cl->buf->last != cl->buf->pos) {
            ok = EVP_DigestUpdate(md, cl->buf->pos,
                                  cl->buf->last - cl->buf->pos);
        }
    }

    ok = ok && EVP_DigestFinal_ex(md, digest, &n);

    if (!ok) {
        return NGX_ERROR;
    }

    idem_hex(digest, n, (char *) out);
    hex->data = (const char *) out;
    hex->len = IDEM_AUDIT_HASH_LEN;

    return NGX_OK;
}


/* ---- the entries in a command */

static ngx_http_idem_audit_head_t *
ngx_http_idem_audit_head(ngx_http_idem_audit_t *audit)
{
    ngx_uint_t                    i;
    ngx_http_idem_audit_head_t  **heads, *h;

    if (ngx_http_idem_audit_heads == NULL) {
        ngx_http_idem_audit_heads = ngx_array_create(ngx_cycle->pool, 2,
                                        sizeof(ngx_http_idem_audit_head_t *));
        if (ngx_http_idem_audit_heads == NULL) {
            return NULL;
        }
    }

    heads = ngx_http_idem_audit_heads->elts;

    for (i = 0; i < ngx_http_idem_audit_heads->nelts; i++) {
        if (heads[i]->audit == audit) {
            return heads[i];
        }
    }

    /* nothing known yet: the first command learns the head from Redis */
    h = ngx_pcalloc(ngx_cycle->pool, sizeof(ngx_http_idem_audit_head_t));
    heads = ngx_array_push(ngx_http_idem_audit_heads);
    if (h == NULL || heads == NULL) {
        return NULL;
    }

    /* an empty stream's: the first entry is chained on 32 zero bytes */
    h->audit = audit;
    h->hash_len = IDEM_AUDIT_DIGEST_LEN;
    *heads = h;

    return h;
}


static size_t
ngx_http_idem_audit_room(ngx_http_idem_audit_t *audit, ngx_str_t *expect,
    idem_audit_entry_t *e, ngx_uint_t n)
{
    size_t      size;
    ngx_uint_t  i;

    size = sizeof(ngx_http_idem_audit_meta_t) + expect->len
           + 3 * NGX_INT64_LEN + 1 + IDEM_AUDIT_PREV_MAX;

    /* the stream: one entry of the events; the file alone: each packed */
    if (audit->on_stream && n) {
        size += IDEM_AUDIT_DIGEST_LEN + idem_audit_batch_max(e, n);
    }

    for (i = 0; !audit->on_stream && i < n; i++) {
        size += IDEM_AUDIT_HASH_LEN + ngx_http_idem_audit_file_packed(&e[i]);
    }

    return size;
}


/*
 * The audit file alone: the events never go to Redis, each kept packed in
 * its pair of arguments (its hash unused, zeros) for the file once the
 * change is made.
 */
static void
ngx_http_idem_audit_write_packed(ngx_http_idem_cmd_t *cmd, ngx_uint_t at,
    idem_audit_entry_t *e, ngx_uint_t n)
{
    u_char      *h, *p, *end;
    ngx_uint_t   i;

    for (i = 0; i < n; i++) {
        h = ngx_http_idem_cmd_reserve(cmd, at + NGX_HTTP_IDEM_AUDIT_ENTRIES
                                           + 2 * i, IDEM_AUDIT_HASH_LEN);
        p = ngx_http_idem_cmd_start(cmd, at + NGX_HTTP_IDEM_AUDIT_ENTRIES
                                         + 2 * i + 1);
        end = ngx_http_idem_audit_file_pack(p, &e[i]);
        ngx_http_idem_cmd_end(cmd, at + NGX_HTTP_IDEM_AUDIT_ENTRIES
                                   + 2 * i + 1, end);
        ngx_memzero(h, IDEM_AUDIT_HASH_LEN);
    }
}


/* the head's hash: the entry's p[0..end), hashed (with the key, if any) */
static ngx_int_t
ngx_http_idem_audit_seal(ngx_http_idem_audit_head_t *head, u_char *p,
    u_char *end)
{
    size_t                key_len;
    const unsigned char  *key;

    /* a waiting completion's entry is hashed again when it is sent */
    if (head->scratch) {
        ngx_memzero(head->hash, IDEM_AUDIT_DIGEST_LEN);
        return NGX_OK;
    }

    key = head->audit->key ? head->audit->key->secret : NULL;
    key_len = head->audit->key ? head->audit->key->secret_len : 0;

    return idem_audit_digest((char *) p, end - p, key, key_len, head->hash)
           == 0 ? NGX_OK : NGX_ERROR;
}


/*
 * The audit arguments, written at cmd->pos: the meta, then "expect",
 * the head expected and one entry chained on it that carries the events
 * e[0..n), hashed; the head predicted moves past it.
 */
static ngx_int_t
ngx_http_idem_audit_write(ngx_http_idem_cmd_t *cmd,
    ngx_http_idem_audit_meta_t *meta, ngx_str_t *expect,
    idem_audit_entry_t *e, ngx_uint_t n)
{
    u_char                      *h, *p, *end;
    int64_t                      now, local;
    ngx_uint_t                   i, at;
    ngx_http_idem_audit_head_t  *head;

    head = meta->head;
    meta->gen = head->gen;
    ngx_memcpy(cmd->pos, meta, sizeof(ngx_http_idem_audit_meta_t));
    cmd->pos += sizeof(ngx_http_idem_audit_meta_t);

    at = cmd->redis->scripts[cmd->script].nargs;

    /* nothing expected is ngx_null_string, whose NULL memcpy must not see */
    ngx_http_idem_cmd_set(cmd, at + NGX_HTTP_IDEM_AUDIT_EXPECT,
                          expect->len ? expect->data : (u_char *) "",
                          expect->len);
    ngx_http_idem_cmd_set_num(cmd, at + NGX_HTTP_IDEM_AUDIT_SEQ,
                              (int64_t) head->seq + 1);
    p = ngx_http_idem_cmd_start(cmd, at + NGX_HTTP_IDEM_AUDIT_HEAD);
    p = ngx_sprintf(p, "%uL:", head->seq);
    p = ngx_cpymem(p, head->hash, head->hash_len);
    ngx_http_idem_cmd_end(cmd, at + NGX_HTTP_IDEM_AUDIT_HEAD, p);

    /*
     * Redis checks the time against its clock (TIME) with the first
     * command of each second only: a call of TIME in every script was a
     * tenth of an audited first write's Redis time (bench/RESULTS.md)
     */
    local = ngx_http_idem_now_ms();
    now = local + head->offset;

    if (local - head->checked >= 1000 || local < head->checked) {
        head->checked = local;
        ngx_http_idem_cmd_set_num(cmd, at + NGX_HTTP_IDEM_AUDIT_TIME, now);

    } else {
        ngx_http_idem_cmd_set(cmd, at + NGX_HTTP_IDEM_AUDIT_TIME, "", 0);
    }

    if (n == 0) {
        return NGX_OK;
    }

    for (i = 0; i < n; i++) {
        e[i].seq = head->seq + 1;
        e[i].time = now;
        e[i].prev.data = (const char *) head->hash;
        e[i].prev.len = head->hash_len;
    }

    if (!head->audit->on_stream) {
        ngx_http_idem_audit_write_packed(cmd, at, e, n);
        ngx_memzero(head->hash, IDEM_AUDIT_DIGEST_LEN);
        head->hash_len = IDEM_AUDIT_DIGEST_LEN;
        head->seq += n;
        return NGX_OK;
    }

    h = ngx_http_idem_cmd_reserve(cmd, at + NGX_HTTP_IDEM_AUDIT_ENTRIES,
                                  IDEM_AUDIT_DIGEST_LEN);
    p = ngx_http_idem_cmd_start(cmd, at + NGX_HTTP_IDEM_AUDIT_ENTRIES + 1);
    end = (u_char *) idem_audit_batch_encode((char *) p, e, n);
    ngx_http_idem_cmd_end(cmd, at + NGX_HTTP_IDEM_AUDIT_ENTRIES + 1, end);

    if (ngx_http_idem_audit_seal(head, p, end) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_memcpy(h, head->hash, IDEM_AUDIT_DIGEST_LEN);
    head->hash_len = IDEM_AUDIT_DIGEST_LEN;
    head->seq++;

    return NGX_OK;
}


/* complete, release, fail: their owner token is their condition */
static ngx_uint_t
ngx_http_idem_audit_fenced(ngx_http_idem_script_e script)
{
    return script == NGX_HTTP_IDEM_SCRIPT_COMPLETE
           || script == NGX_HTTP_IDEM_SCRIPT_COMPLETES
           || script == NGX_HTTP_IDEM_SCRIPT_RELEASE
           || script == NGX_HTTP_IDEM_SCRIPT_FAIL;
}


/*
 * A completion with the stream as the only device waits for the end of
 * the event loop's turn, when the turn's completions go to Redis in one
 * completes.lua and one entry (ngx_http_idempotency_close_batch.c): a
 * script call, the audit's arguments, a head check and an XADD per first
 * write were most of what the stream cost Redis (bench/RESULTS.md).  Its
 * entry is hashed on a head of its own here, and on the stream's then.
 */
static ngx_uint_t
ngx_http_idem_audit_batched(ngx_http_idem_audit_t *audit,
    ngx_http_idem_script_e script, ngx_uint_t nentries)
{
    return script == NGX_HTTP_IDEM_SCRIPT_COMPLETE && audit->on_stream
           && audit->file == NULL && nentries != 0
           && nentries <= IDEM_AUDIT_BATCH_MAX / NGX_HTTP_IDEM_AUDIT_BATCH;
}


/*
 * The audit file alone and a fenced script (complete, release, fail): the
 * script has nothing to decide for the audit (its owner token is its
 * condition) and its own reply says whether it made the change (1), so
 * Redis gets the command as without the audit; the entries and the audit
 * arguments ride along unsent.
 */
static ngx_uint_t
ngx_http_idem_audit_lean(ngx_http_idem_audit_t *audit,
    ngx_http_idem_script_e script)
{
    return !audit->on_stream && ngx_http_idem_audit_fenced(script);
}


/*
 * The claim of a key the first look found free, with the stream and no
 * unique or lock key: claimnew.lua, claim.lua's free-key case alone,
 * instead of claim.lua, which defines what every other case needs on each
 * call.  The command stays claim.lua's, with all its arguments: Redis
 * gets only those claimnew.lua reads ("skip" leaves out the others, each a
 * Lua string made for nothing), a NOSCRIPT resends claim.lua's text with
 * all of them, and a key taken since the look is given to claim.lua
 * (ngx_http_idem_audit_look()).  Its reply 1 is claim.lua's
 * {"audited", {"claimed"}}.
 */

/* claimnew.lua's arguments are claim.lua's value and ttl, in this order */
typedef char ngx_http_idem_audit_claimnew_args_t[
    (NGX_HTTP_IDEM_CLAIMNEW_NARGS == 2 && NGX_HTTP_IDEM_CLAIMNEW_VALUE == 0
     && NGX_HTTP_IDEM_CLAIMNEW_TTL == 1
     && NGX_HTTP_IDEM_CLAIM_VALUE < NGX_HTTP_IDEM_CLAIM_TTL
     && NGX_HTTP_IDEM_CLAIM_NARGS <= 32) ? 1 : -1];

#define NGX_HTTP_IDEM_AUDIT_CLAIMNEW_SKIP                                    \
    ((((uint32_t) 1 << NGX_HTTP_IDEM_CLAIM_NARGS) - 1)                       \
     & ~((uint32_t) 1 << NGX_HTTP_IDEM_CLAIM_VALUE)                          \
     & ~((uint32_t) 1 << NGX_HTTP_IDEM_CLAIM_TTL))

static void
ngx_http_idem_audit_claimnew(ngx_http_idem_cmd_t *cmd, ngx_str_t *expect)
{
    if (expect->len == sizeof("claim") - 1
        && ngx_strncmp(expect->data, "claim", expect->len) == 0)
    {
        cmd->argv[1] = (const char *)
                       cmd->redis->scripts[NGX_HTTP_IDEM_SCRIPT_CLAIMNEW].sha1;
        cmd->skip = NGX_HTTP_IDEM_AUDIT_CLAIMNEW_SKIP;
    }
}


static ngx_uint_t
ngx_http_idem_audit_is_claimnew(ngx_http_idem_cmd_t *cmd)
{
    return !cmd->eval && cmd->script == NGX_HTTP_IDEM_SCRIPT_CLAIM
           && cmd->argv[1] == (const char *)
                  cmd->redis->scripts[NGX_HTTP_IDEM_SCRIPT_CLAIMNEW].sha1;
}


/* claim.lua's reply for claimnew.lua's 1: {"claimed"} */
static redisReply *
ngx_http_idem_audit_claimed(void)
{
    static redisReply   claimed, word, *elts[1];

    word.type = REDIS_REPLY_STRING;
    word.str = (char *) "claimed";
    word.len = sizeof("claimed") - 1;
    elts[0] = &word;
    claimed.type = REDIS_REPLY_ARRAY;
    claimed.elements = 1;
    claimed.element = elts;

    return &claimed;
}


/*
 * The audit arguments of a new command; a completion that waits for its
 * turn's others is hashed on a head of its own (audit_batched()), the
 * stream's prediction left as it is.
 */
static ngx_int_t
ngx_http_idem_audit_write_first(ngx_http_idem_cmd_t *cmd,
    ngx_http_idem_audit_meta_t *meta, ngx_str_t *expect,
    idem_audit_entry_t *e, ngx_uint_t n)
{
    u_char                      *start;
    ngx_http_idem_audit_head_t   own, *real;

    real = meta->head;

    if (!ngx_http_idem_audit_batched(real->audit, cmd->script, n)) {
        return ngx_http_idem_audit_write(cmd, meta, expect, e, n);
    }

    start = cmd->pos;
    own = *real;
    own.scratch = 1;
    meta->head = &own;

    if (ngx_http_idem_audit_write(cmd, meta, expect, e, n) != NGX_OK) {
        return NGX_ERROR;
    }

    meta->head = real;
    ngx_memcpy(start, meta, sizeof(ngx_http_idem_audit_meta_t));

    return NGX_OK;
}


ngx_http_idem_cmd_t *
ngx_http_idem_audit_cmd(ngx_http_idem_audit_t *audit,
    ngx_http_idem_script_e script, const u_char *key, u_char **keys,
    ngx_uint_t n, size_t size, ngx_str_t *expect, idem_audit_entry_t *e,
    ngx_uint_t nentries, ngx_log_t *log)
{
    u_char                      *start, *all[NGX_HTTP_IDEM_BUSINESS_KEYS + 2];
    u_char                       rkey[IDEM_RECORD_KEY_LEN + 1];
    ngx_uint_t                   i, at, lean, pairs;
    ngx_http_idem_cmd_t         *cmd;
    ngx_http_idem_audit_meta_t   meta;

    ngx_memzero(&meta, sizeof(ngx_http_idem_audit_meta_t));

    meta.head = ngx_http_idem_audit_head(audit);
    if (meta.head == NULL || n > NGX_HTTP_IDEM_BUSINESS_KEYS
        || nentries > NGX_HTTP_IDEM_AUDIT_MAX)
    {
        return NULL;
    }

    for (i = 0; i < n; i++) {
        all[i] = keys[i];
    }

    /*
     * without the stream the scripts still decide as with it (audit.lua),
     * so they get a key in the slot of the record, which they never touch
     */
    ngx_memcpy(rkey, key, IDEM_RECORD_KEY_LEN);
    rkey[IDEM_RECORD_KEY_LEN] = '\0';
    all[n] = audit->on_stream ? audit->stream.data : rkey;
    all[n + 1] = audit->on_stream ? audit->head_key.data : rkey;
    meta.room = ngx_http_idem_audit_room(audit, expect, e, nentries);
    lean = ngx_http_idem_audit_lean(audit, script);

    /* the stream: one entry of the events; the file alone: each packed */
    pairs = audit->on_stream ? (nentries != 0) : nentries;

    cmd = ngx_http_idem_cmd_create_more(audit->redis, script, key, all,
                                        lean ? n : n + 2,
                                        NGX_HTTP_IDEM_AUDIT_ENTRIES
                                        + 2 * pairs,
                                        size + meta.room, log);
    if (cmd == NULL) {
        return NULL;
    }

    /* the script's own arguments go after the room kept for these */
    start = cmd->pos;

    if (ngx_http_idem_audit_write_first(cmd, &meta, expect, e, nentries)
        != NGX_OK)
    {
        ngx_free(cmd);
        return NULL;
    }

    cmd->pos = start + meta.room;

    /*
     * the file alone: seq "0" tells audit.lua to append nothing, and the
     * entries stay here for the file, unsent
     */
    if (!audit->on_stream && nentries) {
        at = cmd->arg0 + cmd->redis->scripts[script].nargs;
        cmd->argv[at + NGX_HTTP_IDEM_AUDIT_SEQ] = "0";
        cmd->argvlen[at + NGX_HTTP_IDEM_AUDIT_SEQ] = 1;
        cmd->hidden = 2 * pairs;
    }

    if (lean) {
        cmd->hidden = NGX_HTTP_IDEM_AUDIT_ENTRIES + 2 * pairs;
    }

    if (script == NGX_HTTP_IDEM_SCRIPT_CLAIM && audit->on_stream && n == 0
        && nentries)
    {
        ngx_http_idem_audit_claimnew(cmd, expect);
    }

    return cmd;
}


/* the command's audit arguments begin at this index, or NGX_ERROR */
static ngx_int_t
ngx_http_idem_audit_at(ngx_http_idem_cmd_t *cmd)
{
    ngx_uint_t  at;

    if (cmd->script == NGX_HTTP_IDEM_NSCRIPTS || cmd->batched) {
        return NGX_ERROR;
    }

    at = cmd->redis->scripts[cmd->script].nargs;

    return cmd->argc >= cmd->arg0 + at + NGX_HTTP_IDEM_AUDIT_ENTRIES
           ? (ngx_int_t) at : NGX_ERROR;
}


static void
ngx_http_idem_audit_meta(ngx_http_idem_cmd_t *cmd, ngx_uint_t at,
    ngx_http_idem_audit_meta_t *meta)
{
    ngx_str_t  expect;

    expect = ngx_http_idem_cmd_get(cmd, at + NGX_HTTP_IDEM_AUDIT_EXPECT);
    ngx_memcpy(meta, expect.data - sizeof(ngx_http_idem_audit_meta_t),
               sizeof(ngx_http_idem_audit_meta_t));
}


/* the stream a command's entries go to, or NULL */
ngx_http_idem_audit_t *
ngx_http_idem_audit_of(ngx_http_idem_cmd_t *cmd)
{
    ngx_int_t                   at;
    ngx_http_idem_audit_meta_t  meta;

    at = ngx_http_idem_audit_at(cmd);
    if (at == NGX_ERROR) {
        return NULL;
    }

    ngx_http_idem_audit_meta(cmd, at, &meta);

    return meta.head->audit;
}


/*
 * The events a command carries, decoded: their strings point into it, and
 * their digests' hex into memory the next call reuses (every caller uses
 * them at once, before it returns to the event loop).
 */
ngx_uint_t
ngx_http_idem_audit_entries(ngx_http_idem_cmd_t *cmd, idem_audit_entry_t *e,
    ngx_uint_t max)
{
    ngx_int_t                   at;
    ngx_str_t                   enc;
    ngx_uint_t                  i, n;
    ngx_http_idem_audit_meta_t  meta;

    static idem_audit_events_t  ev;

    at = ngx_http_idem_audit_at(cmd);
    if (at == NGX_ERROR
        || cmd->argc < cmd->arg0 + at + NGX_HTTP_IDEM_AUDIT_ENTRIES + 2)
    {
        return 0;
    }

    ngx_http_idem_audit_meta(cmd, at, &meta);

    if (meta.head->audit->on_stream) {
        enc = ngx_http_idem_cmd_get(cmd, at + NGX_HTTP_IDEM_AUDIT_ENTRIES + 1);

        if (idem_audit_events_decode((char *) enc.data, enc.len, &ev) != 0) {
            return 0;
        }

        for (i = 0; i < ev.n && i < max; i++) {
            e[i] = ev.e[i];
        }

        return i;
    }

    n = (cmd->argc - cmd->arg0 - at - NGX_HTTP_IDEM_AUDIT_ENTRIES) / 2;

    for (i = 0; i < n && i < max; i++) {
        enc = ngx_http_idem_cmd_get(cmd, at + NGX_HTTP_IDEM_AUDIT_ENTRIES
                                         + 2 * i + 1);

        if (ngx_http_idem_audit_file_unpack(enc.data, enc.len, &e[i])
            != NGX_OK)
        {
            return 0;
        }
    }

    return i;
}


/* {"audit-head", seq, hash, time}: a lost race, nothing was written */
static ngx_int_t
ngx_http_idem_audit_lost(redisReply *reply, ngx_http_idem_audit_meta_t *meta)
{
    ngx_int_t                    seq, now;
    ngx_str_t                    hash;
    ngx_http_idem_audit_head_t  *head;

    if (reply->elements != 4
        || reply->element[1]->type != REDIS_REPLY_STRING
        || reply->element[3]->type != REDIS_REPLY_STRING
        || ngx_http_idem_reply_str(reply->element[2], &hash) != NGX_OK
        || hash.len > IDEM_AUDIT_PREV_MAX)
    {
        return NGX_ERROR;
    }

    seq = ngx_atoi((u_char *) reply->element[1]->str, reply->element[1]->len);
    now = ngx_atoi((u_char *) reply->element[3]->str, reply->element[3]->len);

    if (seq < 0 || now < 0) {
        return NGX_ERROR;
    }

    head = meta->head;
    head->offset = (int64_t) now - ngx_http_idem_now_ms();
    ngx_http_idem_metrics_audit(0, 1);

    /* the first of the commands chained on a stale head resets it */
    if (meta->gen == head->gen) {
        head->gen++;
        head->seq = (uint64_t) seq;
        head->hash_len = hash.len;
        ngx_memcpy(head->hash, hash.data, hash.len);
    }

    return NGX_OK;
}


/* a copy of the command, its entries hashed anew on the head predicted now */
static ngx_http_idem_cmd_t *
ngx_http_idem_audit_rewrite(ngx_http_idem_cmd_t *cmd, ngx_uint_t at,
    ngx_http_idem_audit_meta_t *meta)
{
    u_char               *start;
    ngx_str_t             expect;
    ngx_uint_t            n;
    ngx_http_idem_cmd_t  *copy;
    idem_audit_entry_t    e[NGX_HTTP_IDEM_AUDIT_MAX];

    n = ngx_http_idem_audit_entries(cmd, e, NGX_HTTP_IDEM_AUDIT_MAX);

    copy = ngx_http_idem_cmd_copy(cmd);
    if (copy == NULL) {
        return NULL;
    }

    expect = ngx_http_idem_cmd_get(cmd, at + NGX_HTTP_IDEM_AUDIT_EXPECT);

    start = (u_char *) copy->argv[copy->arg0 + at + NGX_HTTP_IDEM_AUDIT_EXPECT]
            - sizeof(ngx_http_idem_audit_meta_t);
    copy->pos = start;

    if (ngx_http_idem_audit_write(copy, meta, &expect, e, n) != NGX_OK) {
        ngx_free(copy);
        return NULL;
    }

    copy->pos = start + meta->room;

    return copy;
}


/*
 * Each waiting completion's events, in order, into e; their strings point
 * into the commands and into ev (one decoding per command: the hex of
 * its digests is kept there).
 */
static ngx_uint_t
ngx_http_idem_audit_gather(ngx_http_idem_cmd_t **m, ngx_uint_t n,
    idem_audit_entry_t *e, size_t *size)
{
    ngx_str_t   enc;
    ngx_uint_t  i, k, ne, at;

    static idem_audit_events_t  ev[NGX_HTTP_IDEM_AUDIT_BATCH];

    ne = 0;
    *size = 0;

    for (i = 0; i < n; i++) {
        at = m[i]->redis->scripts[m[i]->script].nargs;
        enc = ngx_http_idem_cmd_get(m[i], at + NGX_HTTP_IDEM_AUDIT_ENTRIES + 1);

        if (idem_audit_events_decode((char *) enc.data, enc.len, &ev[i]) != 0
            || ne + ev[i].n > NGX_HTTP_IDEM_AUDIT_MAX)
        {
            return 0;
        }

        for (k = 0; k < ev[i].n; k++) {
            e[ne++] = ev[i].e[k];
        }

        for (k = 0; k < NGX_HTTP_IDEM_COMPLETE_NARGS; k++) {
            *size += ngx_http_idem_cmd_get(m[i], k).len;
        }
    }

    return ne;
}


/* completes.lua: the records, the stream, its head; the entry; each's args */
static ngx_http_idem_cmd_t *
ngx_http_idem_audit_completes(ngx_http_idem_cmd_t **m, ngx_uint_t n,
    ngx_http_idem_audit_meta_t *meta)
{
    u_char                 *start, *keys[NGX_HTTP_IDEM_AUDIT_BATCH + 1];
    u_char                  rk[NGX_HTTP_IDEM_AUDIT_BATCH][IDEM_RECORD_KEY_LEN + 1];
    size_t                  size;
    ngx_str_t               expect = ngx_null_string, arg;
    ngx_uint_t              i, k, ne;
    ngx_http_idem_cmd_t    *cmd;
    ngx_http_idem_audit_t  *audit;
    idem_audit_entry_t      e[NGX_HTTP_IDEM_AUDIT_MAX];

    ne = ngx_http_idem_audit_gather(m, n, e, &size);
    if (ne == 0) {
        return NULL;
    }

    audit = meta->head->audit;

    for (i = 1; i < n; i++) {
        ngx_memcpy(rk[i], m[i]->key, IDEM_RECORD_KEY_LEN);
        rk[i][IDEM_RECORD_KEY_LEN] = '\0';
        keys[i - 1] = rk[i];
    }

    keys[n - 1] = audit->stream.data;
    keys[n] = audit->head_key.data;
    meta->room = ngx_http_idem_audit_room(audit, &expect, e, ne);

    cmd = ngx_http_idem_cmd_create_more(m[0]->redis,
                                        NGX_HTTP_IDEM_SCRIPT_COMPLETES,
                                        m[0]->key, keys, n + 1,
                                        NGX_HTTP_IDEM_AUDIT_ENTRIES + 2
                                        + NGX_HTTP_IDEM_COMPLETE_NARGS * n,
                                        size + meta->room, m[0]->redis->log);
    if (cmd == NULL) {
        return NULL;
    }

    start = cmd->pos;

    if (ngx_http_idem_audit_write(cmd, meta, &expect, e, ne) != NGX_OK) {
        ngx_free(cmd);
        return NULL;
    }

    cmd->pos = start + meta->room;
    cmd->durable = 1;

    for (i = 0; i < n; i++) {
        for (k = 0; k < NGX_HTTP_IDEM_COMPLETE_NARGS; k++) {
            arg = ngx_http_idem_cmd_get(m[i], k);
            ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_AUDIT_ENTRIES + 2
                                       + NGX_HTTP_IDEM_COMPLETE_NARGS * i + k,
                                  arg.data, arg.len);
        }
    }

    return cmd;
}


/* the same entries, hashed anew on the head predicted now, sent again */
static ngx_int_t
ngx_http_idem_audit_again(ngx_http_idem_cmd_t *cmd, ngx_uint_t at,
    ngx_http_idem_audit_meta_t *meta, ngx_http_idem_cmd_t **next)
{
    ngx_http_idem_cmd_t  *copy;

    if (++meta->tries > NGX_HTTP_IDEM_AUDIT_TRIES) {
        ngx_log_error(NGX_LOG_ERR, cmd->redis->log, 0,
                      "idempotency: %s script lost the race for the head of "
                      "audit stream \"%V\" %d times, given up",
                      cmd->redis->scripts[cmd->script].name,
                      &meta->head->audit->stream,
                      NGX_HTTP_IDEM_AUDIT_TRIES);
        return NGX_ERROR;
    }

    copy = ngx_http_idem_audit_rewrite(cmd, at, meta);
    if (copy == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_idem_cmd_send(copy, cmd->handler, cmd->data) == NGX_ERROR) {
        return NGX_ERROR;
    }

    *next = copy;

    return NGX_AGAIN;
}


/*
 * claimnew.lua found the key taken since the first look, and wrote
 * nothing: the same command, claim.lua's text, decides (its entries are
 * still the next ones this worker predicted).
 */
static ngx_int_t
ngx_http_idem_audit_look(ngx_http_idem_cmd_t *cmd, ngx_http_idem_cmd_t **next)
{
    ngx_http_idem_cmd_t  *copy;

    if (cmd->data == NULL && !cmd->durable) {
        return NGX_DECLINED;
    }

    copy = ngx_http_idem_cmd_copy(cmd);
    if (copy == NULL) {
        return NGX_ERROR;
    }

    copy->argv[0] = "EVALSHA";
    copy->argvlen[0] = sizeof("EVALSHA") - 1;
    copy->argv[1] = (const char *) cmd->redis->scripts[cmd->script].sha1;
    copy->argvlen[1] = NGX_HTTP_IDEM_SHA1_HEX;
    copy->eval = 0;
    copy->skip = 0;

    if (ngx_http_idem_cmd_send(copy, cmd->handler, cmd->data) == NGX_ERROR) {
        return NGX_ERROR;
    }

    *next = copy;

    return NGX_AGAIN;
}


/* the entries are in the stream: count them, and log the anchored head */
static void
ngx_http_idem_audit_appended(ngx_http_idem_cmd_t *cmd, ngx_uint_t at,
    ngx_http_idem_audit_meta_t *meta)
{
    u_char       hex[IDEM_AUDIT_HASH_LEN];
    ngx_int_t    seq;
    ngx_str_t    first, hash;

    if (cmd->argc < cmd->arg0 + at + NGX_HTTP_IDEM_AUDIT_ENTRIES + 2) {
        return;
    }

    first = ngx_http_idem_cmd_get(cmd, at + NGX_HTTP_IDEM_AUDIT_SEQ);
    seq = ngx_atoi(first.data, first.len);

    ngx_http_idem_metrics_audit(1, 0);

    if (seq > 0 && seq % meta->head->audit->anchor == 0) {
        hash = ngx_http_idem_cmd_get(cmd, at + NGX_HTTP_IDEM_AUDIT_ENTRIES);
        ngx_hex_dump(hex, hash.data, ngx_min(hash.len, IDEM_AUDIT_DIGEST_LEN));
        ngx_log_error(NGX_LOG_NOTICE, cmd->redis->log, 0,
                      "idempotency: audit stream \"%V\" head %i %*s",
                      &meta->head->audit->stream, seq,
                      (size_t) IDEM_AUDIT_HASH_LEN, hex);
    }
}


/* entries that were not appended: the head predicted past them is wrong */
static void
ngx_http_idem_audit_unused(ngx_http_idem_cmd_t *cmd, ngx_uint_t at,
    ngx_http_idem_audit_meta_t *meta)
{
    u_char                      *colon;
    ngx_int_t                    seq;
    ngx_str_t                    first, prev;
    ngx_http_idem_audit_head_t  *head;

    head = meta->head;

    if (cmd->argc == cmd->arg0 + at + NGX_HTTP_IDEM_AUDIT_ENTRIES
        || meta->gen != head->gen)
    {
        return;
    }

    first = ngx_http_idem_cmd_get(cmd, at + NGX_HTTP_IDEM_AUDIT_SEQ);
    prev = ngx_http_idem_cmd_get(cmd, at + NGX_HTTP_IDEM_AUDIT_HEAD);
    seq = ngx_atoi(first.data, first.len);

    /* "<seq>:<hash>": the hash after the colon */
    colon = ngx_strlchr(prev.data, prev.data + prev.len, ':');

    if (seq < 1 || colon == NULL) {
        return;
    }

    prev.len -= colon + 1 - prev.data;
    prev.data = colon + 1;

    if (prev.len > IDEM_AUDIT_PREV_MAX) {
        return;
    }

    head->gen++;
    head->seq = (uint64_t) seq - 1;
    head->hash_len = prev.len;
    ngx_memcpy(head->hash, prev.data, prev.len);
}


/*
 * The same for a command whose data is a request's context (NULL once the
 * request has gone): NGX_DONE when the reply is dealt with (sent again,
 * the context following the copy; or nobody waits), else NGX_OK with the
 * context's command cleared and *reply the script's own, or NULL when
 * nothing can be said (a race lost too often: nothing was written);
 * *appended says whether the entries went in.
 */
ngx_int_t
ngx_http_idem_audit_ctx_reply(ngx_http_idem_cmd_t *cmd, redisReply **reply,
    ngx_uint_t *appended)
{
    ngx_int_t             rc;
    ngx_http_idem_cmd_t  *next;
    ngx_http_idem_ctx_t  *ctx;

    ctx = cmd->data;
    rc = ngx_http_idem_audit_reply(cmd, reply, &next);

    /* a durable command may outlive its request: no ctx then */
    if (ctx == NULL || rc == NGX_DECLINED) {
        return NGX_DONE;
    }

    if (rc == NGX_AGAIN) {
        ctx->cmd = next;
        return NGX_DONE;
    }

    ctx->cmd = NULL;
    *appended = (rc == NGX_DONE || rc == NGX_ABORT);

    if (rc == NGX_ERROR) {
        *reply = NULL;
    }

    return NGX_OK;
}


/* the time of entries that go to the file alone: now */
static void
ngx_http_idem_audit_stamp(idem_audit_entry_t *e, ngx_uint_t n)
{
    ngx_uint_t  i;
    int64_t     now;

    now = ngx_http_idem_now_ms();

    for (i = 0; i < n; i++) {
        e[i].time = now;
    }
}


/*
 * Entries Redis has nothing to do with when the file is the only device
 * (an answer that changes no record, a native claim made): they go to the
 * file now.  NGX_OK written, NGX_ERROR not (counted and logged), or
 * NGX_DECLINED when the stream must get them in a script.
 */
ngx_int_t
ngx_http_idem_audit_direct(ngx_http_idem_audit_t *audit, idem_audit_entry_t *e,
    ngx_uint_t n, ngx_log_t *log)
{
    if (audit->on_stream || audit->file == NULL) {
        return NGX_DECLINED;
    }

    ngx_http_idem_audit_stamp(e, n);

    return ngx_http_idem_audit_file_append(audit->file, e, n, log);
}


/*
 * The same for a claim made, whose request waits for them: written with
 * the turn's others, then w's handler is called (NGX_OK), or NGX_ERROR
 * (counted and logged) when they cannot be taken.
 */
ngx_int_t
ngx_http_idem_audit_direct_wait(ngx_http_idem_audit_t *audit,
    idem_audit_entry_t *e, ngx_uint_t n, ngx_http_idem_audit_wait_t *w,
    ngx_log_t *log)
{
    ngx_http_idem_audit_stamp(e, n);

    return ngx_http_idem_audit_file_wait(audit->file, e, n, w, log);
}


/*
 * The change is made: its entries go into the file too.  NGX_DONE, or
 * NGX_ABORT when they cannot and the command claimed ("sent"): the
 * request must not go to the upstream (the caller gives the claim back).
 */
static ngx_int_t
ngx_http_idem_audit_to_file(ngx_http_idem_cmd_t *cmd,
    ngx_http_idem_audit_t *audit)
{
    ngx_uint_t          i, n;
    idem_audit_entry_t  e[NGX_HTTP_IDEM_AUDIT_MAX];

    if (audit->file == NULL) {
        return NGX_DONE;
    }

    n = ngx_http_idem_audit_entries(cmd, e, NGX_HTTP_IDEM_AUDIT_MAX);

    for (i = 0; i < n && e[i].event != IDEM_AUDIT_SENT; i++) {
        /* void */
    }

    /* nothing waits for entries without "sent": with the turn's others */
    if (i == n) {
        ngx_http_idem_audit_file_later(audit->file, e, n, cmd->redis->log);
        return NGX_DONE;
    }

    if (ngx_http_idem_audit_file_append(audit->file, e, n, cmd->redis->log)
        == NGX_OK)
    {
        return NGX_DONE;
    }

    return NGX_ABORT;
}


/* a completion that waits for the end of the turn (audit_batched()) */
ngx_uint_t
ngx_http_idem_audit_deferred(ngx_http_idem_cmd_t *cmd)
{
    ngx_int_t                   at;
    ngx_http_idem_audit_meta_t  meta;

    at = ngx_http_idem_audit_at(cmd);

    if (at == NGX_ERROR
        || cmd->argc != cmd->arg0 + at + NGX_HTTP_IDEM_AUDIT_ENTRIES + 2)
    {
        return 0;
    }

    ngx_http_idem_audit_meta(cmd, at, &meta);

    return ngx_http_idem_audit_batched(meta.head->audit, cmd->script, 1);
}


/*
 * The waiting completions m[0..n) of one stream, ready to send: one
 * (n == 1) as a copy of its complete.lua hashed on the head predicted
 * now, more as one completes.lua whose entry carries the events of all,
 * in order.  NULL when there is no memory.
 */
ngx_http_idem_cmd_t *
ngx_http_idem_audit_batch(ngx_http_idem_cmd_t **m, ngx_uint_t n)
{
    ngx_int_t                   at;
    ngx_http_idem_audit_meta_t  meta;

    at = ngx_http_idem_audit_at(m[0]);
    if (at == NGX_ERROR || n == 0 || n > NGX_HTTP_IDEM_AUDIT_BATCH) {
        return NULL;
    }

    ngx_http_idem_audit_meta(m[0], at, &meta);
    meta.tries = 0;

    if (n == 1) {
        return ngx_http_idem_audit_rewrite(m[0], at, &meta);
    }

    return ngx_http_idem_audit_completes(m, n, &meta);
}


static ngx_uint_t
ngx_http_idem_audit_is(redisReply *reply, const char *what, size_t n)
{
    return ngx_http_idem_reply_tagged(reply, what) && reply->elements == n;
}


/*
 * What the handler of a command that may carry entries does first:
 *   NGX_OK        no entries, or none appended: *reply is the script's own
 *   NGX_DONE      the entries were appended; *reply is the script's own
 *   NGX_ABORT     the same, but the file could not record a claim: the
 *                 request must not execute
 *   NGX_AGAIN     a lost race: a copy hashed anew was sent (*next) with
 *                 the same handler and data; this reply is to be ignored
 *   NGX_DECLINED  a lost race of a command nobody waits for any more:
 *                 nothing was written, nothing is sent again
 *   NGX_ERROR     a lost race that cannot be run again: nothing written
 */
ngx_int_t
ngx_http_idem_audit_reply(ngx_http_idem_cmd_t *cmd, redisReply **reply,
    ngx_http_idem_cmd_t **next)
{
    ngx_int_t                   at;
    ngx_http_idem_audit_meta_t  meta;

    at = ngx_http_idem_audit_at(cmd);

    if (at == NGX_ERROR || *reply == NULL) {
        return NGX_OK;
    }

    ngx_http_idem_audit_meta(cmd, at, &meta);

    /* a lean command (the file alone): its own reply 1 says it was made */
    if (ngx_http_idem_audit_lean(meta.head->audit, cmd->script)) {
        return (*reply)->type == REDIS_REPLY_INTEGER
               && (*reply)->integer == 1
               ? ngx_http_idem_audit_to_file(cmd, meta.head->audit)
               : NGX_OK;
    }

    /* a fenced script's 1: the change and its entry are made */
    if (ngx_http_idem_audit_fenced(cmd->script)
        && (*reply)->type == REDIS_REPLY_INTEGER && (*reply)->integer == 1)
    {
        if (cmd->argc < cmd->arg0 + at + NGX_HTTP_IDEM_AUDIT_ENTRIES + 2) {
            return NGX_OK;
        }

        if (meta.head->audit->on_stream) {
            ngx_http_idem_audit_appended(cmd, at, &meta);
        }

        return ngx_http_idem_audit_to_file(cmd, meta.head->audit);
    }

    /* claimnew.lua's 1: claimed, with the entry */
    if (ngx_http_idem_audit_is_claimnew(cmd)
        && (*reply)->type == REDIS_REPLY_INTEGER && (*reply)->integer == 1)
    {
        ngx_http_idem_audit_appended(cmd, at, &meta);
        *reply = ngx_http_idem_audit_claimed();

        return ngx_http_idem_audit_to_file(cmd, meta.head->audit);
    }

    if (ngx_http_idem_audit_is(*reply, "audit-look", 1)) {
        return ngx_http_idem_audit_look(cmd, next);
    }

    if (ngx_http_idem_audit_is(*reply, "audited", 2)) {
        if (meta.head->audit->on_stream) {
            ngx_http_idem_audit_appended(cmd, at, &meta);
        }

        *reply = (*reply)->element[1];

        return ngx_http_idem_audit_to_file(cmd, meta.head->audit);
    }

    if (!ngx_http_idem_audit_is(*reply, "audit-head", 4)) {
        ngx_http_idem_audit_unused(cmd, at, &meta);
        return NGX_OK;
    }

    if (ngx_http_idem_audit_lost(*reply, &meta) != NGX_OK) {
        return NGX_ERROR;
    }

    if (cmd->data == NULL && !cmd->durable) {
        return NGX_DECLINED;
    }

    return ngx_http_idem_audit_again(cmd, at, &meta, next);
}
