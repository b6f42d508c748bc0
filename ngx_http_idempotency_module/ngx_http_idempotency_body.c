/*
 * The request body's part of the fingerprint: read from memory and temp
 * file buffers, canonicalized in the event loop or, for large JSON bodies
 * when idempotency_thread_pool is set, in an nginx thread pool so that the
 * worker's other requests and its Redis link do not wait for it.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <openssl/evp.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_body.h"
#include "ngx_http_idempotency_ctx.h"


#define NGX_HTTP_IDEM_READ_CHUNK  65536


typedef ngx_int_t (*ngx_http_idem_body_pt)(void *data, u_char *p, size_t n);


/*
 * What the body's digest is computed from, and with which scratch buffer.
 * Nothing here touches a pool or a log, so it also runs in a thread.
 */
typedef struct {
    ngx_chain_t      *bufs;
    u_char           *chunk;      /* where file parts are read, or NULL */
    size_t            chunk_size;
    ngx_err_t         err;
} ngx_http_idem_body_src_t;


/*
 * pread() without ngx_read_file()'s logging: the log belongs to the event
 * loop, and the caller says what failed.
 */
static ssize_t
ngx_http_idem_pread(ngx_http_idem_body_src_t *src, ngx_file_t *file,
    u_char *buf, size_t size, off_t offset)
{
    ssize_t  n;

    do {
        n = pread(file->fd, buf, size, offset);
    } while (n == -1 && ngx_errno == NGX_EINTR);

    if (n == -1) {
        src->err = ngx_errno;

    } else if (n == 0) {
        src->err = EIO;           /* the file is shorter than its buffer */
        n = -1;
    }

    return n;
}


/* walks memory and temp-file parts alike, reading files in chunks */
static ngx_int_t
ngx_http_idem_body_walk(ngx_http_idem_body_src_t *src,
    ngx_http_idem_body_pt fn, void *data)
{
    off_t         pos;
    size_t        n;
    ssize_t       got;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    for (cl = src->bufs; cl; cl = cl->next) {
        b = cl->buf;

        if (ngx_buf_in_memory(b)) {
            if (fn(data, b->pos, b->last - b->pos) != NGX_OK) {
                return NGX_ERROR;
            }

            continue;
        }

        if (!b->in_file) {
            continue;
        }

        for (pos = b->file_pos; pos < b->file_last; pos += got) {
            n = (size_t) ngx_min(b->file_last - pos,
                                 (off_t) src->chunk_size);

            got = ngx_http_idem_pread(src, b->file, src->chunk, n, pos);
            if (got < 0) {
                return NGX_ERROR;
            }

            if (fn(data, src->chunk, (size_t) got) != NGX_OK) {
                return NGX_ERROR;
            }
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idem_body_sha(void *data, u_char *p, size_t n)
{
    return EVP_DigestUpdate(data, p, n) ? NGX_OK : NGX_ERROR;
}


/*
 * Appends a part to the copy at src->chunk, src->chunk_size bytes left:
 * memory parts are copied, file parts were read there by the walk.
 */
static ngx_int_t
ngx_http_idem_body_append(void *data, u_char *p, size_t n)
{
    ngx_http_idem_body_src_t  *src = data;

    if (n > src->chunk_size) {
        return NGX_ERROR;
    }

    if (p != src->chunk) {
        ngx_memcpy(src->chunk, p, n);
    }

    src->chunk += n;
    src->chunk_size -= n;

    return NGX_OK;
}


/* the SHA-256 of the raw body, read from memory and temp file parts */
static int
ngx_http_idem_body_sha256(void *data, unsigned char *md)
{
    int                        rc;
    unsigned int               n;
    EVP_MD_CTX                *sha;
    ngx_http_idem_body_src_t  *src;

    src = data;

    sha = EVP_MD_CTX_new();
    if (sha == NULL) {
        return -1;
    }

    rc = (EVP_DigestInit_ex(sha, idem_sha256(), NULL)
          && ngx_http_idem_body_walk(src, ngx_http_idem_body_sha, sha)
             == NGX_OK
          && EVP_DigestFinal_ex(sha, md, &n))
         ? 0 : -1;

    EVP_MD_CTX_free(sha);

    return rc;
}


static size_t
ngx_http_idem_body_size(ngx_chain_t *bufs)
{
    size_t        size;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    size = 0;

    for (cl = bufs; cl; cl = cl->next) {
        b = cl->buf;
        size += ngx_buf_in_memory(b) ? (size_t) (b->last - b->pos)
                : b->in_file ? (size_t) (b->file_last - b->file_pos) : 0;
    }

    return size;
}


static ngx_uint_t
ngx_http_idem_body_has_file(ngx_chain_t *bufs)
{
    for ( /* void */ ; bufs; bufs = bufs->next) {
        if (!ngx_buf_in_memory(bufs->buf) && bufs->buf->in_file) {
            return 1;
        }
    }

    return 0;
}


/*
 * The body's digest source.  A raw body read from a temp file gets its own
 * scratch chunk, allocated here in the event loop; a JSON body's copy
 * serves as the chunk should the body be hashed raw after all, as the copy
 * is dead by then (ngx_http_idem_body_run()).
 */
static ngx_int_t
ngx_http_idem_body_src(ngx_http_request_t *r, ngx_http_idem_body_src_t *src,
    ngx_uint_t raw)
{
    src->bufs = r->request_body ? r->request_body->bufs : NULL;
    src->chunk = NULL;
    src->chunk_size = 0;
    src->err = 0;

    if (raw && ngx_http_idem_body_has_file(src->bufs)) {
        src->chunk = ngx_palloc(r->pool, NGX_HTTP_IDEM_READ_CHUNK);
        if (src->chunk == NULL) {
            return NGX_ERROR;
        }

        src->chunk_size = NGX_HTTP_IDEM_READ_CHUNK;
    }

    return NGX_OK;
}


/*
 * JSON is parsed, so it needs the whole body in one piece.  One memory
 * buffer is read where it is.  Otherwise (a temp file, or parts) the body
 * is read into a copy that is then canonicalized over itself: one body's
 * worth of memory, and if the body is not JSON after all its raw digest is
 * read again from the parts.  (mmap() of the temp file was tried: munmap()'s
 * TLB shootdown cost more than the copy, bench/RESULTS.md.)  The copy is
 * made by ngx_http_idem_body_run(), in the event loop or in a thread.
 */
static void
ngx_http_idem_body_json(ngx_http_idem_body_src_t *src, idem_fp_input_t *in)
{
    size_t        size;
    ngx_chain_t  *bufs;

    bufs = src->bufs;

    if (bufs && bufs->next == NULL && ngx_buf_in_memory(bufs->buf)) {
        in->body = (const char *) bufs->buf->pos;
        in->body_len = bufs->buf->last - bufs->buf->pos;
        return;
    }

    size = ngx_http_idem_body_size(bufs);

    if (size == 0) {
        in->body = "";
        in->body_len = 0;
        return;
    }

    in->body = NULL;
    in->body_len = size;
    in->body_in_place = 1;
    in->raw_sha256 = ngx_http_idem_body_sha256;
    in->raw_data = src;
}


/*
 * Reads the body into its copy (if it needs one) and fingerprints it.  The
 * copy comes from malloc(), not the pool, because this may run in a thread,
 * and it lives only while this runs: requests queued for a thread hold no
 * body's worth of memory while they wait.
 */
static int
ngx_http_idem_body_run(ngx_http_idem_body_src_t *src, idem_fp_input_t *in,
    idem_fp_result_t *res)
{
    int      rc;
    u_char  *copy;

    if (!in->body_in_place) {
        return idem_fingerprint(in, res);
    }

    copy = malloc(in->body_len);
    if (copy == NULL) {
        src->err = NGX_ENOMEM;
        return -1;
    }

    /* the walk reads file parts straight into the copy, in one piece each */
    src->chunk = copy;
    src->chunk_size = in->body_len;

    if (ngx_http_idem_body_walk(src, ngx_http_idem_body_append, src) == NGX_OK
        && src->chunk_size == 0)
    {
        /* the copy doubles as the chunk of a raw digest, should JSON fail */
        in->body = (const char *) copy;
        src->chunk = copy;
        src->chunk_size = in->body_len;
        rc = idem_fingerprint(in, res);

    } else {
        rc = -1;
    }

    free(copy);

    in->body = NULL;
    src->chunk = NULL;

    return rc;
}


static void
ngx_http_idem_body_done(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_fp_result_t *res)
{
    ngx_memcpy(ctx->fingerprint, res->hex, IDEM_FP_HEX_LEN);
    ctx->body_form = res->body_form;
    ctx->fingerprinted = 1;

    if (res->body_form == IDEM_BODY_RAW_INVALID_JSON) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: JSON body hashed raw: %s",
                      idem_jcs_strerror(res->json_rc));
    }
}


static void
ngx_http_idem_body_failed(ngx_http_request_t *r, ngx_err_t err)
{
    ngx_log_error(NGX_LOG_ERR, r->connection->log, err,
                  "idempotency: cannot read or fingerprint the request body");
}


#if (NGX_THREADS)

/* a fingerprint computed in a thread: everything it reads or writes */
typedef struct {
    ngx_http_request_t        *request;
    ngx_http_idem_body_src_t   src;
    idem_fp_input_t            in;
    idem_fp_result_t           res;
    int                        rc;
} ngx_http_idem_body_task_t;


static void
ngx_http_idem_body_thread(void *data, ngx_log_t *log)
{
    ngx_http_idem_body_task_t  *t = data;

    t->rc = ngx_http_idem_body_run(&t->src, &t->in, &t->res);
}


static void
ngx_http_idem_body_thread_done(ngx_event_t *ev)
{
    ngx_connection_t           *c;
    ngx_http_request_t         *r;
    ngx_http_idem_ctx_t        *ctx;
    ngx_http_idem_body_task_t  *t;

    t = ev->data;
    r = t->request;
    c = r->connection;

    ngx_http_set_log_request(c->log, r);

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "idempotency: body fingerprinted in a thread, rc:%d",
                   t->rc);

    r->main->blocked--;
    r->aio = 0;

    ctx = ngx_http_idem_get_ctx(r);

    if (t->rc == 0) {
        ngx_http_idem_body_done(r, ctx, &t->res);

    } else {
        ngx_http_idem_body_failed(r, t->src.err);
    }

    ctx->phase = NGX_HTTP_IDEM_FINGERPRINTED;

    /* ngx_http_core_run_phases(), or the finalizer if it was terminated */
    r->write_event_handler(r);
    ngx_http_run_posted_requests(c);
}


/*
 * NGX_AGAIN: the fingerprint is computed in the location's thread pool and
 * the phases resume when it is done; NGX_DECLINED: compute it here (not
 * configured, too small, or the pool's queue is full).  The request is
 * blocked meanwhile, as for aio threads, so it cannot be freed under the
 * thread.  The SHA-256 method was fetched by the record key, in this
 * thread, before any task could be posted.
 */
static ngx_int_t
ngx_http_idem_body_post(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_body_src_t *src, idem_fp_input_t *in)
{
    ngx_thread_task_t          *task;
    ngx_http_idem_loc_conf_t   *lcf;
    ngx_http_idem_body_task_t  *t;

    lcf = ctx->conf;

    if (lcf->thread_pool == NULL || in->body_len < lcf->thread_min) {
        return NGX_DECLINED;
    }

    task = ngx_thread_task_alloc(r->pool, sizeof(ngx_http_idem_body_task_t));
    if (task == NULL) {
        return NGX_DECLINED;
    }

    t = task->ctx;
    t->request = r;
    t->src = *src;
    t->in = *in;

    if (in->raw_data == src) {
        t->in.raw_data = &t->src;
    }

    task->handler = ngx_http_idem_body_thread;
    task->event.data = t;
    task->event.handler = ngx_http_idem_body_thread_done;

    if (ngx_thread_task_post(lcf->thread_pool, task) != NGX_OK) {
        /* the queue is full (logged by nginx): do it in the event loop */
        return NGX_DECLINED;
    }

    r->main->blocked++;
    r->aio = 1;
    ctx->phase = NGX_HTTP_IDEM_FINGERPRINTING;

    return NGX_AGAIN;
}

#endif


/*
 * Completes the fingerprint input with the body and computes it: NGX_OK
 * with ctx->fingerprint set, NGX_AGAIN when it is being computed in a
 * thread (ctx->phase is then NGX_HTTP_IDEM_FINGERPRINTING), NGX_ERROR.
 */
ngx_int_t
ngx_http_idem_body_fingerprint(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_fp_input_t *in)
{
    int                        rc;
    u_char                     md[EVP_MAX_MD_SIZE];
    idem_fp_result_t           res;
    ngx_http_idem_body_src_t   src;

    if (ngx_http_idem_body_src(r, &src, !in->body_json) != NGX_OK) {
        return NGX_ERROR;
    }

    if (in->body_json) {
        ngx_http_idem_body_json(&src, in);

#if (NGX_THREADS)
        if (ngx_http_idem_body_post(r, ctx, &src, in) == NGX_AGAIN) {
            return NGX_AGAIN;
        }
#endif

        rc = ngx_http_idem_body_run(&src, in, &res);

    } else {
        rc = ngx_http_idem_body_sha256(&src, md);

        if (rc == 0) {
            in->body_sha256 = md;
            rc = idem_fingerprint(in, &res);
        }

        if (src.chunk) {
            (void) ngx_pfree(r->pool, src.chunk);
        }
    }

    if (rc != 0) {
        ngx_http_idem_body_failed(r, src.err);
        return NGX_ERROR;
    }

    ngx_http_idem_body_done(r, ctx, &res);

    return NGX_OK;
}


static void
ngx_http_idem_fp_exclude_free(void *data)
{
    idem_ptr_set_free(data);
}


/*
 * idempotency_fingerprint_exclude off | pointer ...: the pointers are
 * parsed here, once, into the set the canonicalizer matches names
 * against; workers and threads only read it.
 */
char *
ngx_http_idem_fp_exclude(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    ngx_str_t           *value;
    ngx_uint_t           i;
    idem_ptr_rc_t        rc;
    ngx_pool_cleanup_t  *cln;

    if (lcf->fp_exclude != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (cf->args->nelts == 2 && ngx_strcmp(value[1].data, "off") == 0) {
        lcf->fp_exclude = NULL;
        return NGX_CONF_OK;
    }

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        return NGX_CONF_ERROR;
    }

    lcf->fp_exclude = idem_ptr_set_create();
    if (lcf->fp_exclude == NULL) {
        return NGX_CONF_ERROR;
    }

    cln->handler = ngx_http_idem_fp_exclude_free;
    cln->data = lcf->fp_exclude;

    for (i = 1; i < cf->args->nelts; i++) {
        rc = idem_ptr_set_add(lcf->fp_exclude, (const char *) value[i].data,
                              value[i].len);

        if (rc == IDEM_PTR_ENOMEM) {
            return NGX_CONF_ERROR;
        }

        if (rc != IDEM_PTR_OK) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid JSON pointer \"%V\" in \"%V\": %s",
                               &value[i], &cmd->name, idem_ptr_strerror(rc));
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


/* idempotency_thread_pool off | name [min_size=size] */
char *
ngx_http_idem_thread_pool(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    ssize_t     size;
    ngx_str_t  *value, s;

    if (lcf->thread_pool != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        if (cf->args->nelts != 2) {
            return "takes no size with \"off\"";
        }

        lcf->thread_pool = NULL;
        return NGX_CONF_OK;
    }

    size = NGX_HTTP_IDEM_THREAD_MIN;

    if (cf->args->nelts == 3) {
        if (ngx_strncmp(value[2].data, "min_size=", 9) != 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\" in \"%V\" "
                               "directive, it must be \"min_size=size\"",
                               &value[2], &cmd->name);
            return NGX_CONF_ERROR;
        }

        s.data = value[2].data + 9;
        s.len = value[2].len - 9;

        size = ngx_parse_size(&s);
        if (size == NGX_ERROR) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid size \"%V\" in \"%V\" directive",
                               &s, &cmd->name);
            return NGX_CONF_ERROR;
        }
    }

#if (NGX_THREADS)

    /* an undefined pool other than "default" fails later, with its line */
    lcf->thread_pool = ngx_thread_pool_add(cf, &value[1]);
    if (lcf->thread_pool == NULL) {
        return NGX_CONF_ERROR;
    }

    lcf->thread_min = (size_t) size;

    return NGX_CONF_OK;

#else

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"%V\" needs nginx built with threads "
                       "(--with-threads)", &cmd->name);
    return NGX_CONF_ERROR;

#endif
}


/* the pool and its threshold are one directive, inherited together */
char *
ngx_http_idem_thread_pool_merge(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *prev, ngx_http_idem_loc_conf_t *conf)
{
    if (conf->thread_pool == NGX_CONF_UNSET_PTR) {
        conf->thread_pool = prev->thread_pool;
        conf->thread_min = prev->thread_min;
    }

    ngx_conf_merge_ptr_value(conf->thread_pool, NGX_CONF_UNSET_PTR, NULL);
    ngx_conf_merge_size_value(conf->thread_min, NGX_CONF_UNSET_SIZE,
                              NGX_HTTP_IDEM_THREAD_MIN);

    return NGX_CONF_OK;
}
