/*
 * Slot functions that several directives share, in the style of nginx's
 * ngx_conf_set_*_slot: each feature file parses its own directives, and
 * these are what no one feature owns.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_conf.h"


char *
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


/*
 * ngx_conf_set_enum_slot() for two-valued enums, with an error that names
 * the directive and both values.
 */
char *
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


/*
 * ngx_http_set_complex_value_slot for a field that starts as
 * NGX_CONF_UNSET_PTR (merged by ngx_conf_merge_ptr_value): nginx's slot
 * takes a NULL field as unset, and not every version takes UNSET_PTR too
 */
char *
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


static void
ngx_http_idem_key_cleanup(void *data)
{
    idem_jws_key_free(data);
}


/*
 * A key file read with the configuration (idempotency_audit_key,
 * idempotency_confirm_key, idempotency_approve_page's secret): the key,
 * whose secret a cleanup of the configuration's pool frees, or NULL once
 * the fault is logged after the directive's name.
 */
idem_jws_key_t *
ngx_http_idem_key_file(ngx_conf_t *cf, ngx_str_t *name, idem_jws_alg_e alg,
    const char *kid, const char *directive)
{
    char                 err[512];
    ngx_str_t            file;
    idem_jws_key_t      *key;
    ngx_pool_cleanup_t  *cln;

    file = *name;

    if (ngx_conf_full_name(cf->cycle, &file, 1) != NGX_OK) {
        return NULL;
    }

    cln = ngx_pool_cleanup_add(cf->pool, sizeof(idem_jws_key_t));
    if (cln == NULL) {
        return NULL;
    }

    key = cln->data;
    ngx_memzero(key, sizeof(idem_jws_key_t));
    cln->handler = ngx_http_idem_key_cleanup;

    if (idem_jws_key_load(key, alg, (char *) file.data, kid, 0, err,
                          sizeof(err)) != 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "\"%s\": %s", directive,
                           err);
        return NULL;
    }

    return key;
}
