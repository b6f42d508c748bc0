/*
 * Redis Cluster: which node serves a key.  Each worker reads the slot map
 * with CLUSTER SLOTS, sent on a link to a node that is up (the seeds
 * first), and opens one command link per node the map names, masters and
 * replicas alike: a replica's link is ready when a failover promotes it.
 * A command goes to the master of its key's slot (every key of one record
 * shares the record's hash tag); the transport follows MOVED and ASK with
 * the links this file gives it, and asks for the map again (the locate
 * hook) after MOVED, CLUSTERDOWN, TRYAGAIN or a lost node.  All on hiredis'
 * asynchronous API in nginx's event loop: the seeds were resolved when the
 * configuration was read, and only numeric addresses are taken from the
 * cluster, so nothing here blocks.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_cluster.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_io.h"
#include "ngx_http_idempotency_redis.h"


/*
 * CLUSTER SLOTS at most every 100 ms per worker, and every 100 ms to 1 s
 * while a master of the map is unreachable: that is how a failover is seen
 * even when no request asks.
 */
#define NGX_HTTP_IDEM_CL_MIN        100
#define NGX_HTTP_IDEM_CL_MAX        1000

/* distinct addresses a worker keeps a node for: a bound on what it learns */
#define NGX_HTTP_IDEM_CL_NODES_MAX  1024


struct ngx_http_idem_cl_node_s {
    ngx_http_idem_link_t         link;
    ngx_uint_t                   epoch;     /* the last map that named it */
    int                          port;
    u_char                       host[NGX_SOCKADDR_STRLEN + 1];
    u_char                       label[sizeof(" node :65535")
                                       + NGX_SOCKADDR_STRLEN];
};


static ngx_str_t  ngx_http_idem_cl_slots_cmd[] = {
    ngx_string("CLUSTER"), ngx_string("SLOTS")
};


static ngx_http_idem_cl_node_t *
ngx_http_idem_cl_node(ngx_http_idem_cluster_t *cl, ngx_str_t *host,
    ngx_int_t port)
{
    ngx_uint_t                 i;
    ngx_http_idem_cl_node_t  **nodes, *n, **slot;

    nodes = cl->nodes.elts;

    for (i = 0; i < cl->nodes.nelts; i++) {
        n = nodes[i];

        if (n->port == port && ngx_strlen(n->host) == host->len
            && ngx_strncmp(n->host, host->data, host->len) == 0)
        {
            return n;
        }
    }

    if (host->len > NGX_SOCKADDR_STRLEN
        || cl->nodes.nelts == NGX_HTTP_IDEM_CL_NODES_MAX)
    {
        return NULL;
    }

    n = ngx_calloc(sizeof(ngx_http_idem_cl_node_t), cl->log);
    slot = ngx_array_push(&cl->nodes);

    if (n == NULL || slot == NULL) {
        ngx_free(n);
        return NULL;
    }

    *slot = n;
    n->port = (int) port;
    *ngx_cpymem(n->host, host->data, host->len) = '\0';
    *ngx_sprintf(n->label, " node %V:%i", host, port) = '\0';

    return n;
}


static void
ngx_http_idem_cl_open(ngx_http_idem_cluster_t *cl, ngx_http_idem_cl_node_t *n)
{
    ngx_http_idem_link_open(&n->link, cl->redis, n->host, n->port,
                            (const char *) n->label);
}


static ngx_http_idem_cl_node_t *
ngx_http_idem_cl_at(ngx_http_idem_cluster_t *cl, ngx_uint_t i)
{
    ngx_http_idem_cl_node_t  **nodes = cl->nodes.elts;

    return nodes[i % cl->nodes.nelts];
}


/*
 * A node whose link is up, from the i-th on: ready first, then one still
 * connecting (a command waits behind its set-up).  Nodes that left the map
 * are not asked.
 */
static ngx_http_idem_cl_node_t *
ngx_http_idem_cl_up(ngx_http_idem_cluster_t *cl, ngx_uint_t from)
{
    ngx_uint_t                i, pass;
    ngx_http_idem_cl_node_t  *n;

    for (pass = 0; pass < 2; pass++) {
        for (i = 0; i < cl->nodes.nelts; i++) {
            n = ngx_http_idem_cl_at(cl, from + i);

            if (n->link.stopped || n->link.redis == NULL) {
                continue;
            }

            if (n->link.state == NGX_HTTP_IDEM_REDIS_READY
                || (pass && n->link.state == NGX_HTTP_IDEM_REDIS_CONNECTING))
            {
                return n;
            }
        }
    }

    return NULL;
}


void
ngx_http_idem_cluster_locate(ngx_http_idem_redis_t *rd)
{
    ngx_msec_t                since;
    ngx_http_idem_cluster_t  *cl = rd->locate_data;

    if (rd->exiting) {
        return;
    }

    if (cl->asking) {
        cl->again = 1;
        return;
    }

    if (cl->refresh.timer_set) {
        return;
    }

    since = ngx_current_msec - cl->last;

    ngx_add_timer(&cl->refresh, since >= NGX_HTTP_IDEM_CL_MIN
                                ? 0 : NGX_HTTP_IDEM_CL_MIN - since);
}


/* the map could not be read: another node, after a backoff */
static void
ngx_http_idem_cl_failed(ngx_http_idem_cluster_t *cl)
{
    cl->next++;
    cl->backoff = ngx_min(ngx_max(cl->backoff * 2, NGX_HTTP_IDEM_CL_MIN),
                          NGX_HTTP_IDEM_CL_MAX);

    if (!cl->refresh.timer_set) {
        ngx_add_timer(&cl->refresh, ngx_http_idem_backoff_jitter(cl->backoff));
    }

    /* a subscriber that waits for an address waits its own backoff */
    if (!cl->known) {
        ngx_http_idem_redis_located(cl->redis, NULL, 0);
    }
}


/* an endpoint's address: NULL and "" are the asked connection's host */
static ngx_int_t
ngx_http_idem_cl_endpoint(redisReply *e, ngx_http_idem_cl_node_t *from,
    ngx_str_t *host, ngx_int_t *port)
{
    redisReply  *h;

    if (e->type != REDIS_REPLY_ARRAY || e->elements < 2
        || e->element[1]->type != REDIS_REPLY_INTEGER
        || e->element[1]->integer < 1 || e->element[1]->integer > 65535)
    {
        return NGX_ERROR;
    }

    *port = (ngx_int_t) e->element[1]->integer;
    h = e->element[0];

    if (h->type == REDIS_REPLY_NIL
        || (h->type == REDIS_REPLY_STRING && h->len == 0))
    {
        host->data = from->host;
        host->len = ngx_strlen(from->host);
        return NGX_OK;
    }

    if (h->type != REDIS_REPLY_STRING) {
        return NGX_ERROR;
    }

    host->data = (u_char *) h->str;
    host->len = h->len;

    /* "?" (unknown), or a host name that would need getaddrinfo */
    return ngx_http_idem_numeric_host(host) ? NGX_OK : NGX_DECLINED;
}


/*
 * The reply's shape, before anything of the old map is given up, and the
 * number of slots it serves
 */
static ngx_int_t
ngx_http_idem_cl_valid(redisReply *reply, ngx_uint_t *served)
{
    size_t       i, j;
    redisReply  *r;

    *served = 0;

    if (reply->type != REDIS_REPLY_ARRAY) {
        return NGX_ERROR;
    }

    for (i = 0; i < reply->elements; i++) {
        r = reply->element[i];

        if (r->type != REDIS_REPLY_ARRAY || r->elements < 3
            || r->element[0]->type != REDIS_REPLY_INTEGER
            || r->element[1]->type != REDIS_REPLY_INTEGER
            || r->element[0]->integer < 0
            || r->element[0]->integer > r->element[1]->integer
            || r->element[1]->integer >= IDEM_SLOTS)
        {
            return NGX_ERROR;
        }

        for (j = 2; j < r->elements; j++) {
            if (r->element[j]->type != REDIS_REPLY_ARRAY
                || r->element[j]->elements < 2)
            {
                return NGX_ERROR;
            }
        }

        *served += r->element[1]->integer - r->element[0]->integer + 1;
    }

    return NGX_OK;
}


/*
 * A node with a view of its own (restarted with an empty nodes.conf, cut
 * off from part of the cluster) answers a map that serves fewer slots
 * than the one in use, or none: taking it would stop the links of every
 * node it leaves out.  It is not taken; the next node is asked.
 */
static ngx_int_t
ngx_http_idem_cl_fewer(ngx_http_idem_cluster_t *cl, ngx_uint_t served)
{
    ngx_uint_t  s, now;

    now = 0;

    for (s = 0; s < IDEM_SLOTS; s++) {
        now += (cl->slots[s] != NULL);
    }

    return served == 0 || served < now;
}


/* one slot range: its master, then its replicas */
static void
ngx_http_idem_cl_range(ngx_http_idem_cluster_t *cl,
    ngx_http_idem_cl_node_t *from, redisReply *r)
{
    size_t                    j;
    ngx_int_t                 port, rc, s;
    ngx_str_t                 host;
    ngx_http_idem_cl_node_t  *n;

    for (j = 2; j < r->elements; j++) {
        rc = ngx_http_idem_cl_endpoint(r->element[j], from, &host, &port);

        n = (rc == NGX_OK) ? ngx_http_idem_cl_node(cl, &host, port) : NULL;

        if (n == NULL) {
            if (j == 2) {
                ngx_log_error(NGX_LOG_ERR, cl->log, 0,
                              "idempotency: redis %V: the master of slots "
                              "%L-%L has no IP address the module can use "
                              "(cluster-preferred-endpoint-type ip); those "
                              "slots are answered 503", &cl->redis->name,
                              r->element[0]->integer, r->element[1]->integer);
            }

            continue;
        }

        n->epoch = cl->epoch;
        ngx_http_idem_cl_open(cl, n);

        if (j == 2) {
            for (s = r->element[0]->integer; s <= r->element[1]->integer; s++)
            {
                cl->slots[s] = n;
            }
        }
    }
}


/*
 * The new map: every slot's master, a link to every node it names, and
 * the links of nodes it does not name stopped, seeds included (a seed
 * that is down would be tried every two seconds for the worker's life);
 * a worker that has lost every node starts again from the seeds.
 */
static void
ngx_http_idem_cl_map(ngx_http_idem_cluster_t *cl,
    ngx_http_idem_cl_node_t *from, redisReply *reply)
{
    size_t                    i;
    ngx_http_idem_cl_node_t  *n;

    cl->epoch++;
    cl->known = 1;

    ngx_memzero(cl->slots, IDEM_SLOTS * sizeof(ngx_http_idem_cl_node_t *));

    for (i = 0; i < reply->elements; i++) {
        ngx_http_idem_cl_range(cl, from, reply->element[i]);
    }

    for (i = 0; i < cl->nodes.nelts; i++) {
        n = ngx_http_idem_cl_at(cl, i);

        if (n->epoch != cl->epoch) {
            ngx_http_idem_link_stop(&n->link);
        }
    }
}


/*
 * The subscriber stays where it is while that node is in the map and its
 * link is up; otherwise it goes to a node that is ready.  PUBLISH reaches
 * every node of a cluster, so any node will do.
 */
static ngx_uint_t
ngx_http_idem_cl_fit(ngx_http_idem_cluster_t *cl, ngx_http_idem_cl_node_t *n,
    ngx_uint_t ready)
{
    return n->epoch == cl->epoch && !n->link.stopped
           && (!ready || n->link.state == NGX_HTTP_IDEM_REDIS_READY);
}


/* a node of the map, from the next one on; ready: its link is ready */
static ngx_http_idem_cl_node_t *
ngx_http_idem_cl_pick(ngx_http_idem_cluster_t *cl, ngx_uint_t ready)
{
    ngx_uint_t                i;
    ngx_http_idem_cl_node_t  *n;

    for (i = 0; i < cl->nodes.nelts; i++) {
        n = ngx_http_idem_cl_at(cl, cl->next + i);

        if (ngx_http_idem_cl_fit(cl, n, ready)) {
            return n;
        }
    }

    return NULL;
}


static void
ngx_http_idem_cl_place(ngx_http_idem_cluster_t *cl)
{
    ngx_str_t                 host;
    ngx_http_idem_cl_node_t  *n;

    n = cl->sub;

    if (n == NULL || !ngx_http_idem_cl_fit(cl, n, 1)) {
        n = ngx_http_idem_cl_pick(cl, 1);

        if (n == NULL) {
            n = (cl->sub && ngx_http_idem_cl_fit(cl, cl->sub, 0))
                ? cl->sub : ngx_http_idem_cl_pick(cl, 0);
        }
    }

    cl->sub = n;

    if (n == NULL) {
        ngx_http_idem_redis_located(cl->redis, NULL, 0);
        return;
    }

    host.data = n->host;
    host.len = ngx_strlen(n->host);

    /* also sends again what waited for a node */
    ngx_http_idem_redis_located(cl->redis, &host, n->port);
}


/* whether every master of the map is reachable and every slot served */
static ngx_uint_t
ngx_http_idem_cl_whole(ngx_http_idem_cluster_t *cl)
{
    ngx_uint_t  s;

    for (s = 0; s < IDEM_SLOTS; s++) {
        if (cl->slots[s] == NULL
            || cl->slots[s]->link.state == NGX_HTTP_IDEM_REDIS_DOWN)
        {
            return 0;
        }
    }

    return 1;
}


static void
ngx_http_idem_cl_slots(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_http_idem_cluster_t  *cl = cmd->data;
    ngx_uint_t                served;
    ngx_http_idem_cl_node_t  *from;

    cl->asking = 0;

    if (cl->redis->exiting) {
        return;
    }

    /* the command went on a node's link, the node's first member */
    from = (ngx_http_idem_cl_node_t *) cmd->link;

    if (reply != NULL && ngx_http_idem_cl_valid(reply, &served) == NGX_OK
        && ngx_http_idem_cl_fewer(cl, served))
    {
        ngx_log_error(NGX_LOG_WARN, cl->log, 0,
                      "idempotency: redis %V: the slot map from%s serves %ui "
                      "slots, fewer than the map in use: not taken",
                      &cl->redis->name, from->label, served);
        ngx_http_idem_cl_failed(cl);
        return;
    }

    if (reply == NULL || ngx_http_idem_cl_valid(reply, &served) != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, cl->log, 0,
                      "idempotency: redis %V: no slot map from%s: %s%*s",
                      &cl->redis->name, from->label,
                      reply ? "" : "no answer",
                      reply && reply->type == REDIS_REPLY_ERROR
                      ? (size_t) reply->len : 0,
                      reply && reply->type == REDIS_REPLY_ERROR
                      ? reply->str : "");
        ngx_http_idem_cl_failed(cl);
        return;
    }

    ngx_http_idem_cl_map(cl, from, reply);
    ngx_http_idem_cl_place(cl);

    if (ngx_http_idem_cl_whole(cl)) {
        cl->backoff = 0;

    } else {
        ngx_http_idem_cl_failed(cl);
    }

    if (cl->again) {
        cl->again = 0;
        ngx_http_idem_cluster_locate(cl->redis);
    }
}


/* the seeds: where a worker starts, and starts again when no node is up */
static void
ngx_http_idem_cl_seed(ngx_http_idem_cluster_t *cl)
{
    ngx_str_t                 host;
    ngx_uint_t                i;
    ngx_http_idem_addr_t     *a;
    ngx_http_idem_cl_node_t  *n;

    a = cl->seeds.elts;

    for (i = 0; i < cl->seeds.nelts; i++) {
        host.data = a[i].host;
        host.len = ngx_strlen(a[i].host);

        n = ngx_http_idem_cl_node(cl, &host, a[i].port);
        if (n == NULL) {
            continue;
        }

        ngx_http_idem_cl_open(cl, n);
    }
}


static void
ngx_http_idem_cl_refresh_handler(ngx_event_t *ev)
{
    ngx_http_idem_cluster_t  *cl = ev->data;

    ngx_http_idem_cmd_t      *cmd;
    ngx_http_idem_cl_node_t  *n;

    if (cl->redis->exiting || cl->asking) {
        return;
    }

    n = ngx_http_idem_cl_up(cl, cl->next);

    if (n == NULL) {
        ngx_http_idem_cl_seed(cl);
        n = ngx_http_idem_cl_up(cl, cl->next);
    }

    cmd = n ? ngx_http_idem_cmd_on_link(&n->link, ngx_http_idem_cl_slots_cmd,
                                        2)
            : NULL;

    if (cmd == NULL) {
        ngx_log_error(NGX_LOG_ERR, cl->log, 0,
                      "idempotency: redis %V: no cluster node is reachable "
                      "to read the slot map from", &cl->redis->name);
        ngx_http_idem_cl_failed(cl);
        return;
    }

    cl->asking = 1;
    cl->last = ngx_current_msec;

    if (ngx_http_idem_cmd_send(cmd, ngx_http_idem_cl_slots, cl) != NGX_OK) {
        cl->asking = 0;
        ngx_http_idem_cl_failed(cl);
    }
}


/*
 * The transport's route hook.  Before the first map, any node that is up
 * takes the command: its MOVED teaches the map.  A slot the map gives no
 * master, or a master that is unreachable, asks for the map again.
 */
ngx_http_idem_link_t *
ngx_http_idem_cluster_route(ngx_http_idem_redis_t *rd, const u_char *key)
{
    ngx_http_idem_cluster_t  *cl = rd->locate_data;
    ngx_http_idem_cl_node_t  *n;

    if (cl->slots == NULL) {
        return NULL;                   /* the worker is exiting */
    }

    n = cl->slots[idem_slot(key, IDEM_RECORD_KEY_LEN)];

    if (n == NULL && !cl->known) {
        n = ngx_http_idem_cl_up(cl, 0);
    }

    if (n == NULL || n->link.state == NGX_HTTP_IDEM_REDIS_DOWN) {
        ngx_http_idem_cluster_locate(rd);
    }

    return n ? &n->link : NULL;
}


/*
 * The transport's redirect hook: the node a MOVED or ASK names, its link
 * opened if it is new; MOVED also moves the slot in the map at once, and
 * asks for the whole map (other slots have moved with it, most likely).
 */
ngx_http_idem_link_t *
ngx_http_idem_cluster_redirect(ngx_http_idem_redis_t *rd,
    ngx_http_idem_link_t *from, idem_redirect_t *to)
{
    ngx_str_t                 host;
    ngx_http_idem_cluster_t  *cl = rd->locate_data;
    ngx_http_idem_cl_node_t  *n;

    host.data = (u_char *) to->host;
    host.len = to->host_len;

    if (host.len == 0) {
        host.data = from->host;
        host.len = ngx_strlen(from->host);
    }

    if (!ngx_http_idem_numeric_host(&host)) {
        ngx_log_error(NGX_LOG_ERR, cl->log, 0,
                      "idempotency: redis %V: a redirection to \"%V\", not "
                      "an IP address (cluster-preferred-endpoint-type ip)",
                      &rd->name, &host);
        return NULL;
    }

    n = ngx_http_idem_cl_node(cl, &host, to->port);
    if (n == NULL) {
        return NULL;
    }

    ngx_http_idem_cl_open(cl, n);

    if (!to->ask && cl->slots[to->slot] != n) {
        ngx_log_error(NGX_LOG_INFO, cl->log, 0,
                      "idempotency: redis %V: slot %ui moved to %V:%i",
                      &rd->name, (ngx_uint_t) to->slot, &host,
                      (ngx_int_t) to->port);

        cl->slots[to->slot] = n;
        ngx_http_idem_cluster_locate(rd);
    }

    return &n->link;
}


/* the clusters among the servers, one after the other (i: from where) */
static ngx_http_idem_cluster_t *
ngx_http_idem_cl_next(ngx_array_t *servers, ngx_uint_t *i)
{
    ngx_http_idem_redis_t  **rds = servers->elts;

    while (*i < servers->nelts) {
        if (rds[(*i)++]->topology == NGX_HTTP_IDEM_TOPO_CLUSTER) {
            return rds[*i - 1]->locate_data;
        }
    }

    return NULL;
}


ngx_int_t
ngx_http_idem_cluster_init_process(ngx_cycle_t *cycle, ngx_array_t *servers)
{
    ngx_uint_t                i;
    ngx_http_idem_cluster_t  *cl;

    for (i = 0; (cl = ngx_http_idem_cl_next(servers, &i)); /* void */) {
        cl->log = cycle->log;

        cl->slots = ngx_calloc(IDEM_SLOTS * sizeof(ngx_http_idem_cl_node_t *),
                               cycle->log);
        if (cl->slots == NULL
            || ngx_array_init(&cl->nodes, cycle->pool, 8,
                              sizeof(ngx_http_idem_cl_node_t *))
               != NGX_OK)
        {
            return NGX_ERROR;
        }

        cl->refresh.handler = ngx_http_idem_cl_refresh_handler;
        cl->refresh.data = cl;
        cl->refresh.log = cycle->log;
        cl->refresh.cancelable = 1;

        /* from the event loop: the transport sets up its part first */
        ngx_add_timer(&cl->refresh, 0);
    }

    return NGX_OK;
}


void
ngx_http_idem_cluster_exit_process(ngx_array_t *servers)
{
    ngx_uint_t                i, j;
    ngx_http_idem_cluster_t  *cl;

    for (i = 0; (cl = ngx_http_idem_cl_next(servers, &i)); /* void */) {

        /* the transport's flag: nothing reconnects, nothing is kept */
        cl->redis->exiting = 1;

        if (cl->refresh.timer_set) {
            ngx_del_timer(&cl->refresh);
        }

        /* every link first: a command failed at one may look at another */
        for (j = 0; j < cl->nodes.nelts; j++) {
            ngx_http_idem_link_close(&ngx_http_idem_cl_at(cl, j)->link);
        }

        for (j = 0; j < cl->nodes.nelts; j++) {
            ngx_free(ngx_http_idem_cl_at(cl, j));
        }

        cl->nodes.nelts = 0;
        ngx_free(cl->slots);
        cl->slots = NULL;
    }
}
