/*
 * ngx_http_idempotency_module: the directives, their configuration, and
 * the module's registration with nginx (phase handlers, filters, worker
 * start and exit).  docs/architecture.md maps the other files.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_sentinel.h"
#include "ngx_http_idempotency_cluster.h"
#include "ngx_http_idempotency_redis_conf.h"
#include "ngx_http_idempotency_ops.h"


static ngx_int_t ngx_http_idem_postconfiguration(ngx_conf_t *cf);
static void *ngx_http_idem_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_idem_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_idem_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_idem_enable(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idem_redis_wait(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idem_methods(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idem_lowercase_list(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idem_fp_exclude(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idem_conflict_status(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_idem_enum(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idem_release_statuses(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_idem_check_positive_sec(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_idem_check_positive_msec(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_idem_thread_pool(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idem_approve_page_conf(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_idem_unset_cv_slot(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idem_approve_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static ngx_int_t ngx_http_idem_init_process(ngx_cycle_t *cycle);
static void ngx_http_idem_exit_process(ngx_cycle_t *cycle);


static ngx_conf_enum_t  ngx_http_idem_failure_modes[] = {
    { ngx_string("closed"), NGX_HTTP_IDEM_FAILURE_CLOSED },
    { ngx_string("open"), NGX_HTTP_IDEM_FAILURE_OPEN },
    { ngx_null_string, 0 }
};

static ngx_conf_post_t  ngx_http_idem_positive_sec =
    { ngx_http_idem_check_positive_sec };

static ngx_conf_post_t  ngx_http_idem_positive_msec =
    { ngx_http_idem_check_positive_msec };


#define NGX_HTTP_IDEM_CONF_ANY                                               \
    (NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF)


static ngx_command_t  ngx_http_idem_commands[] = {

    { ngx_string("idempotency"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_FLAG,
      ngx_http_idem_enable,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, enable),
      NULL },

    { ngx_string("idempotency_redis"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_1MORE,
      ngx_http_idem_redis,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_redis_wait"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE12,
      ngx_http_idem_redis_wait,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_redis_sentinel"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_2MORE,
      ngx_http_idem_redis_sentinel,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_redis_cluster"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_1MORE,
      ngx_http_idem_redis_cluster,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_methods"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_1MORE,
      ngx_http_idem_methods,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, methods),
      NULL },

    { ngx_string("idempotency_key_header"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, key_header),
      NULL },

    { ngx_string("idempotency_required"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, required),
      NULL },

    { ngx_string("idempotency_scope"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, scope),
      NULL },

    { ngx_string("idempotency_ttl"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_conf_set_sec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, ttl),
      &ngx_http_idem_positive_sec },

    { ngx_string("idempotency_lease"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, lease),
      &ngx_http_idem_positive_msec },

    { ngx_string("idempotency_wait"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, wait),
      NULL },

    { ngx_string("idempotency_complete_beside"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, complete_beside),
      NULL },

    { ngx_string("idempotency_conflict_status"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_http_idem_conflict_status,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, conflict_status),
      NULL },

    { ngx_string("idempotency_store_max"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, store_max),
      NULL },

    { ngx_string("idempotency_store_headers"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_1MORE,
      ngx_http_idem_lowercase_list,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, store_headers),
      NULL },

    { ngx_string("idempotency_store_failure"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_http_idem_enum,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, store_failure),
      &ngx_http_idem_failure_modes },

    { ngx_string("idempotency_release_statuses"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_1MORE,
      ngx_http_idem_release_statuses,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, release_statuses),
      NULL },

    { ngx_string("idempotency_fingerprint_headers"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_1MORE,
      ngx_http_idem_lowercase_list,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, fp_headers),
      NULL },

    { ngx_string("idempotency_fingerprint_exclude"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_1MORE,
      ngx_http_idem_fp_exclude,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_thread_pool"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE12,
      ngx_http_idem_thread_pool,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_status"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_idem_status,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_admin"),
      NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_http_idem_admin,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_metrics"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_idem_metrics_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_metrics_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE2,
      ngx_http_idem_metrics_zone_conf,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_confirm"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_http_idem_confirm_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_confirm_key"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE23,
      ngx_http_idem_confirm_key_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_confirm_show"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_1MORE,
      ngx_http_idem_confirm_show_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_confirm_describe"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_http_idem_unset_cv_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, confirm_describe),
      NULL },

    { ngx_string("idempotency_confirm_link"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, confirm_link),
      NULL },

    { ngx_string("idempotency_approve_identity"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_http_idem_unset_cv_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, approve_identity),
      NULL },

    { ngx_string("idempotency_confirm_ttl"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_conf_set_sec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, confirm_ttl),
      &ngx_http_idem_positive_sec },

    { ngx_string("idempotency_metrics_label"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_http_idem_metrics_label,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_approve"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_idem_approve_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_approve_page"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS|NGX_CONF_TAKE12,
      ngx_http_idem_approve_page_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_json_var"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE2,
      ngx_http_idem_json_var,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_unique"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE12,
      ngx_http_idem_business_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, unique),
      NULL },

    { ngx_string("idempotency_lock"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE12,
      ngx_http_idem_business_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, lock),
      NULL },

    { ngx_string("idempotency_json_types"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_1MORE,
      ngx_http_idem_lowercase_list,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, json_types),
      NULL },

    { ngx_string("idempotency_audit"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE123,
      ngx_http_idem_audit_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_audit_identity"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idem_loc_conf_t, audit_identity),
      NULL },

    { ngx_string("idempotency_audit_ref_header"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_http_idem_audit_ref_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_audit_key"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE1,
      ngx_http_idem_audit_key_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_audit_stream"),
      NGX_HTTP_IDEM_CONF_ANY|NGX_CONF_TAKE12,
      ngx_http_idem_audit_stream_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_idem_module_ctx = {
    ngx_http_idem_add_variables,           /* preconfiguration */
    ngx_http_idem_postconfiguration,       /* postconfiguration */

    ngx_http_idem_create_main_conf,        /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_idem_create_loc_conf,         /* create location configuration */
    ngx_http_idem_merge_loc_conf           /* merge location configuration */
};


ngx_module_t  ngx_http_idempotency_module = {
    NGX_MODULE_V1,
    &ngx_http_idem_module_ctx,             /* module context */
    ngx_http_idem_commands,                /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_idem_init_process,            /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_idem_exit_process,            /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


/* configuration */

static void *
ngx_http_idem_create_main_conf(ngx_conf_t *cf)
{
    ngx_str_t                  *label;
    ngx_http_idem_main_conf_t  *mcf;

    mcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_idem_main_conf_t));
    if (mcf == NULL) {
        return NULL;
    }

    if (ngx_array_init(&mcf->servers, cf->pool, 1,
                       sizeof(ngx_http_idem_redis_t *))
        != NGX_OK)
    {
        return NULL;
    }

    if (ngx_array_init(&mcf->metrics_labels, cf->pool, 4, sizeof(ngx_str_t))
        != NGX_OK
        || ngx_array_init(&mcf->json_vars, cf->pool, 4,
                          sizeof(ngx_http_idem_json_var_t))
           != NGX_OK
        || ngx_array_init(&mcf->audits, cf->pool, 1,
                          sizeof(ngx_http_idem_audit_t *))
           != NGX_OK
        || ngx_array_init(&mcf->audit_files, cf->pool, 1,
                          sizeof(ngx_http_idem_audit_file_t *))
           != NGX_OK)
    {
        return NULL;
    }

    mcf->request_id = NGX_CONF_UNSET;

    /* label 0: locations without idempotency_metrics_label */
    label = ngx_array_push(&mcf->metrics_labels);
    if (label == NULL) {
        return NULL;
    }

    ngx_str_null(label);

    return mcf;
}


static void *
ngx_http_idem_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_idem_loc_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool, sizeof(ngx_http_idem_loc_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     conf->redis = NULL;
     *     conf->methods = 0;
     *     conf->key_header = { 0, NULL };
     *     conf->scope = NULL;
     */

    conf->enable = NGX_CONF_UNSET;
    conf->required = NGX_CONF_UNSET;
    conf->ttl = NGX_CONF_UNSET;
    conf->lease = NGX_CONF_UNSET_MSEC;
    conf->wait = NGX_CONF_UNSET_MSEC;
    conf->complete_beside = NGX_CONF_UNSET;
    conf->wait_replicas = NGX_CONF_UNSET_UINT;
    conf->wait_replicas_timeout = NGX_CONF_UNSET_MSEC;
    conf->conflict_status = NGX_CONF_UNSET_UINT;
    conf->store_max = NGX_CONF_UNSET_SIZE;
    conf->store_headers = NGX_CONF_UNSET_PTR;
    conf->store_failure = NGX_CONF_UNSET_UINT;
    conf->fp_headers = NGX_CONF_UNSET_PTR;
    conf->fp_exclude = NGX_CONF_UNSET_PTR;
    conf->release_statuses = NGX_CONF_UNSET_PTR;
    conf->thread_pool = NGX_CONF_UNSET_PTR;
    conf->metrics_label = NGX_CONF_UNSET_UINT;
    conf->thread_min = NGX_CONF_UNSET_SIZE;
    conf->confirm = NGX_CONF_UNSET_PTR;
    conf->confirm_keys = NGX_CONF_UNSET_PTR;
    conf->confirm_show = NGX_CONF_UNSET_PTR;
    conf->confirm_ttl = NGX_CONF_UNSET;
    conf->confirm_describe = NGX_CONF_UNSET_PTR;
    conf->approve_identity = NGX_CONF_UNSET_PTR;
    conf->unique = NGX_CONF_UNSET_PTR;
    conf->lock = NGX_CONF_UNSET_PTR;
    conf->json_types = NGX_CONF_UNSET_PTR;
    conf->audit_on = NGX_CONF_UNSET;
    conf->audit_file = NGX_CONF_UNSET_PTR;
    conf->audit_key = NGX_CONF_UNSET_PTR;

    return conf;
}


/*
 * Tracing, connection and the key header itself never count toward the
 * fingerprint (docs/fingerprint.md), and a name listed twice would make
 * the headers object ambiguous.
 */
static char *
ngx_http_idem_check_fp_headers(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *conf)
{
    ngx_str_t   *names;
    ngx_uint_t   i, j;

    static ngx_str_t  never[] = {
        ngx_string("connection"), ngx_string("keep-alive"),
        ngx_string("te"), ngx_string("trailer"),
        ngx_string("transfer-encoding"), ngx_string("upgrade"),
        ngx_string("proxy-connection"), ngx_string("content-length"),
        ngx_string("traceparent"), ngx_string("tracestate"),
        ngx_string("baggage"), ngx_string("x-request-id"),
        ngx_string("x-b3-traceid"), ngx_string("x-b3-spanid"),
        ngx_string("x-b3-parentspanid"), ngx_string("x-b3-sampled"),
        ngx_string("b3"), ngx_string("uber-trace-id"),
        ngx_string("x-amzn-trace-id"), ngx_string("x-cloud-trace-context"),
        ngx_null_string
    };

    if (conf->fp_headers == NULL) {
        return NGX_CONF_OK;
    }

    names = conf->fp_headers->elts;

    for (i = 0; i < conf->fp_headers->nelts; i++) {

        for (j = 0; never[j].len; j++) {
            if (names[i].len == never[j].len
                && ngx_strncmp(names[i].data, never[j].data, never[j].len)
                   == 0)
            {
                goto excluded;
            }
        }

        if (names[i].len == conf->key_header.len
            && ngx_strncasecmp(names[i].data, conf->key_header.data,
                               names[i].len) == 0)
        {
            goto excluded;
        }

        for (j = 0; j < i; j++) {
            if (names[i].len == names[j].len
                && ngx_strncmp(names[i].data, names[j].data, names[i].len)
                   == 0)
            {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "header \"%V\" is listed twice in "
                                   "\"idempotency_fingerprint_headers\"",
                                   &names[i]);
                return NGX_CONF_ERROR;
            }
        }
    }

    return NGX_CONF_OK;

excluded:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "header \"%V\" in \"idempotency_fingerprint_headers\" "
                       "never counts toward the fingerprint (connection, "
                       "tracing or the key header itself)", &names[i]);
    return NGX_CONF_ERROR;
}


/* 429 and 503 mean "not done, try later": the key is given back */
static ngx_array_t *
ngx_http_idem_default_releases(ngx_conf_t *cf)
{
    ngx_uint_t   *s;
    ngx_array_t  *a;

    a = ngx_array_create(cf->pool, 2, sizeof(ngx_uint_t));
    if (a == NULL) {
        return NULL;
    }

    s = ngx_array_push_n(a, 2);
    if (s == NULL) {
        return NULL;
    }

    s[0] = NGX_HTTP_TOO_MANY_REQUESTS;
    s[1] = NGX_HTTP_SERVICE_UNAVAILABLE;

    return a;
}


/*
 * Redis answers WAIT when its timeout is up, and every command queued
 * behind it on the connection waits that long.  Writes of one setting
 * share a WAIT, so with the replicas gone each distinct setting may hold
 * the connection once: together they must stay below the command timeout.
 */
static char *
ngx_http_idem_check_redis_wait(ngx_conf_t *cf, ngx_http_idem_redis_t *rd,
    ngx_uint_t replicas, ngx_msec_t timeout)
{
    ngx_uint_t   i;
    ngx_msec_t  *w;

    if (rd->waits == NULL) {
        rd->waits = ngx_array_create(cf->pool, 2, 2 * sizeof(ngx_msec_t));
        if (rd->waits == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    w = rd->waits->elts;

    for (i = 0; i < rd->waits->nelts; i++) {
        if (w[2 * i] == replicas && w[2 * i + 1] == timeout) {
            return NGX_CONF_OK;
        }
    }

    w = ngx_array_push(rd->waits);
    if (w == NULL) {
        return NGX_CONF_ERROR;
    }

    w[0] = replicas;
    w[1] = timeout;
    rd->waits_sum += timeout;

    if (rd->waits_sum >= rd->timeout) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_redis_wait\": the WAIT timeouts "
                           "of the distinct settings on redis %V add up to "
                           "%Mms, which must be shorter than its timeout= "
                           "(%Mms)", &rd->name, rd->waits_sum, rd->timeout);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* the replica count and its timeout are one directive, inherited together */
static char *
ngx_http_idem_merge_redis_wait(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *prev,
    ngx_http_idem_loc_conf_t *conf)
{
    if (conf->wait_replicas == NGX_CONF_UNSET_UINT) {
        conf->wait_replicas = prev->wait_replicas;
        conf->wait_replicas_timeout = prev->wait_replicas_timeout;
    }

    ngx_conf_merge_uint_value(conf->wait_replicas, NGX_CONF_UNSET_UINT, 0);
    ngx_conf_merge_msec_value(conf->wait_replicas_timeout,
                              NGX_CONF_UNSET_MSEC,
                              NGX_HTTP_IDEM_WAIT_REPLICAS_TIMEOUT);

    if (!conf->enable || !conf->wait_replicas || conf->redis == NULL) {
        return NGX_CONF_OK;
    }

    return ngx_http_idem_check_redis_wait(cf, conf->redis,
                                          conf->wait_replicas,
                                          conf->wait_replicas_timeout);
}


/* values inherited as a whole: the release statuses, the thread pool */
static char *
ngx_http_idem_merge_lists(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *prev,
    ngx_http_idem_loc_conf_t *conf)
{
    if (conf->release_statuses == NGX_CONF_UNSET_PTR) {
        if (prev->release_statuses == NGX_CONF_UNSET_PTR) {
            prev->release_statuses = ngx_http_idem_default_releases(cf);
            if (prev->release_statuses == NULL) {
                return NGX_CONF_ERROR;
            }
        }

        conf->release_statuses = prev->release_statuses;
    }

    /* the pool and its threshold are one directive, inherited together */
    if (conf->thread_pool == NGX_CONF_UNSET_PTR) {
        conf->thread_pool = prev->thread_pool;
        conf->thread_min = prev->thread_min;
    }

    ngx_conf_merge_ptr_value(conf->thread_pool, NGX_CONF_UNSET_PTR, NULL);
    ngx_conf_merge_size_value(conf->thread_min, NGX_CONF_UNSET_SIZE,
                              NGX_HTTP_IDEM_THREAD_MIN);

    return NGX_CONF_OK;
}


/* a later directive took the location from the module's content handler */
static char *
ngx_http_idem_check_content(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    if (conf->content == NULL) {
        return NGX_CONF_OK;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (clcf->handler == conf->content) {
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "location \"%V\" has \"idempotency_status\", "
                       "\"idempotency_admin\", \"idempotency_approve\" or "
                       "\"idempotency_metrics\" and another content "
                       "handler (proxy_pass, return...)",
                       &clcf->name);

    return NGX_CONF_ERROR;
}


/*
 * A unique or lock key is in another hash slot than the record it goes
 * with (docs/business-keys.md): on a Redis Cluster it is taken in a step
 * of its own after the claim (ngx_http_idempotency_bkeys.c).  That step
 * neither waits for replicas nor writes audit entries yet, so with
 * idempotency_redis_wait or idempotency_audit the pair is refused.
 */
static char *
ngx_http_idem_check_cluster(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *conf)
{
    if (!conf->enable || conf->redis == NULL
        || conf->redis->topology != NGX_HTTP_IDEM_TOPO_CLUSTER
        || (conf->unique == NULL && conf->lock == NULL)
        || (conf->wait_replicas == 0 && conf->audit == NULL))
    {
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"%s\" with \"idempotency_redis_cluster\" cannot "
                       "be used with \"%s\": its key is taken in its own "
                       "hash slot, in a step that does not %s",
                       conf->unique ? "idempotency_unique"
                                    : "idempotency_lock",
                       conf->audit ? "idempotency_audit"
                                   : "idempotency_redis_wait",
                       conf->audit ? "write audit entries"
                                   : "wait for replicas");

    return NGX_CONF_ERROR;
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
static char *
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


/* the Allow of a guarded location's 405: what it answers, and handles */
static char *
ngx_http_idem_guard_allow(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *conf)
{
    u_char      *p;
    ngx_uint_t   i;

    static struct {
        ngx_uint_t   mask;
        const char  *name;
    }  handled[] = {
        { NGX_HTTP_POST, ", POST" }, { NGX_HTTP_PUT, ", PUT" },
        { NGX_HTTP_PATCH, ", PATCH" }, { NGX_HTTP_DELETE, ", DELETE" }
    };

    p = ngx_pnalloc(cf->pool, sizeof("GET, HEAD, OPTIONS, POST, PUT, PATCH, "
                                     "DELETE"));
    if (p == NULL) {
        return NGX_CONF_ERROR;
    }

    conf->allow.data = p;
    p = ngx_cpymem(p, "GET, HEAD, OPTIONS", sizeof("GET, HEAD, OPTIONS") - 1);

    for (i = 0; i < sizeof(handled) / sizeof(handled[0]); i++) {
        if (conf->methods & handled[i].mask) {
            p = ngx_cpymem(p, handled[i].name, ngx_strlen(handled[i].name));
        }
    }

    conf->allow.len = p - conf->allow.data;

    return NGX_CONF_OK;
}


/* idempotency_json_types: "type/subtype", no parameter */
static char *
ngx_http_idem_check_json_types(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *conf)
{
    u_char      *slash;
    ngx_str_t   *t;
    ngx_uint_t   i;

    t = conf->json_types ? conf->json_types->elts : NULL;

    for (i = 0; t && i < conf->json_types->nelts; i++) {
        slash = ngx_strlchr(t[i].data, t[i].data + t[i].len, '/');

        if (slash == NULL || slash == t[i].data
            || slash == t[i].data + t[i].len - 1
            || ngx_strlchr(t[i].data, t[i].data + t[i].len, ';')
            || ngx_strlchr(t[i].data, t[i].data + t[i].len, '*')
            || ngx_strlchr(slash + 1, t[i].data + t[i].len, '/'))
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_json_types\": \"%V\" is not "
                               "a media type (type/subtype, without "
                               "parameters or wildcards)", &t[i]);
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


/*
 * A location with idempotency_confirm, _unique or _lock is guarded
 * (docs/directives.md, "Guarded locations"): it refuses a request without
 * a key, so an explicit "idempotency_required off" there says the
 * opposite of what it does; and store_failure open does not apply to it.
 */
static char *
ngx_http_idem_guard_merge(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *prev,
    ngx_http_idem_loc_conf_t *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    if (ngx_http_idem_check_json_types(cf, conf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    conf->loc_name = clcf->name;

    conf->guarded = conf->enable && !conf->ops
                    && (conf->confirm || conf->unique || conf->lock);

    if (!conf->guarded) {
        return NGX_CONF_OK;
    }

    if (conf->required == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_required off\" cannot be used "
                           "where \"%s\" is in effect: a guarded location "
                           "refuses a request without a key",
                           conf->confirm ? "idempotency_confirm"
                           : conf->unique ? "idempotency_unique"
                                          : "idempotency_lock");
        return NGX_CONF_ERROR;
    }

    if (conf->store_failure == NGX_HTTP_IDEM_FAILURE_OPEN) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"idempotency_store_failure open\" does not "
                           "apply where \"%s\" is in effect: a guarded "
                           "request is answered 503 while the store is "
                           "unreachable",
                           conf->confirm ? "idempotency_confirm"
                           : conf->unique ? "idempotency_unique"
                                          : "idempotency_lock");
    }

    if (ngx_http_idem_guard_allow(cf, conf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    return ngx_http_idem_guard_names(cf, conf);
}


static char *
ngx_http_idem_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_idem_loc_conf_t *prev = parent;
    ngx_http_idem_loc_conf_t *conf = child;

    ngx_conf_merge_value(conf->enable, prev->enable, 0);

    if (conf->redis == NULL) {
        conf->redis = prev->redis;
    }

    ngx_conf_merge_bitmask_value(conf->methods, prev->methods,
                                 NGX_CONF_BITMASK_SET
                                 |NGX_HTTP_POST|NGX_HTTP_PUT|NGX_HTTP_PATCH);

    ngx_conf_merge_str_value(conf->key_header, prev->key_header,
                             "Idempotency-Key");
    /* unset stays unset: a guard implies it, an explicit off is refused */
    ngx_conf_merge_value(conf->required, prev->required, NGX_CONF_UNSET);

    if (conf->scope == NULL) {
        conf->scope = prev->scope;
    }

    ngx_conf_merge_sec_value(conf->ttl, prev->ttl, 86400);
    ngx_conf_merge_msec_value(conf->lease, prev->lease, 60000);
    ngx_conf_merge_msec_value(conf->wait, prev->wait, 0);
    ngx_conf_merge_value(conf->complete_beside, prev->complete_beside, 0);
    ngx_conf_merge_uint_value(conf->conflict_status, prev->conflict_status,
                              NGX_HTTP_CONFLICT);
    ngx_conf_merge_size_value(conf->store_max, prev->store_max,
                              1024 * 1024);
    ngx_conf_merge_ptr_value(conf->store_headers, prev->store_headers, NULL);
    ngx_conf_merge_uint_value(conf->store_failure, prev->store_failure,
                              NGX_HTTP_IDEM_FAILURE_CLOSED);
    ngx_conf_merge_ptr_value(conf->fp_headers, prev->fp_headers, NULL);
    ngx_conf_merge_uint_value(conf->metrics_label, prev->metrics_label, 0);
    ngx_conf_merge_ptr_value(conf->fp_exclude, prev->fp_exclude, NULL);
    ngx_conf_merge_ptr_value(conf->unique, prev->unique, NULL);
    ngx_conf_merge_ptr_value(conf->lock, prev->lock, NULL);
    ngx_conf_merge_ptr_value(conf->json_types, prev->json_types, NULL);

    if (ngx_http_idem_merge_lists(cf, prev, conf) != NGX_CONF_OK
        || ngx_http_idem_check_fp_headers(cf, conf) != NGX_CONF_OK
        || ngx_http_idem_merge_redis_wait(cf, prev, conf) != NGX_CONF_OK
        || ngx_http_idem_confirm_merge(cf, prev, conf) != NGX_CONF_OK
        || ngx_http_idem_audit_merge(cf, prev, conf) != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (ngx_http_idem_check_content(cf, conf) != NGX_CONF_OK
        || ngx_http_idem_check_cluster(cf, conf) != NGX_CONF_OK
        || ngx_http_idem_guard_merge(cf, prev, conf) != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (conf->enable && conf->wait && conf->redis) {
        /* its workers subscribe to completion announcements */
        conf->redis->subscribe = 1;
    }

    if ((conf->enable || conf->ops) && conf->redis == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%s\" needs \"idempotency_redis\" (or "
                           "\"idempotency_redis_sentinel\", "
                           "\"idempotency_redis_cluster\") "
                           "in the same or an enclosing block",
                           conf->enable ? "idempotency on"
                                        : "idempotency_status/admin/approve");
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_idem_enable(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char                       *rv;
    ngx_http_idem_loc_conf_t   *lcf = conf;
    ngx_http_idem_main_conf_t  *mcf;

    rv = ngx_conf_set_flag_slot(cf, cmd, conf);

    if (rv == NGX_CONF_OK && lcf->enable) {
        mcf = ngx_http_conf_get_module_main_conf(cf,
                                                 ngx_http_idempotency_module);
        mcf->used = 1;
    }

    return rv;
}


static char *
ngx_http_idem_check_positive_sec(ngx_conf_t *cf, void *post, void *data)
{
    time_t  *t = data;

    if (*t <= 0) {
        return "must be greater than zero";
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_idem_check_positive_msec(ngx_conf_t *cf, void *post, void *data)
{
    ngx_msec_t  *t = data;

    if (*t == 0) {
        return "must be greater than zero";
    }

    return NGX_CONF_OK;
}


/*
 * ngx_conf_set_enum_slot() for two-valued enums, with an error that names
 * the directive and both values.
 */
static char *
ngx_http_idem_enum(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    ngx_str_t        *value;
    ngx_uint_t       *np, i;
    ngx_conf_enum_t  *e;

    np = (ngx_uint_t *) (p + cmd->offset);

    if (*np != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    for (e = cmd->post, i = 0; e[i].name.len != 0; i++) {
        if (e[i].name.len == value[1].len
            && ngx_strcasecmp(e[i].name.data, value[1].data) == 0)
        {
            *np = e[i].value;
            return NGX_CONF_OK;
        }
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid value \"%V\" in \"%V\" directive, "
                       "it must be one of \"%V\" or \"%V\"",
                       &value[1], &cmd->name, &e[0].name, &e[1].name);

    return NGX_CONF_ERROR;
}


static char *
ngx_http_idem_conflict_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    ngx_str_t  *value;

    if (lcf->conflict_status != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "409") == 0) {
        lcf->conflict_status = NGX_HTTP_CONFLICT;

    } else if (ngx_strcmp(value[1].data, "422") == 0) {
        lcf->conflict_status = 422;

    } else {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%V\" directive, "
                           "it must be 409 or 422", &value[1], &cmd->name);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* idempotency_thread_pool off | name [min_size=size] */
static char *
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


static char *
ngx_http_idem_release_statuses(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    ngx_int_t    n;
    ngx_str_t   *value;
    ngx_uint_t   i, *s;

    if (lcf->release_statuses != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (cf->args->nelts == 2 && ngx_strcmp(value[1].data, "off") == 0) {
        lcf->release_statuses = NULL;
        return NGX_CONF_OK;
    }

    lcf->release_statuses = ngx_array_create(cf->pool, cf->args->nelts - 1,
                                             sizeof(ngx_uint_t));
    if (lcf->release_statuses == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = 1; i < cf->args->nelts; i++) {
        n = ngx_atoi(value[i].data, value[i].len);

        if (n < 200 || n > 599) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid status \"%V\" in \"%V\" directive, "
                               "it must be from 200 to 599 or \"off\"",
                               &value[i], &cmd->name);
            return NGX_CONF_ERROR;
        }

        s = ngx_array_push(lcf->release_statuses);
        if (s == NULL) {
            return NGX_CONF_ERROR;
        }

        *s = (ngx_uint_t) n;
    }

    return NGX_CONF_OK;
}


/* idempotency_redis_wait off | replicas [timeout] */
static char *
ngx_http_idem_redis_wait(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t *lcf = conf;

    ngx_int_t   n;
    ngx_msec_t  t;
    ngx_str_t  *value;

    if (lcf->wait_replicas != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        if (cf->args->nelts != 2) {
            return "takes no timeout with \"off\"";
        }

        lcf->wait_replicas = 0;
        lcf->wait_replicas_timeout = NGX_HTTP_IDEM_WAIT_REPLICAS_TIMEOUT;
        return NGX_CONF_OK;
    }

    n = ngx_atoi(value[1].data, value[1].len);
    if (n < 1 || n > NGX_HTTP_IDEM_WAIT_REPLICAS_MAX) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\": invalid replica count \"%V\": "
                           "\"off\" or 1 to %d", &cmd->name, &value[1],
                           NGX_HTTP_IDEM_WAIT_REPLICAS_MAX);
        return NGX_CONF_ERROR;
    }

    t = NGX_HTTP_IDEM_WAIT_REPLICAS_TIMEOUT;

    if (cf->args->nelts == 3) {
        /* WAIT 0 would block the connection until the replicas answer */
        t = ngx_parse_time(&value[2], 0);
        if (t == (ngx_msec_t) NGX_ERROR || t == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"%V\": invalid timeout \"%V\": a time "
                               "above 0, e.g. 100ms", &cmd->name, &value[2]);
            return NGX_CONF_ERROR;
        }
    }

    lcf->wait_replicas = (ngx_uint_t) n;
    lcf->wait_replicas_timeout = t;

    return NGX_CONF_OK;
}


static char *
ngx_http_idem_methods(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    ngx_str_t   *value;
    ngx_uint_t   i, m;

    static ngx_conf_bitmask_t  methods[] = {
        { ngx_string("POST"), NGX_HTTP_POST },
        { ngx_string("PUT"), NGX_HTTP_PUT },
        { ngx_string("PATCH"), NGX_HTTP_PATCH },
        { ngx_string("DELETE"), NGX_HTTP_DELETE },
        { ngx_null_string, 0 }
    };

    if (lcf->methods) {
        return "is duplicate";
    }

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {
        for (m = 0; methods[m].name.len; m++) {
            if (value[i].len == methods[m].name.len
                && ngx_strcmp(value[i].data, methods[m].name.data) == 0)
            {
                break;
            }
        }

        if (methods[m].name.len == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid method \"%V\" in \"%V\" directive, "
                               "it must be POST, PUT, PATCH or DELETE",
                               &value[i], &cmd->name);
            return NGX_CONF_ERROR;
        }

        lcf->methods |= methods[m].mask;
    }

    lcf->methods |= NGX_CONF_BITMASK_SET;

    return NGX_CONF_OK;
}


static char *
ngx_http_idem_lowercase_list(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    ngx_str_t     *value, *name;
    ngx_uint_t     i;
    ngx_array_t  **a;

    a = (ngx_array_t **) (p + cmd->offset);

    if (*a != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    *a = ngx_array_create(cf->pool, cf->args->nelts, sizeof(ngx_str_t));
    if (*a == NULL) {
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {
        name = ngx_array_push(*a);
        if (name == NULL) {
            return NGX_CONF_ERROR;
        }

        name->len = value[i].len;
        name->data = ngx_pnalloc(cf->pool, name->len);
        if (name->data == NULL) {
            return NGX_CONF_ERROR;
        }

        ngx_strlow(name->data, value[i].data, name->len);
    }

    return NGX_CONF_OK;
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
static char *
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


/*
 * ngx_http_set_complex_value_slot for a field that starts as
 * NGX_CONF_UNSET_PTR (merged by ngx_conf_merge_ptr_value): nginx's slot
 * takes a NULL field as unset, and not every version takes UNSET_PTR too
 */
static char *
ngx_http_idem_unset_cv_slot(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_complex_value_t  **cv;

    cv = (ngx_http_complex_value_t **) ((char *) conf + cmd->offset);

    if (*cv != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    *cv = NULL;

    return ngx_http_set_complex_value_slot(cf, cmd, conf);
}


/* idempotency_approve: recorded approvals, protected by the operator */
static char *
ngx_http_idem_approve_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    lcf->ops = 1;

    return ngx_http_idem_ops_location(cf, ngx_http_idem_approve_handler);
}


/* idempotency_approve_page: the approvers' page (_page.c) */
static char *
ngx_http_idem_approve_page_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    if (lcf->page_secret) {
        return "is duplicate";
    }

    lcf->ops = 1;

    if (ngx_http_idem_page_conf(cf, lcf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    return ngx_http_idem_ops_location(cf, ngx_http_idem_page_handler);
}


static ngx_int_t
ngx_http_idem_postconfiguration(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;
    ngx_http_idem_main_conf_t  *mcf;

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    if (mcf->metrics_zone && mcf->used) {
        /* the outcome is final once the request is done */
        h = ngx_array_push(&cmcf->phases[NGX_HTTP_LOG_PHASE].handlers);
        if (h == NULL) {
            return NGX_ERROR;
        }

        *h = ngx_http_idem_log_handler;
    }

    if (!mcf->used) {
        /* nothing to do: no servers are connected, no handlers run */
        mcf->servers.nelts = 0;
        return NGX_OK;
    }

    mcf->scripts = ngx_http_idem_scripts_init(cf->pool);
    if (mcf->scripts == NULL) {
        return NGX_ERROR;
    }

    /* remembers the route before this location's rewrites */
    h = ngx_array_push(&cmcf->phases[NGX_HTTP_REWRITE_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_idem_rewrite_handler;

    /* after every access check, so rejected requests never reach Redis */
    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PRECONTENT_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_idem_precontent_handler;

    return ngx_http_idem_filter_init(cf);
}


static ngx_uint_t
ngx_http_idem_serving_process(void)
{
    return ngx_process == NGX_PROCESS_WORKER
           || ngx_process == NGX_PROCESS_SINGLE;
}


static ngx_int_t
ngx_http_idem_init_process(ngx_cycle_t *cycle)
{
    ngx_http_idem_main_conf_t  *mcf;

    /*
     * The cache manager and loader run this too: they serve no request,
     * need no Redis, and must not take worker 0's metrics slot.
     */
    if (!ngx_http_idem_serving_process()) {
        return NGX_OK;
    }

    mcf = ngx_http_cycle_get_module_main_conf(cycle,
                                              ngx_http_idempotency_module);
    if (mcf == NULL) {
        ngx_http_idem_metrics_init_process(NULL);
        return NGX_OK;
    }

    ngx_http_idem_metrics_init_process(mcf->metrics_zone);
    ngx_http_idem_audit_init_process();

    /* first: the transport's links ask them where the servers are */
    ngx_http_idem_sentinel_init_process(cycle, &mcf->servers);

    if (ngx_http_idem_cluster_init_process(cycle, &mcf->servers) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_idem_redis_init_process(cycle, &mcf->servers,
                                            mcf->scripts);
}


static void
ngx_http_idem_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_idem_main_conf_t  *mcf;

    if (!ngx_http_idem_serving_process()) {
        return;
    }

    mcf = ngx_http_cycle_get_module_main_conf(cycle,
                                              ngx_http_idempotency_module);
    if (mcf == NULL) {
        return;
    }

    ngx_http_idem_sentinel_exit_process(&mcf->servers);
    ngx_http_idem_cluster_exit_process(&mcf->servers);
    ngx_http_idem_redis_exit_process(&mcf->servers);
}
