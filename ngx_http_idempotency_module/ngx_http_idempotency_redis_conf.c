/*
 * The directives that name a Redis server: idempotency_redis,
 * idempotency_redis_sentinel and idempotency_redis_cluster.  Each resolves
 * its addresses now (a worker must not block in getaddrinfo), sets the
 * server's topology and hooks, and shares one server among the scopes that
 * name the same one.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_redis_conf.h"
#include "ngx_http_idempotency_cluster.h"
#include "ngx_http_idempotency_sentinel.h"


static char *
ngx_http_idem_redis_param(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_idem_redis_t *rd, ngx_str_t *v)
{
    ngx_int_t  n;
    ngx_str_t  s;

    if (ngx_strncmp(v->data, "password=", 9) == 0) {
        rd->password.data = v->data + 9;
        rd->password.len = v->len - 9;
        return NGX_CONF_OK;
    }

    if (ngx_strncmp(v->data, "user=", 5) == 0) {
        rd->user.data = v->data + 5;
        rd->user.len = v->len - 5;
        return NGX_CONF_OK;
    }

    if (ngx_strncmp(v->data, "db=", 3) == 0) {
        n = ngx_atoi(v->data + 3, v->len - 3);
        if (n == NGX_ERROR) {
            goto invalid;
        }

        rd->db = n;
        return NGX_CONF_OK;
    }

    if (ngx_strncmp(v->data, "connect_timeout=", 16) == 0) {
        s.data = v->data + 16;
        s.len = v->len - 16;
        n = ngx_parse_time(&s, 0);
        if (n == NGX_ERROR || n == 0) {
            goto invalid;
        }

        rd->connect_timeout = (ngx_msec_t) n;
        return NGX_CONF_OK;
    }

    if (ngx_strncmp(v->data, "timeout=", 8) == 0) {
        s.data = v->data + 8;
        s.len = v->len - 8;
        n = ngx_parse_time(&s, 0);
        if (n == NGX_ERROR || n == 0) {
            goto invalid;
        }

        rd->timeout = (ngx_msec_t) n;
        return NGX_CONF_OK;
    }

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\" in \"%V\" directive",
                       v, &cmd->name);
    return NGX_CONF_ERROR;
}


/* resolve now: getaddrinfo would block a worker */
static char *
ngx_http_idem_redis_address(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_idem_redis_t *rd, ngx_str_t *addr)
{
    u_char              *p;
    ngx_url_t            u;
    struct sockaddr_un  *sun;

    ngx_memzero(&u, sizeof(ngx_url_t));
    u.url = *addr;
    u.default_port = 6379;

    if (ngx_parse_url(cf->pool, &u) != NGX_OK || u.naddrs == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid address \"%V\" in \"%V\" directive%s%s",
                           addr, &cmd->name, u.err ? ": " : "",
                           u.err ? u.err : "");
        return NGX_CONF_ERROR;
    }

    if (u.addrs[0].sockaddr->sa_family == AF_UNIX) {
        sun = (struct sockaddr_un *) u.addrs[0].sockaddr;
        rd->host.len = ngx_strlen(sun->sun_path);
        rd->host.data = (u_char *) sun->sun_path;
        rd->port = 0;
        return NGX_CONF_OK;
    }

    p = ngx_pnalloc(cf->pool, NGX_SOCKADDR_STRLEN + 1);
    if (p == NULL) {
        return NGX_CONF_ERROR;
    }

    rd->host.len = ngx_sock_ntop(u.addrs[0].sockaddr, u.addrs[0].socklen,
                                 p, NGX_SOCKADDR_STRLEN, 0);
    p[rd->host.len] = '\0';
    rd->host.data = p;
    rd->port = (int) ngx_inet_get_port(u.addrs[0].sockaddr);

    return NGX_CONF_OK;
}


static ngx_uint_t
ngx_http_idem_str_eq(ngx_str_t *a, ngx_str_t *b)
{
    /* empty strings have NULL data: no strncmp() on those */
    return a->len == b->len
           && (a->len == 0 || ngx_strncmp(a->data, b->data, a->len) == 0);
}


static ngx_uint_t
ngx_http_idem_redis_same(ngx_http_idem_redis_t *a, ngx_http_idem_redis_t *b)
{
    return a->port == b->port
           && a->db == b->db
           && a->connect_timeout == b->connect_timeout
           && a->timeout == b->timeout
           && ngx_http_idem_str_eq(&a->host, &b->host)
           && ngx_http_idem_str_eq(&a->user, &b->user)
           && ngx_http_idem_str_eq(&a->password, &b->password);
}


/* the directive that named a server */
static const char *
ngx_http_idem_topology(ngx_http_idem_redis_t *rd)
{
    switch (rd->topology) {

    case NGX_HTTP_IDEM_TOPO_CLUSTER:
        return "idempotency_redis_cluster";

    case NGX_HTTP_IDEM_TOPO_SENTINEL:
        return "idempotency_redis_sentinel";

    default:
        return "idempotency_redis";
    }
}


/* one Redis topology per scope: a server, a Sentinel master, a Cluster */
static char *
ngx_http_idem_redis_taken(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_idem_loc_conf_t *lcf)
{
    const char  *other;

    if (lcf->redis == NULL) {
        return NGX_CONF_OK;
    }

    other = ngx_http_idem_topology(lcf->redis);

    if (ngx_strlen(other) == cmd->name.len
        && ngx_strncmp(other, cmd->name.data, cmd->name.len) == 0)
    {
        return "is duplicate";
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"%V\" and \"%s\" in one block: "
                       "one Redis topology per scope", &cmd->name, other);

    return NGX_CONF_ERROR;
}


/* a server in every worker's list, and this scope's */
static char *
ngx_http_idem_server_add(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *lcf,
    ngx_http_idem_redis_t *rd)
{
    ngx_http_idem_redis_t      **slot;
    ngx_http_idem_main_conf_t   *mcf;

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    slot = ngx_array_push(&mcf->servers);
    if (slot == NULL) {
        return NGX_CONF_ERROR;
    }

    *slot = rd;
    lcf->redis = rd;

    return NGX_CONF_OK;
}


typedef char *(*ngx_http_idem_param_pt)(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_idem_redis_t *rd, ngx_str_t *v);

/*
 * What the directives of a topology (Sentinel, Cluster) share: the
 * server's defaults, its parameters from the first-th on (param reads the
 * directive's own and passes the server's to ngx_http_idem_redis_param),
 * and at least one seed, a "seed" ("sentinel", "cluster node").
 */
static char *
ngx_http_idem_topology_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_idem_redis_t *rd, ngx_uint_t first, ngx_http_idem_param_pt param,
    ngx_array_t *seeds, const char *seed)
{
    ngx_str_t   *value;
    ngx_uint_t   i;

    value = cf->args->elts;
    rd->connect_timeout = 1000;
    rd->timeout = 1000;

    for (i = first; i < cf->args->nelts; i++) {
        if (param(cf, cmd, rd, &value[i]) != NGX_CONF_OK) {
            return NGX_CONF_ERROR;
        }
    }

    if (seeds->nelts == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive needs at least one %s "
                           "host:port", &cmd->name, seed);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* the server's name in logs: "kind:what" */
static char *
ngx_http_idem_server_name(ngx_conf_t *cf, ngx_http_idem_redis_t *rd,
    const char *kind, ngx_str_t *what)
{
    rd->name.len = ngx_strlen(kind) + 1 + what->len;
    rd->name.data = ngx_pnalloc(cf->pool, rd->name.len);
    if (rd->name.data == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_sprintf(rd->name.data, "%s:%V", kind, what);

    return NGX_CONF_OK;
}


char *
ngx_http_idem_redis(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    char                       *rv;
    ngx_str_t                  *value;
    ngx_uint_t                  i;
    ngx_http_idem_redis_t      *rd, **servers;
    ngx_http_idem_main_conf_t  *mcf;

    rv = ngx_http_idem_redis_taken(cf, cmd, lcf);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    value = cf->args->elts;

    rd = ngx_pcalloc(cf->pool, sizeof(ngx_http_idem_redis_t));
    if (rd == NULL) {
        return NGX_CONF_ERROR;
    }

    rd->name = value[1];
    rd->connect_timeout = 1000;
    rd->timeout = 1000;

    if (ngx_http_idem_redis_address(cf, cmd, rd, &value[1]) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    for (i = 2; i < cf->args->nelts; i++) {
        if (ngx_http_idem_redis_param(cf, cmd, rd, &value[i]) != NGX_CONF_OK) {
            return NGX_CONF_ERROR;
        }
    }

    /* locations naming the same server share one connection per worker */
    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);
    servers = mcf->servers.elts;

    for (i = 0; i < mcf->servers.nelts; i++) {
        if (ngx_http_idem_redis_same(servers[i], rd)) {
            lcf->redis = servers[i];
            return NGX_CONF_OK;
        }
    }

    return ngx_http_idem_server_add(cf, lcf, rd);
}


/*
 * The name as in "sentinel monitor <name>": it is matched against the
 * words of +switch-master messages, so no space; no ":" or "=" either,
 * which catches a seed or an option written where the name belongs.
 */
static char *
ngx_http_idem_sentinel_name(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_str_t *name)
{
    ngx_uint_t  i;

    for (i = 0; i < name->len; i++) {
        if (name->data[i] <= 0x20 || name->data[i] >= 0x7f
            || name->data[i] == ':' || name->data[i] == '=')
        {
            break;
        }
    }

    if (name->len && i == name->len) {
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid master name \"%V\" in \"%V\" directive: "
                       "the first parameter is the name of \"sentinel "
                       "monitor\" (printable, no space, \":\" or \"=\")",
                       name, &cmd->name);

    return NGX_CONF_ERROR;
}


/*
 * A sentinel's or a cluster node's host:port ("what" says which), resolved
 * now like idempotency_redis: getaddrinfo would block a worker.
 */
static char *
ngx_http_idem_seed(ngx_conf_t *cf, ngx_command_t *cmd, ngx_array_t *seeds,
    ngx_str_t *v, const char *what)
{
    u_char                *p;
    ngx_url_t              u;
    ngx_http_idem_addr_t  *a;

    ngx_memzero(&u, sizeof(ngx_url_t));
    u.url = *v;

    if ((v->len >= 5 && ngx_strncasecmp(v->data, (u_char *) "unix:", 5) == 0)
        || ngx_parse_url(cf->pool, &u) != NGX_OK || u.naddrs == 0
        || u.no_port)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid %s address \"%V\" in \"%V\" "
                           "directive: host:port expected%s%s", what, v,
                           &cmd->name, u.err ? ": " : "", u.err ? u.err : "");
        return NGX_CONF_ERROR;
    }

    a = ngx_array_push(seeds);
    p = ngx_pnalloc(cf->pool, NGX_SOCKADDR_STRLEN + 1);
    if (a == NULL || p == NULL) {
        return NGX_CONF_ERROR;
    }

    a->name = *v;
    a->host = p;
    p[ngx_sock_ntop(u.addrs[0].sockaddr, u.addrs[0].socklen, p,
                    NGX_SOCKADDR_STRLEN, 0)] = '\0';
    a->port = (int) ngx_inet_get_port(u.addrs[0].sockaddr);

    return NGX_CONF_OK;
}


static char *
ngx_http_idem_sentinel_param(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_idem_redis_t *rd, ngx_str_t *v)
{
    ngx_http_idem_sentinel_t  *sn = rd->locate_data;

    if (ngx_strlchr(v->data, v->data + v->len, '=') == NULL) {
        return ngx_http_idem_seed(cf, cmd, &sn->seeds, v, "sentinel");
    }

    if (ngx_strncmp(v->data, "sentinel_password=", 18) == 0) {
        sn->password.data = v->data + 18;
        sn->password.len = v->len - 18;
        return NGX_CONF_OK;
    }

    /* the master's own: user=, password=, db=, the timeouts */
    return ngx_http_idem_redis_param(cf, cmd, rd, v);
}


char *
ngx_http_idem_redis_sentinel(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    char                      *rv;
    ngx_str_t                 *value;
    ngx_http_idem_redis_t     *rd;
    ngx_http_idem_sentinel_t  *sn;

    rv = ngx_http_idem_redis_taken(cf, cmd, lcf);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    value = cf->args->elts;

    if (ngx_http_idem_sentinel_name(cf, cmd, &value[1]) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    rd = ngx_pcalloc(cf->pool, sizeof(ngx_http_idem_redis_t));
    sn = ngx_pcalloc(cf->pool, sizeof(ngx_http_idem_sentinel_t));
    if (rd == NULL || sn == NULL
        || ngx_array_init(&sn->seeds, cf->pool, 3,
                          sizeof(ngx_http_idem_addr_t))
           != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    sn->master = value[1];
    rd->topology = NGX_HTTP_IDEM_TOPO_SENTINEL;
    rd->locate = ngx_http_idem_sentinel_locate;
    rd->locate_data = sn;

    if (ngx_http_idem_topology_conf(cf, cmd, rd, 2,
                                    ngx_http_idem_sentinel_param, &sn->seeds,
                                    "sentinel")
        != NGX_CONF_OK
        || ngx_http_idem_server_name(cf, rd, "sentinel", &value[1])
           != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    return ngx_http_idem_server_add(cf, lcf, rd);
}


static char *
ngx_http_idem_cluster_param(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_idem_redis_t *rd, ngx_str_t *v)
{
    ngx_http_idem_cluster_t  *cl = rd->locate_data;

    if (ngx_strlchr(v->data, v->data + v->len, '=') == NULL) {
        return ngx_http_idem_seed(cf, cmd, &cl->seeds, v, "cluster node");
    }

    if (ngx_strncmp(v->data, "db=", 3) == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" in \"%V\" directive: "
                           "a Redis Cluster has database 0 only", v,
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    /* the nodes' own: user=, password=, the timeouts */
    return ngx_http_idem_redis_param(cf, cmd, rd, v);
}


/* the same seeds, in the same order, and the same options */
static ngx_http_idem_redis_t *
ngx_http_idem_cluster_known(ngx_http_idem_main_conf_t *mcf,
    ngx_http_idem_redis_t *rd)
{
    ngx_uint_t                i, j;
    ngx_http_idem_addr_t     *a, *b;
    ngx_http_idem_redis_t   **servers;
    ngx_http_idem_cluster_t  *ca, *cb;

    servers = mcf->servers.elts;
    ca = rd->locate_data;
    a = ca->seeds.elts;

    for (i = 0; i < mcf->servers.nelts; i++) {
        if (servers[i]->topology != NGX_HTTP_IDEM_TOPO_CLUSTER
            || !ngx_http_idem_redis_same(servers[i], rd))
        {
            continue;
        }

        cb = servers[i]->locate_data;
        b = cb->seeds.elts;

        for (j = 0; j < ca->seeds.nelts && ca->seeds.nelts == cb->seeds.nelts;
             j++)
        {
            if (!ngx_http_idem_str_eq(&a[j].name, &b[j].name)) {
                break;
            }
        }

        if (j == ca->seeds.nelts && j == cb->seeds.nelts) {
            return servers[i];
        }
    }

    return NULL;
}


/* idempotency_redis_cluster host:port ... [user=] [password=] [timeouts] */
char *
ngx_http_idem_redis_cluster(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    char                       *rv;
    ngx_http_idem_redis_t      *rd;
    ngx_http_idem_cluster_t    *cl;
    ngx_http_idem_main_conf_t  *mcf;

    rv = ngx_http_idem_redis_taken(cf, cmd, lcf);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    rd = ngx_pcalloc(cf->pool, sizeof(ngx_http_idem_redis_t));
    cl = ngx_pcalloc(cf->pool, sizeof(ngx_http_idem_cluster_t));
    if (rd == NULL || cl == NULL
        || ngx_array_init(&cl->seeds, cf->pool, 3,
                          sizeof(ngx_http_idem_addr_t))
           != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    rd->topology = NGX_HTTP_IDEM_TOPO_CLUSTER;
    rd->locate = ngx_http_idem_cluster_locate;
    rd->route = ngx_http_idem_cluster_route;
    rd->redirect = ngx_http_idem_cluster_redirect;
    rd->locate_data = cl;
    cl->redis = rd;

    /* named in logs by its first node as written */
    if (ngx_http_idem_topology_conf(cf, cmd, rd, 1,
                                    ngx_http_idem_cluster_param, &cl->seeds,
                                    "cluster node")
        != NGX_CONF_OK
        || ngx_http_idem_server_name(cf, rd, "cluster",
               &((ngx_http_idem_addr_t *) cl->seeds.elts)[0].name)
           != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    /* locations naming the same cluster share its connections */
    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    lcf->redis = ngx_http_idem_cluster_known(mcf, rd);
    if (lcf->redis) {
        return NGX_CONF_OK;
    }

    return ngx_http_idem_server_add(cf, lcf, rd);
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
char *
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


/* idempotency_redis_wait off | replicas [timeout] */
char *
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
