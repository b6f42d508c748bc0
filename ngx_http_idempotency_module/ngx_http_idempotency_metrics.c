/*
 * idempotency_metrics: counters in one shared memory zone, added to with
 * atomic operations by every worker, and their Prometheus text.
 *
 * The label sets are fixed when the configuration is read (the outcomes,
 * the idempotency_metrics_label names, the workers), so the zone holds one
 * flat array and a scrape never allocates in it.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <time.h>

#include "ngx_http_idempotency_metrics.h"


/* upper bounds of the Redis command duration buckets, in microseconds */
static const uint64_t  ngx_http_idem_buckets[] = {
    100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000,
    250000, 500000, 1000000, 2500000
};

static const char  *ngx_http_idem_bucket_names[] = {
    "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01",
    "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "+Inf"
};

#define NGX_HTTP_IDEM_NBUCKETS                                               \
    (sizeof(ngx_http_idem_buckets) / sizeof(ngx_http_idem_buckets[0]))

static const char  *ngx_http_idem_error_names[] = {
    "connect", "lost", "timeout", "reply"
};

#define NGX_HTTP_IDEM_NOUTCOMES  NGX_HTTP_IDEM_METRICS_OUTCOMES


/*
 * The zone's layout is fixed, so it is allocated once for the zone's life
 * and never freed: workers of an older configuration may still be adding
 * to it during a reload.  A label keeps its slot for the zone's life, so
 * a reload that reorders, adds or drops labels keeps every series' count.
 */
#define NGX_HTTP_IDEM_METRICS_LABELS    128
#define NGX_HTTP_IDEM_METRICS_WORKERS   256
#define NGX_HTTP_IDEM_METRICS_LABEL_LEN 64


/* a worker's connection count, written by that worker alone */
typedef struct {
    ngx_atomic_t                 pid;
    ngx_atomic_t                 links;
} ngx_http_idem_metrics_worker_t;


typedef struct {
    ngx_atomic_t                 requests[NGX_HTTP_IDEM_NOUTCOMES];
    size_t                       len;
    u_char                       name[NGX_HTTP_IDEM_METRICS_LABEL_LEN];
} ngx_http_idem_metrics_label_t;


struct ngx_http_idem_metrics_s {
    ngx_atomic_t                 nlabels;       /* slots in use, only grows */
    ngx_atomic_t                 nworkers;      /* of the latest config */
    ngx_atomic_t                 buckets[NGX_HTTP_IDEM_NBUCKETS + 1];
    ngx_atomic_t                 sum_us;
    ngx_atomic_t                 errors[NGX_HTTP_IDEM_RERR_KINDS];
    ngx_atomic_t                 stored;
    ngx_atomic_t                 audit;         /* entries appended */
    ngx_atomic_t                 audit_lost;    /* races for the head lost */
    ngx_atomic_t                 audit_errors;  /* file entries not written */
    ngx_http_idem_metrics_worker_t  workers[NGX_HTTP_IDEM_METRICS_WORKERS];
    ngx_http_idem_metrics_label_t   labels[NGX_HTTP_IDEM_METRICS_LABELS];
};


typedef struct {
    ngx_array_t                 *labels;        /* ngx_str_t; [0] is "" */
    ngx_cycle_t                 *cycle;
    ngx_http_idem_metrics_t     *metrics;
    ngx_uint_t                  *slots;         /* label index -> slot */
} ngx_http_idem_metrics_zone_t;


ngx_http_idem_metrics_t  *ngx_http_idem_metrics;

static ngx_uint_t        *ngx_http_idem_metrics_slots;
static ngx_uint_t         ngx_http_idem_metrics_nslots;
static ngx_atomic_int_t   ngx_http_idem_metrics_links;


uint64_t
ngx_http_idem_metrics_now(void)
{
    struct timespec  ts;

    (void) clock_gettime(CLOCK_MONOTONIC, &ts);

    return (uint64_t) ts.tv_sec * 1000000 + (uint64_t) ts.tv_nsec / 1000;
}


void
ngx_http_idem_metrics_redis_reply(uint64_t sent)
{
    uint64_t                  us;
    ngx_uint_t                i;
    ngx_http_idem_metrics_t  *m = ngx_http_idem_metrics;

    if (m == NULL || sent == 0) {
        return;
    }

    us = ngx_http_idem_metrics_now() - sent;

    for (i = 0; i < NGX_HTTP_IDEM_NBUCKETS; i++) {
        if (us <= ngx_http_idem_buckets[i]) {
            break;
        }
    }

    /* per bucket here; the scrape adds them up into "le" counts */
    (void) ngx_atomic_fetch_add(&m->buckets[i], 1);
    (void) ngx_atomic_fetch_add(&m->sum_us, (ngx_atomic_int_t) us);
}


void
ngx_http_idem_metrics_redis_error(ngx_http_idem_redis_error_e kind)
{
    if (ngx_http_idem_metrics) {
        (void) ngx_atomic_fetch_add(&ngx_http_idem_metrics->errors[kind], 1);
    }
}


/*
 * A worker owns the slot of its number while its pid is there: a new
 * worker of that number takes the slot over, and a worker shutting down
 * after a reload, whose slot is taken, no longer writes to it.
 */
void
ngx_http_idem_metrics_redis_link(ngx_int_t delta)
{
    ngx_http_idem_metrics_t         *m = ngx_http_idem_metrics;
    ngx_http_idem_metrics_worker_t  *w;

    ngx_http_idem_metrics_links += delta;

    if (m == NULL || ngx_worker >= NGX_HTTP_IDEM_METRICS_WORKERS) {
        return;
    }

    w = &m->workers[ngx_worker];

    if (w->pid == (ngx_atomic_uint_t) ngx_pid) {
        w->links = (ngx_atomic_uint_t) ngx_http_idem_metrics_links;
    }
}


/* the counters and label slots of this cycle's configuration, or none */
void
ngx_http_idem_metrics_init_process(ngx_shm_zone_t *zone)
{
    ngx_http_idem_metrics_t       *m;
    ngx_http_idem_metrics_zone_t  *mz;

    mz = zone ? zone->data : NULL;
    m = mz ? mz->metrics : NULL;

    ngx_http_idem_metrics = m;

    if (m == NULL) {
        return;
    }

    ngx_http_idem_metrics_slots = mz->slots;
    ngx_http_idem_metrics_nslots = mz->labels->nelts;

    if (ngx_worker < NGX_HTTP_IDEM_METRICS_WORKERS) {
        m->workers[ngx_worker].pid = (ngx_atomic_uint_t) ngx_pid;
        m->workers[ngx_worker].links = 0;
    }
}


void
ngx_http_idem_metrics_request(ngx_uint_t label, ngx_uint_t outcome)
{
    ngx_uint_t                slot;
    ngx_http_idem_metrics_t  *m = ngx_http_idem_metrics;

    if (m == NULL || outcome == 0 || outcome > NGX_HTTP_IDEM_NOUTCOMES) {
        return;
    }

    slot = label < ngx_http_idem_metrics_nslots
           ? ngx_http_idem_metrics_slots[label] : 0;

    (void) ngx_atomic_fetch_add(&m->labels[slot].requests[outcome - 1], 1);
}


void
ngx_http_idem_metrics_stored(size_t bytes)
{
    if (ngx_http_idem_metrics) {
        (void) ngx_atomic_fetch_add(&ngx_http_idem_metrics->stored,
                                    (ngx_atomic_int_t) bytes);
    }
}


/*
 * idempotency_audit: entries in the stream (the script said "audited"),
 * or a command that found another head and is hashed again
 */
void
ngx_http_idem_metrics_audit(ngx_uint_t entries, ngx_uint_t lost)
{
    ngx_http_idem_metrics_t  *m = ngx_http_idem_metrics;

    if (m) {
        (void) ngx_atomic_fetch_add(&m->audit, (ngx_atomic_int_t) entries);
        (void) ngx_atomic_fetch_add(&m->audit_lost, (ngx_atomic_int_t) lost);
    }
}


/* idempotency_audit file=: entries that could not be written */
void
ngx_http_idem_metrics_audit_error(void)
{
    if (ngx_http_idem_metrics) {
        (void) ngx_atomic_fetch_add(&ngx_http_idem_metrics->audit_errors, 1);
    }
}


/* ---- configuration */

/* a label value is printed inside "": only what needs no escaping */
static ngx_int_t
ngx_http_idem_metrics_label_valid(ngx_str_t *name)
{
    size_t  i;

    if (name->len == 0 || name->len > NGX_HTTP_IDEM_METRICS_LABEL_LEN) {
        return NGX_ERROR;
    }

    for (i = 0; i < name->len; i++) {
        if (name->data[i] == '\0'
            || !(isalnum(name->data[i]) || ngx_strchr("_-.:/", name->data[i])))
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_idem_metrics_label_add(ngx_conf_t *cf, ngx_array_t *labels,
    ngx_str_t *name, ngx_uint_t *index)
{
    ngx_str_t   *l;
    ngx_uint_t   i;

    if (ngx_http_idem_metrics_label_valid(name) != NGX_OK) {
        return NGX_ERROR;
    }

    l = labels->elts;

    for (i = 0; i < labels->nelts; i++) {
        if (l[i].len == name->len
            && ngx_strncmp(l[i].data, name->data, name->len) == 0)
        {
            *index = i;
            return NGX_OK;
        }
    }

    l = ngx_array_push(labels);
    if (l == NULL) {
        return NGX_ERROR;
    }

    *l = *name;
    *index = labels->nelts - 1;

    return NGX_OK;
}


/* the slot of a label in the zone, taken if it has none yet */
static ngx_int_t
ngx_http_idem_metrics_slot(ngx_http_idem_metrics_t *m, ngx_str_t *name,
    ngx_uint_t *slot)
{
    ngx_uint_t                      i;
    ngx_http_idem_metrics_label_t  *l;

    for (i = 0; i < m->nlabels; i++) {
        l = &m->labels[i];

        if (l->len == name->len
            && ngx_memcmp(l->name, name->data, name->len) == 0)
        {
            *slot = i;
            return NGX_OK;
        }
    }

    if (m->nlabels == NGX_HTTP_IDEM_METRICS_LABELS) {
        return NGX_ERROR;
    }

    /* the name is in place before a scrape can see the slot */
    l = &m->labels[m->nlabels];
    ngx_memcpy(l->name, name->data, name->len);
    l->len = name->len;
    ngx_memory_barrier();

    *slot = m->nlabels++;

    return NGX_OK;
}


static ngx_int_t
ngx_http_idem_metrics_init_zone(ngx_shm_zone_t *zone, void *data)
{
    ngx_str_t                     *names;
    ngx_uint_t                     i;
    ngx_core_conf_t               *ccf;
    ngx_slab_pool_t               *shpool;
    ngx_http_idem_metrics_t       *m;
    ngx_http_idem_metrics_zone_t  *mz = zone->data, *old = data;

    shpool = (ngx_slab_pool_t *) zone->shm.addr;
    m = old ? old->metrics : NULL;

    if (m == NULL) {
        m = ngx_slab_calloc(shpool, sizeof(ngx_http_idem_metrics_t));
        if (m == NULL) {
            ngx_log_error(NGX_LOG_EMERG, zone->shm.log, 0,
                          "idempotency_metrics_zone \"%V\" is too small: "
                          "%uz bytes of counters do not fit",
                          &zone->shm.name, sizeof(ngx_http_idem_metrics_t));
            return NGX_ERROR;
        }

        m->nlabels = 1;         /* slot 0: location="" */
    }

    mz->slots = ngx_palloc(mz->cycle->pool,
                           mz->labels->nelts * sizeof(ngx_uint_t));
    if (mz->slots == NULL) {
        return NGX_ERROR;
    }

    names = mz->labels->elts;

    for (i = 0; i < mz->labels->nelts; i++) {
        if (i == 0) {
            mz->slots[0] = 0;

        } else if (ngx_http_idem_metrics_slot(m, &names[i], &mz->slots[i])
                   != NGX_OK)
        {
            ngx_log_error(NGX_LOG_EMERG, zone->shm.log, 0,
                          "idempotency_metrics_zone \"%V\": more than %d "
                          "labels over its life; restart nginx to reset it",
                          &zone->shm.name, NGX_HTTP_IDEM_METRICS_LABELS);
            return NGX_ERROR;
        }
    }

    /* worker_processes may come after http{}: known only now */
    ccf = (ngx_core_conf_t *) ngx_get_conf(mz->cycle->conf_ctx,
                                           ngx_core_module);
    m->nworkers = ngx_min((ngx_uint_t) ngx_max(ccf->worker_processes, 1),
                          NGX_HTTP_IDEM_METRICS_WORKERS);

    mz->metrics = m;

    return NGX_OK;
}


ngx_shm_zone_t *
ngx_http_idem_metrics_zone(ngx_conf_t *cf, ngx_str_t *name, size_t size,
    ngx_array_t *labels, void *tag)
{
    ngx_shm_zone_t                *zone;
    ngx_http_idem_metrics_zone_t  *mz;

    zone = ngx_shared_memory_add(cf, name, size, tag);
    if (zone == NULL || zone->data) {
        return NULL;
    }

    mz = ngx_pcalloc(cf->pool, sizeof(ngx_http_idem_metrics_zone_t));
    if (mz == NULL) {
        return NULL;
    }

    mz->labels = labels;
    mz->cycle = cf->cycle;

    zone->init = ngx_http_idem_metrics_init_zone;
    zone->data = mz;

    return zone;
}


/* ---- the scrape */

#define NGX_HTTP_IDEM_METRIC_LINE  160

static u_char *
ngx_http_idem_metrics_head(u_char *p, const char *name, const char *type,
    const char *help)
{
    return ngx_sprintf(p, "# HELP %s %s\n# TYPE %s %s\n",
                       name, help, name, type);
}


static u_char *
ngx_http_idem_metrics_requests(u_char *p, ngx_http_idem_metrics_t *m,
    ngx_str_t *outcomes)
{
    ngx_str_t                       name;
    ngx_uint_t                      i, o, n;
    ngx_http_idem_metrics_label_t  *l;

    p = ngx_http_idem_metrics_head(p, "idempotency_requests_total", "counter",
            "Requests the module handled, by outcome and "
            "idempotency_metrics_label.");

    n = m->nlabels;
    ngx_memory_barrier();

    for (i = 0; i < n; i++) {
        l = &m->labels[i];
        name.data = l->name;
        name.len = l->len;

        for (o = 0; o < NGX_HTTP_IDEM_NOUTCOMES; o++) {
            p = ngx_sprintf(p, "idempotency_requests_total"
                               "{outcome=\"%V\",location=\"%V\"} %uA\n",
                            &outcomes[o + 1], &name, l->requests[o]);
        }
    }

    return p;
}


static u_char *
ngx_http_idem_metrics_redis(u_char *p, ngx_http_idem_metrics_t *m)
{
    ngx_uint_t         i;
    ngx_atomic_uint_t  n;

    p = ngx_http_idem_metrics_head(p,
            "idempotency_redis_command_duration_seconds", "histogram",
            "Time from writing a command to Redis to reading its reply.");

    for (i = 0, n = 0; i <= NGX_HTTP_IDEM_NBUCKETS; i++) {
        n += m->buckets[i];
        p = ngx_sprintf(p, "idempotency_redis_command_duration_seconds_bucket"
                           "{le=\"%s\"} %uA\n",
                        ngx_http_idem_bucket_names[i], n);
    }

    p = ngx_sprintf(p, "idempotency_redis_command_duration_seconds_sum "
                       "%uA.%06uA\n"
                       "idempotency_redis_command_duration_seconds_count "
                       "%uA\n",
                    m->sum_us / 1000000, m->sum_us % 1000000, n);

    p = ngx_http_idem_metrics_head(p, "idempotency_redis_errors_total",
            "counter", "Redis commands or connections that failed, by kind.");

    for (i = 0; i < NGX_HTTP_IDEM_RERR_KINDS; i++) {
        p = ngx_sprintf(p, "idempotency_redis_errors_total{kind=\"%s\"} %uA\n",
                        ngx_http_idem_error_names[i], m->errors[i]);
    }

    p = ngx_http_idem_metrics_head(p, "idempotency_redis_connected", "gauge",
            "Redis servers a worker's command connection is up to.");

    for (i = 0; i < m->nworkers; i++) {
        p = ngx_sprintf(p, "idempotency_redis_connected{worker=\"%ui\"} %uA\n",
                        i, m->workers[i].links);
    }

    return p;
}


/* NGX_ERROR: no memory, or no counters (no zone) */
ngx_int_t
ngx_http_idem_metrics_text(ngx_pool_t *pool, ngx_shm_zone_t *zone,
    ngx_str_t *outcomes, ngx_uint_t noutcomes, ngx_str_t *text)
{
    size_t                         size;
    u_char                        *p;
    ngx_http_idem_metrics_t       *m;
    ngx_http_idem_metrics_zone_t  *mz = zone->data;

    m = mz->metrics;

    if (m == NULL || noutcomes != NGX_HTTP_IDEM_NOUTCOMES + 1) {
        return NGX_ERROR;
    }

    size = (NGX_HTTP_IDEM_METRICS_LABELS * NGX_HTTP_IDEM_NOUTCOMES
            + NGX_HTTP_IDEM_NBUCKETS
            + m->nworkers + NGX_HTTP_IDEM_RERR_KINDS + 16)
           * (NGX_HTTP_IDEM_METRIC_LINE + NGX_ATOMIC_T_LEN) + 2048;

    text->data = ngx_pnalloc(pool, size);
    if (text->data == NULL) {
        return NGX_ERROR;
    }

    p = ngx_http_idem_metrics_requests(text->data, m, outcomes);
    p = ngx_http_idem_metrics_redis(p, m);

    p = ngx_http_idem_metrics_head(p, "idempotency_stored_bytes_total",
            "counter", "Bytes of responses (headers and body) stored in "
            "records.");
    p = ngx_sprintf(p, "idempotency_stored_bytes_total %uA\n", m->stored);

    p = ngx_http_idem_metrics_head(p, "idempotency_audit_appends_total",
            "counter", "Entries appended to audit streams "
            "(idempotency_audit).");
    p = ngx_sprintf(p, "idempotency_audit_appends_total %uA\n", m->audit);

    p = ngx_http_idem_metrics_head(p, "idempotency_audit_races_lost_total",
            "counter", "Audited commands that found another head of the "
            "stream (another worker or host appended first) and were hashed "
            "again.");
    p = ngx_sprintf(p, "idempotency_audit_races_lost_total %uA\n",
                    m->audit_lost);

    p = ngx_http_idem_metrics_head(p, "idempotency_audit_errors_total",
            "counter", "Audit writes that failed, by device (the file's: "
            "logged at alert; before execution the request was refused).");
    p = ngx_sprintf(p, "idempotency_audit_errors_total{device=\"file\"} "
                    "%uA\n", m->audit_errors);

    text->len = p - text->data;

    return NGX_OK;
}
