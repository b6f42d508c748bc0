/*
 * ngx_http_idempotency_module: the command table, the configuration's
 * create and merge, and the module's registration with nginx (phase
 * handlers, filters, worker start and exit).  Each feature file parses
 * its own directives and checks them at merge time; docs/architecture.md
 * maps the files.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_approve.h"
#include "ngx_http_idempotency_audit.h"
#include "ngx_http_idempotency_audit_file.h"
#include "ngx_http_idempotency_body.h"
#include "ngx_http_idempotency_business.h"
#include "ngx_http_idempotency_cluster.h"
#include "ngx_http_idempotency_conf.h"
#include "ngx_http_idempotency_confirm.h"
#include "ngx_http_idempotency_filter.h"
#include "ngx_http_idempotency_handler.h"
#include "ngx_http_idempotency_json_var.h"
#include "ngx_http_idempotency_metrics.h"
#include "ngx_http_idempotency_ops.h"
#include "ngx_http_idempotency_page.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_redis_conf.h"
#include "ngx_http_idempotency_reply.h"
#include "ngx_http_idempotency_request.h"
#include "ngx_http_idempotency_script.h"
#include "ngx_http_idempotency_sentinel.h"
#include "ngx_http_idempotency_variables.h"
#include "ngx_http_idempotency_claim.h"
#include "ngx_http_idempotency_claim_audit.h"
#include "ngx_http_idempotency_claim_business.h"
#include "ngx_http_idempotency_claim_confirm.h"


static ngx_int_t ngx_http_idem_postconfiguration(ngx_conf_t *cf);
static void *ngx_http_idem_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_idem_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_idem_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_idem_enable(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idem_check_positive_sec(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_idem_check_positive_msec(ngx_conf_t *cf, void *post,
    void *data);
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

    if (ngx_http_idem_release_merge(cf, prev, conf) != NGX_CONF_OK
        || ngx_http_idem_thread_pool_merge(cf, prev, conf) != NGX_CONF_OK
        || ngx_http_idem_check_fp_headers(cf, conf) != NGX_CONF_OK
        || ngx_http_idem_merge_redis_wait(cf, prev, conf) != NGX_CONF_OK
        || ngx_http_idem_confirm_merge(cf, prev, conf) != NGX_CONF_OK
        || ngx_http_idem_audit_merge(cf, prev, conf) != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (ngx_http_idem_check_content(cf, conf) != NGX_CONF_OK
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

    /* the features' parts in a claim, in the order the claim used to call
     * them: the business keys are made before the audit's preparation */
    if (ngx_http_idem_claim_add_part(&ngx_http_idem_claim_business) != NGX_OK
        || ngx_http_idem_claim_add_part(&ngx_http_idem_claim_confirm)
           != NGX_OK
        || ngx_http_idem_claim_add_part(&ngx_http_idem_claim_audit) != NGX_OK)
    {
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

    if (ngx_http_idem_ops_filter_init(cf) != NGX_OK) {
        return NGX_ERROR;
    }

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
