/*
 * idempotency_audit file=PATH: the audit file device (docs/audit.md).
 *
 * The entries are the stream's (the same commands carry them, see
 * ngx_http_idempotency_audit.c); once Redis has made the change they
 * describe, they are written here as JSON lines (idem_audit_file.c),
 * chained on the head kept in the file's shared memory zone.  The head is
 * read, the lines hashed and written with one write() on the O_APPEND
 * descriptor, and the head moved, all under the zone's mutex: the order
 * of the lines in the file is the order of the chain, whichever worker
 * wrote them.
 *
 * nginx opens the file (ngx_conf_open_file) and reopens it on USR1; the
 * chain goes on in the new file.  Workers do not reopen at the same
 * instant, so the zone also keeps which file (device, inode) the last
 * line went to: a worker whose descriptor is another file than the one
 * at the path opens the path itself before it writes, and no line ever
 * goes to the old file after one went to the new.
 */

#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_audit_file.h"
#include "ngx_http_idempotency_metrics.h"
#include "idem_audit_file.h"


/* the most of the file's end read at start-up to learn the head */
#define NGX_HTTP_IDEM_AUDIT_TAIL   (256 * 1024)

/*
 * The most events one write() carries (each step's in a line of its own,
 * at most 4 a step), and their strings' room
 */
#define NGX_HTTP_IDEM_AUDIT_BATCH  64
#define NGX_HTTP_IDEM_AUDIT_ARENA  (64 * 1024)


typedef struct {
    uint64_t                     seq;
    u_char                       hash[IDEM_AUDIT_HASH_LEN];
    ngx_uint_t                   unsynced;  /* lines since the last fsync */
    dev_t                        dev;       /* the file the last line */
    ino_t                        ino;       /* went to (0: none yet) */
    ngx_uint_t                   torn;      /* it ends within a line */
} ngx_http_idem_audit_file_sh_t;


/*
 * This process' entries not yet written: those after the execution (a
 * completion's) and the claims' (whose requests wait: "pending") wait for
 * the end of the event loop's turn, so that the lines of one turn go with
 * one write(); any write writes them first, so the file keeps the order
 * in which they happened.  The requests a write decided ("decided") go on
 * from the posted event, never from inside another request's write.
 */
typedef struct {
    idem_audit_entry_t           e[NGX_HTTP_IDEM_AUDIT_BATCH];
    ngx_uint_t                   n;
    u_char                       steps[NGX_HTTP_IDEM_AUDIT_BATCH];
    ngx_uint_t                   nsteps;    /* the calls they came with,
                                               one a step: its line has
                                               steps[i] of the events */
    ngx_queue_t                  pending;   /* waiting for the write */
    ngx_queue_t                  decided;   /* written, or failed */
    size_t                       used;      /* of arena */
    size_t                       size;      /* of buf */
    u_char                      *buf;       /* where the lines are made */
    ngx_event_t                  ev;
    u_char                       arena[NGX_HTTP_IDEM_AUDIT_ARENA];
} ngx_http_idem_audit_batch_t;


static ngx_int_t ngx_http_idem_audit_file_init_zone(ngx_shm_zone_t *zone,
    void *data);
static void ngx_http_idem_audit_file_flush(ngx_open_file_t *file,
    ngx_log_t *log);
static void ngx_http_idem_audit_file_posted(ngx_event_t *ev);
static void ngx_http_idem_audit_file_decide(ngx_http_idem_audit_batch_t *b,
    ngx_int_t rc);


/* ---- configuration */

/* fsync=off|every|N: *n is 0, -1 or N */
static ngx_int_t
ngx_http_idem_audit_fsync(ngx_str_t *v, ngx_int_t *n)
{
    if (v->len == 3 && ngx_strncmp(v->data, "off", 3) == 0) {
        *n = 0;
        return NGX_OK;
    }

    if (v->len == 5 && ngx_strncmp(v->data, "every", 5) == 0) {
        *n = -1;
        return NGX_OK;
    }

    *n = ngx_atoi(v->data, v->len);

    return *n > 0 ? NGX_OK : NGX_ERROR;
}


/* the device of a path: one per configuration, whatever the locations */
static ngx_http_idem_audit_file_t *
ngx_http_idem_audit_file_get(ngx_conf_t *cf, ngx_str_t *path,
    ngx_int_t fsync)
{
    ngx_str_t                    name, zone;
    ngx_uint_t                   i;
    ngx_http_idem_audit_file_t  *f, **all;
    ngx_http_idem_main_conf_t   *mcf;

    name = *path;

    if (ngx_conf_full_name(cf->cycle, &name, 0) != NGX_OK) {
        return NULL;
    }

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);
    all = mcf->audit_files.elts;

    for (i = 0; i < mcf->audit_files.nelts; i++) {
        f = all[i];

        if (f->path.len == name.len
            && ngx_strncmp(f->path.data, name.data, name.len) == 0)
        {
            if (f->fsync != fsync) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "audit file \"%V\" is written with two "
                                   "fsync= settings", &name);
                return NULL;
            }

            return f;
        }
    }

    f = ngx_pcalloc(cf->pool, sizeof(ngx_http_idem_audit_file_t));
    all = ngx_array_push(&mcf->audit_files);
    zone.len = sizeof("idempotency_audit:") - 1 + name.len;
    zone.data = ngx_pnalloc(cf->pool, zone.len);

    if (f == NULL || all == NULL || zone.data == NULL) {
        return NULL;
    }

    ngx_sprintf(zone.data, "idempotency_audit:%V", &name);

    f->path = name;
    f->fsync = fsync;
    f->file = ngx_conf_open_file(cf->cycle, &name);
    f->zone = ngx_shared_memory_add(cf, &zone, 8 * ngx_pagesize,
                                    &ngx_http_idempotency_module);

    if (f->file == NULL || f->zone == NULL) {
        return NULL;
    }

    f->zone->init = ngx_http_idem_audit_file_init_zone;
    f->zone->data = f;
    *all = f;

    return f;
}


/* the words of idempotency_audit after its name; NGX_ERROR: not one */
static ngx_int_t
ngx_http_idem_audit_word(ngx_str_t *v, ngx_flag_t *stream, ngx_str_t *path,
    ngx_int_t *fsync)
{
    ngx_str_t  s;

    if ((v->len == 2 && ngx_strncmp(v->data, "on", 2) == 0)
        || (v->len == 5 && ngx_strncmp(v->data, "redis", 5) == 0))
    {
        *stream = 1;
        return NGX_OK;
    }

    if (v->len > 5 && ngx_strncmp(v->data, "file=", 5) == 0 && !path->len) {
        path->data = v->data + 5;
        path->len = v->len - 5;
        return NGX_OK;
    }

    if (v->len > 6 && ngx_strncmp(v->data, "fsync=", 6) == 0) {
        s.data = v->data + 6;
        s.len = v->len - 6;
        return ngx_http_idem_audit_fsync(&s, fsync);
    }

    return NGX_ERROR;
}


/* idempotency_audit on | off | redis | [redis] file=PATH [fsync=...] */
char *
ngx_http_idem_audit_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    ngx_str_t   *value, path;
    ngx_int_t    fsync;
    ngx_uint_t   i, synced;
    ngx_flag_t   stream;

    if (lcf->audit_on != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;
    stream = 0;
    fsync = 0;
    synced = 0;
    ngx_str_null(&path);

    if (cf->args->nelts == 2 && value[1].len == 3
        && ngx_strncmp(value[1].data, "off", 3) == 0)
    {
        lcf->audit_on = 0;
        lcf->audit_file = NULL;
        return NGX_CONF_OK;
    }

    for (i = 1; i < cf->args->nelts; i++) {
        synced |= value[i].len > 6
                  && ngx_strncmp(value[i].data, "fsync=", 6) == 0;

        if (ngx_http_idem_audit_word(&value[i], &stream, &path, &fsync)
            != NGX_OK)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_audit\": invalid parameter "
                               "\"%V\" (on, off, redis, file=PATH, "
                               "fsync=off|every|N)", &value[i]);
            return NGX_CONF_ERROR;
        }
    }

    if (synced && path.len == 0) {
        return "has fsync= without file=";
    }

    lcf->audit_on = stream;
    lcf->audit_file = NULL;

    if (path.len) {
        lcf->audit_file = ngx_http_idem_audit_file_get(cf, &path, fsync);
        if (lcf->audit_file == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


static void
ngx_http_idem_audit_file_hasher_free(void *data)
{
    idem_audit_file_hasher_free(data);
}


/*
 * What a line's hash needs, made once (each worker gets its copy at the
 * fork); and nginx's reopen of the file told to this device, so that a
 * worker learns which file its descriptor is without an fstat() per write
 * (unless something else already listens on the file's reopen).
 */
static char *
ngx_http_idem_audit_file_ready(ngx_conf_t *cf, ngx_http_idem_audit_file_t *f)
{
    ngx_pool_cleanup_t  *cln;

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        return NGX_CONF_ERROR;
    }

    f->hasher = idem_audit_file_hasher(f->key ? f->key->secret : NULL,
                                       f->key ? f->key->secret_len : 0);
    if (f->hasher == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "audit file \"%V\": the "
                           "chain's SHA-256 cannot be set up", &f->path);
        return NGX_CONF_ERROR;
    }

    cln->handler = ngx_http_idem_audit_file_hasher_free;
    cln->data = f->hasher;

    if (f->file->flush == NULL && f->file->data == NULL) {
        f->file->flush = ngx_http_idem_audit_file_flush;
        f->file->data = f;
    }

    return NGX_CONF_OK;
}


/* one file is one chain: one key, one anchor interval */
char *
ngx_http_idem_audit_file_merge(ngx_conf_t *cf, ngx_http_idem_audit_file_t *f,
    idem_jws_key_t *key, ngx_uint_t anchor)
{
    ngx_uint_t  same;

    if (!f->used) {
        f->used = 1;
        f->key = key;
        f->anchor = anchor;
        return ngx_http_idem_audit_file_ready(cf, f);
    }

    same = (f->key == NULL || key == NULL)
           ? f->key == key
           : f->key->secret_len == key->secret_len
             && ngx_memcmp(f->key->secret, key->secret, key->secret_len) == 0;

    if (!same || f->anchor != anchor) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "audit file \"%V\" is written with two different "
                           "\"idempotency_audit_key\" or anchor= settings: "
                           "one chain has one key", &f->path);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* ---- the head at start-up: the file's last line */

static ngx_int_t
ngx_http_idem_audit_file_last(ngx_http_idem_audit_file_t *f,
    ngx_http_idem_audit_file_sh_t *sh, u_char *buf, size_t n, ngx_log_t *log)
{
    u_char              *end, *start;
    char                 hash[IDEM_AUDIT_HASH_LEN + 1], why[200];
    void                *tree;

    static idem_audit_events_t  ev;

    end = buf + n;

    /* a line cut short (a failed write) stays; the next starts anew */
    if (end[-1] != '\n') {
        sh->torn = 1;

        while (end > buf && end[-1] != '\n') {
            end--;
        }
    }

    if (end == buf) {
        return NGX_OK;      /* nothing but a torn line */
    }

    for (start = end - 1; start > buf && start[-1] != '\n'; start--) {
        /* void */
    }

    /* a line of either version: an upgraded module goes on after it */
    if (idem_audit_file_parse((char *) start, end - 1 - start, &ev, hash,
                              &tree, why, sizeof(why)) != 0)
    {
        idem_audit_file_free(tree);
        ngx_log_error(NGX_LOG_EMERG, log, 0,
                      "idempotency: audit file \"%V\" ends with a line the "
                      "module did not write (%s): its chain cannot go on; "
                      "move the file away (keep it) and start again",
                      &f->path, why);
        return NGX_ERROR;
    }

    sh->seq = ev.e[0].seq;
    ngx_memcpy(sh->hash, hash, IDEM_AUDIT_HASH_LEN);
    idem_audit_file_free(tree);

    return NGX_OK;
}


/*
 * The head lives in the zone and in the file's last line only: a restart
 * on a file rotated away before a line went to the new one starts a new
 * chain, and the operator needs to know where it starts (docs/audit.md).
 */
static void
ngx_http_idem_audit_file_new_chain(ngx_http_idem_audit_file_t *f,
    ngx_log_t *log)
{
    ngx_log_error(NGX_LOG_NOTICE, log, 0,
                  "idempotency: audit file \"%V\" is empty: a new chain "
                  "starts at entry 1", &f->path);
}


static ngx_int_t
ngx_http_idem_audit_file_tail(ngx_http_idem_audit_file_t *f,
    ngx_http_idem_audit_file_sh_t *sh, ngx_log_t *log)
{
    u_char           *buf;
    off_t             off;
    ssize_t           n;
    ngx_fd_t          fd;
    ngx_int_t         rc;
    ngx_file_info_t   fi;

    ngx_memcpy(sh->hash, idem_audit_genesis, IDEM_AUDIT_HASH_LEN);

    fd = ngx_open_file(f->path.data, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);
    if (fd == NGX_INVALID_FILE) {
        ngx_http_idem_audit_file_new_chain(f, log);
        return NGX_OK;      /* a new file: the chain starts */
    }

    rc = NGX_ERROR;
    buf = NULL;

    if (ngx_fd_info(fd, &fi) != NGX_FILE_ERROR) {
        sh->dev = fi.st_dev;
        sh->ino = fi.st_ino;
        n = ngx_min(ngx_file_size(&fi), NGX_HTTP_IDEM_AUDIT_TAIL);
        off = ngx_file_size(&fi) - n;
        buf = ngx_alloc(n + 1, log);

        if (!ngx_is_file(&fi) || n == 0) {
            rc = NGX_OK;    /* /dev/null, a FIFO...: nothing to read */

            if (ngx_is_file(&fi)) {
                ngx_http_idem_audit_file_new_chain(f, log);
            }

        } else if (buf && pread(fd, buf, n, off) == n) {
            rc = ngx_http_idem_audit_file_last(f, sh, buf, n, log);

        } else {
            ngx_log_error(NGX_LOG_EMERG, log, ngx_errno,
                          "idempotency: cannot read the head of audit file "
                          "\"%V\"", &f->path);
        }
    }

    ngx_free(buf);
    ngx_close_file(fd);

    return rc;
}


static ngx_int_t
ngx_http_idem_audit_file_init_zone(ngx_shm_zone_t *zone, void *data)
{
    ngx_http_idem_audit_file_t     *f, *old;
    ngx_http_idem_audit_file_sh_t  *sh;

    f = zone->data;
    old = data;
    f->shpool = (ngx_slab_pool_t *) zone->shm.addr;

    /* a reload keeps the zone, and the head in it */
    if (old) {
        f->sh = old->sh;
        return NGX_OK;
    }

    if (zone->shm.exists) {
        f->sh = f->shpool->data;
        return NGX_OK;
    }

    sh = ngx_slab_calloc(f->shpool, sizeof(ngx_http_idem_audit_file_sh_t));
    if (sh == NULL) {
        return NGX_ERROR;
    }

    f->shpool->data = sh;
    f->sh = sh;

    return ngx_http_idem_audit_file_tail(f, sh, zone->shm.log);
}


/* ---- writing */

/* nginx is about to reopen the file (USR1): the descriptor will change */
static void
ngx_http_idem_audit_file_flush(ngx_open_file_t *file, ngx_log_t *log)
{
    ngx_http_idem_audit_file_t  *f = file->data;

    f->known = 0;
}


/* which file this process' descriptor is: fstat() only after a reopen */
static ngx_int_t
ngx_http_idem_audit_file_mine(ngx_http_idem_audit_file_t *f)
{
    ngx_file_info_t  fi;

    if (f->known && f->file->flush == ngx_http_idem_audit_file_flush
        && f->file->data == f)
    {
        return NGX_OK;
    }

    if (ngx_fd_info(f->file->fd, &fi) == NGX_FILE_ERROR) {
        return NGX_ERROR;
    }

    f->dev = fi.st_dev;
    f->ino = fi.st_ino;
    f->known = 1;

    return NGX_OK;
}


/*
 * The descriptor is the file at the path, or the one the last line went
 * to while the path's is not used yet; otherwise the path is opened here.
 */
static ngx_int_t
ngx_http_idem_audit_file_current(ngx_http_idem_audit_file_t *f,
    ngx_http_idem_audit_file_sh_t *sh, ngx_log_t *log)
{
    ngx_fd_t          fd;
    ngx_file_info_t   there;

    if (ngx_http_idem_audit_file_mine(f) != NGX_OK) {
        return NGX_ERROR;
    }

    if (sh->ino && (f->ino != sh->ino || f->dev != sh->dev)
        && (ngx_file_info(f->path.data, &there) == NGX_FILE_ERROR
            || there.st_ino != f->ino || there.st_dev != f->dev))
    {
        fd = ngx_open_file(f->path.data, NGX_FILE_APPEND,
                           NGX_FILE_CREATE_OR_OPEN, NGX_FILE_DEFAULT_ACCESS);
        f->known = 0;

        if (fd == NGX_INVALID_FILE || dup2(fd, f->file->fd) == -1
            || ngx_http_idem_audit_file_mine(f) != NGX_OK)
        {
            if (fd != NGX_INVALID_FILE) {
                ngx_close_file(fd);
            }

            return NGX_ERROR;
        }

        ngx_close_file(fd);
    }

    if (f->ino != sh->ino || f->dev != sh->dev) {
        sh->dev = f->dev;
        sh->ino = f->ino;
        sh->torn = 0;       /* another file: its own end */
    }

    return NGX_OK;
}


/*
 * The batch's lines chained on the head, one a step, at p; ends[i] after
 * line i
 */
static u_char *
ngx_http_idem_audit_file_lines(ngx_http_idem_audit_file_t *f,
    ngx_http_idem_audit_file_sh_t *sh, ngx_http_idem_audit_batch_t *b,
    u_char *p, u_char **ends, u_char (*hashes)[IDEM_AUDIT_HASH_LEN + 1])
{
    ngx_uint_t           i, n;
    const u_char        *prev;
    idem_audit_entry_t  *e;

    prev = sh->hash;
    e = b->e;

    for (i = 0; i < b->nsteps; i++) {
        n = b->steps[i];
        e->seq = sh->seq + i + 1;
        e->prev.data = (const char *) prev;
        e->prev.len = IDEM_AUDIT_HASH_LEN;

        p = (u_char *) (f->hasher
            ? idem_audit_file_line_h((char *) p, e, n, f->hasher,
                                     (char *) hashes[i])
            : idem_audit_file_line((char *) p, e, n,
                                   f->key ? f->key->secret : NULL,
                                   f->key ? f->key->secret_len : 0,
                                   (char *) hashes[i]));
        if (p == NULL) {
            return NULL;
        }

        ends[i] = p;
        prev = hashes[i];
        e += n;
    }

    return p;
}


/*
 * The head moves past the first "done" lines; fsync= and the anchors.
 * NGX_ERROR when fdatasync() failed: the lines are in the file (the head
 * has moved past them) but maybe not on the disk, so the batch counts as
 * not written.
 */
static ngx_int_t
ngx_http_idem_audit_file_moved(ngx_http_idem_audit_file_t *f,
    ngx_http_idem_audit_file_sh_t *sh, ngx_uint_t done,
    u_char (*hashes)[IDEM_AUDIT_HASH_LEN + 1], ngx_log_t *log)
{
    ngx_uint_t  i;

    for (i = 0; i < done; i++) {
        sh->seq++;

        if (sh->seq % f->anchor == 0) {
            ngx_log_error(NGX_LOG_NOTICE, log, 0,
                          "idempotency: audit file \"%V\" head %uL %s",
                          &f->path, sh->seq, hashes[i]);
        }
    }

    if (done) {
        ngx_memcpy(sh->hash, hashes[done - 1], IDEM_AUDIT_HASH_LEN);
    }

    sh->unsynced += done;

    if (f->fsync && done
        && (f->fsync == -1 || sh->unsynced >= (ngx_uint_t) f->fsync))
    {
        sh->unsynced = 0;

        if (fdatasync(f->file->fd) == -1) {
            ngx_log_error(NGX_LOG_ALERT, log, ngx_errno,
                          "idempotency: fdatasync() of audit file \"%V\" "
                          "failed", &f->path);
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/*
 * A write() cut short left part of a line: the file is cut back to its
 * size before the write (under the mutex, the only writer: its size now
 * less the w bytes the write appended), so that the batch is all or none
 * and the next line follows a complete one. NGX_OK when undone.
 */
static ngx_int_t
ngx_http_idem_audit_file_undo(ngx_http_idem_audit_file_t *f, ssize_t w,
    ngx_log_t *log)
{
    off_t            size;
    ngx_file_info_t  fi;

    size = ngx_fd_info(f->file->fd, &fi) == NGX_FILE_ERROR
           ? -1 : fi.st_size - w;

    if (size < 0 || ftruncate(f->file->fd, size) == -1) {
        ngx_log_error(NGX_LOG_ALERT, log, size < 0 ? 0 : ngx_errno,
                      "idempotency: the %z bytes of a cut write to audit "
                      "file \"%V\" stay: ftruncate() failed", w, &f->path);
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* under the mutex: NGX_OK when every line is in the file */
static ngx_int_t
ngx_http_idem_audit_file_put(ngx_http_idem_audit_file_t *f,
    ngx_http_idem_audit_file_sh_t *sh, ngx_http_idem_audit_batch_t *b,
    ngx_log_t *log)
{
    u_char           *p, *start, *ends[NGX_HTTP_IDEM_AUDIT_BATCH];
    u_char            hashes[NGX_HTTP_IDEM_AUDIT_BATCH][IDEM_AUDIT_HASH_LEN + 1];
    ssize_t           w;
    ngx_uint_t        i, n, done;

    if (ngx_http_idem_audit_file_current(f, sh, log) != NGX_OK) {
        ngx_log_error(NGX_LOG_ALERT, log, ngx_errno,
                      "idempotency: audit file \"%V\" cannot be opened",
                      &f->path);
        return NGX_ERROR;
    }

    start = b->buf;
    p = b->buf;
    n = b->nsteps;

    if (sh->torn) {
        *p++ = '\n';
    }

    p = ngx_http_idem_audit_file_lines(f, sh, b, p, ends, hashes);
    if (p == NULL) {
        return NGX_ERROR;
    }

    w = write(f->file->fd, start, p - start);

    if (w > 0 && w != p - start
        && ngx_http_idem_audit_file_undo(f, w, log) == NGX_OK)
    {
        /* nothing of it stays: the head and "torn" are as they were */
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "idempotency: write() of %ui audit entries to \"%V\" "
                      "cut short (%z of %z bytes), undone", n, &f->path,
                      w, (ssize_t) (p - start));
        return NGX_ERROR;
    }

    for (done = 0, i = 0; w > 0 && i < n && ends[i] <= start + w; i++) {
        done++;
    }

    if (w > 0) {
        sh->torn = (start + w != p) && (done == 0 || ends[done - 1]
                                                     != start + w);
    }

    if (ngx_http_idem_audit_file_moved(f, sh, done, hashes, log) != NGX_OK) {
        return NGX_ERROR;
    }

    if (w == p - start) {
        return NGX_OK;
    }

    ngx_log_error(NGX_LOG_ALERT, log, w == -1 ? ngx_errno : 0,
                  "idempotency: write() of %ui audit entries to \"%V\" "
                  "failed (%z of %z bytes written)", n - done, &f->path,
                  w, (ssize_t) (p - start));

    return NGX_ERROR;
}


static ngx_http_idem_audit_batch_t *
ngx_http_idem_audit_file_batch(ngx_http_idem_audit_file_t *f, ngx_log_t *log)
{
    ngx_http_idem_audit_batch_t  *b;

    if (f->batch) {
        return f->batch;
    }

    b = ngx_pcalloc(ngx_cycle->pool, sizeof(ngx_http_idem_audit_batch_t));
    if (b == NULL) {
        return NULL;
    }

    ngx_queue_init(&b->pending);
    ngx_queue_init(&b->decided);

    b->ev.handler = ngx_http_idem_audit_file_posted;
    b->ev.data = f;
    b->ev.log = ngx_cycle->log;
    f->batch = b;

    return b;
}


/*
 * s copied into the batch's arena (room checked by the caller), or the
 * copy of the step's event before when s is the same string: a step's
 * events mostly name one request, and its line then compares pointers
 */
static void
ngx_http_idem_audit_file_keep(ngx_http_idem_audit_batch_t *b, idem_str_t *s,
    const idem_str_t *was, const idem_str_t *kept)
{
    u_char  *p;

    if (was && was->data == s->data && was->len == s->len) {
        s->data = kept->data;
        return;
    }

    p = b->arena + b->used;

    if (s->len) {
        ngx_memcpy(p, s->data, s->len);
    }

    s->data = (const char *) p;
    b->used += s->len;
}


static size_t
ngx_http_idem_audit_file_strings(idem_audit_entry_t *e)
{
    return e->op.len + e->key.len + e->fp.len + e->route.len
           + e->identity.len + e->approver.len + e->response.len
           + e->ref.len + e->request.len;
}


/* the entries added to the batch, which has room for them */
static void
ngx_http_idem_audit_file_add(ngx_http_idem_audit_batch_t *b,
    idem_audit_entry_t *e, ngx_uint_t n)
{
    ngx_uint_t           i;
    idem_audit_entry_t  *k;

#define ngx_http_idem_audit_file_keep_f(f)                                   \
    ngx_http_idem_audit_file_keep(b, &k->f, i ? &e[i - 1].f : NULL,         \
                                  i ? &k[-1].f : NULL)

    for (i = 0; i < n; i++) {
        k = &b->e[b->n++];
        *k = e[i];

        ngx_http_idem_audit_file_keep_f(op);
        ngx_http_idem_audit_file_keep_f(key);
        ngx_http_idem_audit_file_keep_f(fp);
        ngx_http_idem_audit_file_keep_f(route);
        ngx_http_idem_audit_file_keep_f(identity);
        ngx_http_idem_audit_file_keep_f(approver);
        ngx_http_idem_audit_file_keep_f(response);
        ngx_http_idem_audit_file_keep_f(ref);
        ngx_http_idem_audit_file_keep_f(request);
    }

#undef ngx_http_idem_audit_file_keep_f

    b->steps[b->nsteps++] = (u_char) n;
}


/*
 * An entry kept in a command for the file alone (its strings never go to
 * Redis): the entry's fields as they are, then its strings one after the
 * other, so that reading it back is no parse; offsets, not pointers, for
 * a command may be copied.
 */
size_t
ngx_http_idem_audit_file_packed(idem_audit_entry_t *e)
{
    return sizeof(idem_audit_entry_t) + ngx_http_idem_audit_file_strings(e);
}


static u_char *
ngx_http_idem_audit_file_pack_str(u_char *p, idem_str_t *s)
{
    return s->len ? ngx_cpymem(p, s->data, s->len) : p;
}


u_char *
ngx_http_idem_audit_file_pack(u_char *p, idem_audit_entry_t *e)
{
    p = ngx_cpymem(p, e, sizeof(idem_audit_entry_t));
    p = ngx_http_idem_audit_file_pack_str(p, &e->op);
    p = ngx_http_idem_audit_file_pack_str(p, &e->key);
    p = ngx_http_idem_audit_file_pack_str(p, &e->fp);
    p = ngx_http_idem_audit_file_pack_str(p, &e->route);
    p = ngx_http_idem_audit_file_pack_str(p, &e->identity);
    p = ngx_http_idem_audit_file_pack_str(p, &e->approver);
    p = ngx_http_idem_audit_file_pack_str(p, &e->response);
    p = ngx_http_idem_audit_file_pack_str(p, &e->ref);
    p = ngx_http_idem_audit_file_pack_str(p, &e->request);

    return p;
}


/* s's bytes at *p, which moves past them; NGX_ERROR past the end */
static ngx_int_t
ngx_http_idem_audit_file_unpack_str(u_char **p, u_char *end, idem_str_t *s)
{
    if ((size_t) (end - *p) < s->len) {
        return NGX_ERROR;
    }

    s->data = (const char *) *p;
    *p += s->len;

    return NGX_OK;
}


ngx_int_t
ngx_http_idem_audit_file_unpack(u_char *p, size_t len, idem_audit_entry_t *e)
{
    u_char  *end;

    if (len < sizeof(idem_audit_entry_t)) {
        return NGX_ERROR;
    }

    end = p + len;
    ngx_memcpy(e, p, sizeof(idem_audit_entry_t));
    p += sizeof(idem_audit_entry_t);

    e->prev.data = NULL;        /* the head's, when it is written */
    e->prev.len = 0;

    if (ngx_http_idem_audit_file_unpack_str(&p, end, &e->op) != NGX_OK
        || ngx_http_idem_audit_file_unpack_str(&p, end, &e->key) != NGX_OK
        || ngx_http_idem_audit_file_unpack_str(&p, end, &e->fp) != NGX_OK
        || ngx_http_idem_audit_file_unpack_str(&p, end, &e->route) != NGX_OK
        || ngx_http_idem_audit_file_unpack_str(&p, end, &e->identity)
           != NGX_OK
        || ngx_http_idem_audit_file_unpack_str(&p, end, &e->approver)
           != NGX_OK
        || ngx_http_idem_audit_file_unpack_str(&p, end, &e->response)
           != NGX_OK
        || ngx_http_idem_audit_file_unpack_str(&p, end, &e->ref) != NGX_OK
        || ngx_http_idem_audit_file_unpack_str(&p, end, &e->request)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    return p == end ? NGX_OK : NGX_ERROR;
}


/* the requests whose lines a write put in the file (or failed to) */
static void
ngx_http_idem_audit_file_decide(ngx_http_idem_audit_batch_t *b, ngx_int_t rc)
{
    ngx_queue_t                 *q;
    ngx_http_idem_audit_wait_t  *w;

    for (q = ngx_queue_head(&b->pending);
         q != ngx_queue_sentinel(&b->pending);
         q = ngx_queue_next(q))
    {
        w = ngx_queue_data(q, ngx_http_idem_audit_wait_t, queue);
        w->rc = rc;
    }

    if (!ngx_queue_empty(&b->pending)) {
        ngx_queue_add(&b->decided, &b->pending);
        ngx_queue_init(&b->pending);
    }

    /*
     * also when none was pending: a write took the event back (flush_batch
     * deletes it), and those a write of this turn decided before wait in
     * "decided" for it
     */
    if (!ngx_queue_empty(&b->decided) && !b->ev.posted) {
        ngx_post_event(&b->ev, &ngx_posted_events);
    }
}


/*
 * The batch into the file, or none of it: NGX_ERROR (logged, counted once
 * per call that gave entries) when its lines are not all there.
 */
static ngx_int_t
ngx_http_idem_audit_file_flush_batch(ngx_http_idem_audit_file_t *f,
    ngx_http_idem_audit_batch_t *b, ngx_log_t *log)
{
    u_char              *buf;
    size_t               size;
    ngx_int_t            rc;
    ngx_uint_t           i;
    idem_audit_entry_t  *e;

    if (b->ev.posted) {
        ngx_delete_posted_event(&b->ev);
    }

    if (b->n == 0) {
        ngx_http_idem_audit_file_decide(b, NGX_OK);
        return NGX_OK;
    }

    size = 1;

    for (i = 0, e = b->e; i < b->nsteps; e += b->steps[i++]) {
        size += idem_audit_file_line_max(e, b->steps[i]);
    }

    /* one buffer per process, grown when needed: no allocation per line */
    if (size > b->size) {
        buf = ngx_alloc(ngx_max(size, 16384), log);
        if (buf != NULL) {
            ngx_free(b->buf);
            b->buf = buf;
            b->size = ngx_max(size, 16384);
        }
    }

    rc = NGX_ERROR;

    if (size <= b->size) {
        ngx_shmtx_lock(&f->shpool->mutex);
        rc = ngx_http_idem_audit_file_put(f, f->sh, b, log);
        ngx_shmtx_unlock(&f->shpool->mutex);
    }

    for (i = 0; rc != NGX_OK && i < b->nsteps; i++) {
        ngx_http_idem_metrics_audit_error();
    }

    b->n = 0;
    b->nsteps = 0;
    b->used = 0;

    ngx_http_idem_audit_file_decide(b, rc);

    return rc;
}


/*
 * The end of the event loop's turn: the entries left for it, then the
 * requests that waited for them.
 */
static void
ngx_http_idem_audit_file_posted(ngx_event_t *ev)
{
    ngx_queue_t                  *q;
    ngx_http_idem_audit_file_t   *f = ev->data;
    ngx_http_idem_audit_wait_t   *w;
    ngx_http_idem_audit_batch_t  *b;

    b = f->batch;

    (void) ngx_http_idem_audit_file_flush_batch(f, b, ev->log);

    while (!ngx_queue_empty(&b->decided)) {
        q = ngx_queue_head(&b->decided);
        ngx_queue_remove(q);

        w = ngx_queue_data(q, ngx_http_idem_audit_wait_t, queue);
        w->linked = 0;
        w->handler(w);      /* may add to the batch, and post ev again */
    }

    if (ev->posted && b->n == 0 && ngx_queue_empty(&b->decided)) {
        ngx_delete_posted_event(ev);
    }
}


/* the batch can take n more entries like e, once what it holds is out */
static ngx_http_idem_audit_batch_t *
ngx_http_idem_audit_file_room(ngx_http_idem_audit_file_t *f,
    idem_audit_entry_t *e, ngx_uint_t n, ngx_log_t *log)
{
    size_t                        need;
    ngx_uint_t                    i;
    ngx_http_idem_audit_batch_t  *b;

    b = ngx_http_idem_audit_file_batch(f, log);
    if (b == NULL || n > IDEM_AUDIT_FILE_EVENTS) {
        return NULL;
    }

    for (need = 0, i = 0; i < n; i++) {
        need += ngx_http_idem_audit_file_strings(&e[i]);
    }

    if (b->n + n > NGX_HTTP_IDEM_AUDIT_BATCH
        || b->used + need > NGX_HTTP_IDEM_AUDIT_ARENA)
    {
        (void) ngx_http_idem_audit_file_flush_batch(f, b, log);
    }

    return need <= NGX_HTTP_IDEM_AUDIT_ARENA ? b : NULL;
}


/*
 * The entries (at most 4) go into the file now, after those left for
 * later, or none: NGX_ERROR (logged, counted) when they are not all there.
 */
ngx_int_t
ngx_http_idem_audit_file_append(ngx_http_idem_audit_file_t *f,
    idem_audit_entry_t *e, ngx_uint_t n, ngx_log_t *log)
{
    ngx_http_idem_audit_batch_t  *b;

    if (n == 0) {
        return NGX_OK;
    }

    b = ngx_http_idem_audit_file_room(f, e, n, log);
    if (b == NULL) {
        ngx_http_idem_metrics_audit_error();
        return NGX_ERROR;
    }

    ngx_http_idem_audit_file_add(b, e, n);

    return ngx_http_idem_audit_file_flush_batch(f, b, log);
}


/*
 * Entries nothing waits for (after the execution): written at the end of
 * this turn of the event loop with the others of the turn, or before the
 * next entries written now.  A failure is logged and counted then.
 */
void
ngx_http_idem_audit_file_later(ngx_http_idem_audit_file_t *f,
    idem_audit_entry_t *e, ngx_uint_t n, ngx_log_t *log)
{
    ngx_http_idem_audit_batch_t  *b;

    if (n == 0) {
        return;
    }

    b = ngx_http_idem_audit_file_room(f, e, n, log);
    if (b == NULL) {
        ngx_http_idem_metrics_audit_error();
        return;
    }

    ngx_http_idem_audit_file_add(b, e, n);

    if (!b->ev.posted) {
        ngx_post_event(&b->ev, &ngx_posted_events);
    }
}


/*
 * A claim's entries (at most 4), which its request waits for: written at
 * the end of this turn of the event loop with the others of the turn (or
 * with the next entries written now); w's handler is called then, from
 * the posted event.  NGX_ERROR (counted) when they cannot be taken: the
 * handler will not be called.
 */
ngx_int_t
ngx_http_idem_audit_file_wait(ngx_http_idem_audit_file_t *f,
    idem_audit_entry_t *e, ngx_uint_t n, ngx_http_idem_audit_wait_t *w,
    ngx_log_t *log)
{
    ngx_http_idem_audit_batch_t  *b;

    b = ngx_http_idem_audit_file_room(f, e, n, log);
    if (b == NULL || n == 0) {
        ngx_http_idem_metrics_audit_error();
        return NGX_ERROR;
    }

    ngx_http_idem_audit_file_add(b, e, n);

    ngx_queue_insert_tail(&b->pending, &w->queue);
    w->linked = 1;
    w->rc = NGX_ERROR;

    if (!b->ev.posted) {
        ngx_post_event(&b->ev, &ngx_posted_events);
    }

    return NGX_OK;
}
