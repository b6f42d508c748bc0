/*
 * The Redis transport: per-worker asynchronous connections (hiredis inside
 * nginx's event loop), commands with timeouts, the queue of commands that
 * must reach Redis even across a lost connection, and the subscriber that
 * wakes waiters when a record they wait for changes.
 *
 * Its files: _redis.c (links, sending, replies), _command.c (a command's
 * arguments, a reply's parts), _waiters.c, _replicas.c (WAIT), _io.c (the
 * hiredis adapter).  It knows Redis, the scripts it loads and record keys;
 * it knows nothing of HTTP requests.  Whoever sends a command gets its
 * reply through the command's handler; whoever waits registers an
 * ngx_http_idem_waiter_t.
 *
 * This header holds the transport's types only (and those of the hiredis
 * adapter and of the scripts, which its types embed); what each of its
 * files exports is in that file's own header.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_TRANSPORT_H
#define NGX_HTTP_IDEMPOTENCY_TRANSPORT_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "idem_record.h"
#include "idem_reply.h"
#include "idem_slot.h"
#include "ngx_http_idempotency_script_args.h"


#define NGX_HTTP_IDEM_SHA1_HEX  40


typedef struct {
    const char                  *name;      /* for logs */
    ngx_str_t                    text;
    ngx_uint_t                   nargs;     /* ARGV, KEYS[1] not counted */
    u_char                       sha1[NGX_HTTP_IDEM_SHA1_HEX];
} ngx_http_idem_script_t;


/*
 * A hiredis context inside nginx's event loop, as every connection of the
 * module has it (the transport's links, the sentinel connections): its fd
 * wrapped in an nginx connection, level-triggered events so that replies
 * over 16 KiB keep flowing, and one close of the fd, hiredis's own.  The
 * owner keeps ac->data for itself; "freed" is told when hiredis frees the
 * context (its cleanup hook, before the disconnect callback), "failed"
 * when an event could not be added.
 */
typedef struct ngx_http_idem_io_s  ngx_http_idem_io_t;

typedef void (*ngx_http_idem_io_pt)(ngx_http_idem_io_t *io);

struct ngx_http_idem_io_s {
    redisAsyncContext           *ac;
    ngx_connection_t            *conn;
    ngx_http_idem_io_pt          failed;        /* may be NULL */
    ngx_http_idem_io_pt          freed;         /* may be NULL */
    void                        *data;
};


typedef enum {
    NGX_HTTP_IDEM_REDIS_DOWN = 0,
    NGX_HTTP_IDEM_REDIS_CONNECTING,   /* TCP, AUTH, SELECT, SCRIPT LOAD */
    NGX_HTTP_IDEM_REDIS_READY
} ngx_http_idem_redis_state_e;


/* a seed of a topology (a sentinel, a cluster node), resolved by nginx -t */
typedef struct {
    ngx_str_t                    name;          /* as written, for logs */
    u_char                      *host;          /* numeric, NUL-terminated */
    int                          port;
} ngx_http_idem_addr_t;


typedef struct ngx_http_idem_redis_s  ngx_http_idem_redis_t;
typedef struct ngx_http_idem_cmd_s    ngx_http_idem_cmd_t;
typedef struct ngx_http_idem_waiter_s ngx_http_idem_waiter_t;
typedef struct ngx_http_idem_replicas_s  ngx_http_idem_replicas_t;


/*
 * One connection of a worker to a server: the pipelined command link, or
 * the subscriber link that hears about records others wait for; in a
 * Cluster, the command link of one node, whose address is its own.
 */
typedef struct {
    ngx_http_idem_redis_t       *redis;
    ngx_http_idem_io_t           io;
    const char                  *label;         /* for logs: which link */
    u_char                      *host;          /* a node's; NULL: rd's */
    int                          port;
    void                        *wait_last;     /* the last WAIT in flight */
    ngx_http_idem_redis_state_e  state;
    ngx_uint_t                   handshake;     /* set-up replies due */
    ngx_msec_t                   backoff;
    ngx_event_t                  reconnect;
    ngx_event_t                  connect_timer;
    ngx_event_t                  recycle;
    redisAsyncContext           *recycle_ac;
    ngx_uint_t                   gen;           /* of the address used */
    unsigned                     subscriber:1;
    unsigned                     subscribed:1;
    unsigned                     counted:1;     /* in the metrics gauge */
    unsigned                     node:1;        /* a Cluster node's */
    unsigned                     stopped:1;     /* its node left the map */
} ngx_http_idem_link_t;


/* which directive configured the server: what finds its address and nodes */
typedef enum {
    NGX_HTTP_IDEM_TOPO_SINGLE = 0,      /* idempotency_redis: one address */
    NGX_HTTP_IDEM_TOPO_SENTINEL,        /* the master the sentinels name */
    NGX_HTTP_IDEM_TOPO_CLUSTER          /* the node of each key's slot */
} ngx_http_idem_topology_e;


/*
 * Where the server is, when a topology (Sentinel) decides it: called when
 * a link would connect to an address it has already used, and answered,
 * perhaps later, by ngx_http_idem_redis_located().
 */
typedef void (*ngx_http_idem_locate_pt)(ngx_http_idem_redis_t *rd);

/*
 * Redis Cluster: the link of the node that serves the key's slot (NULL
 * when none can now), and the link of the node a MOVED or ASK answer
 * names (NULL when it cannot be reached: a host name, say).  In a Cluster
 * the locate hook asks for the slot map again, and its answer places the
 * subscriber.
 */
typedef ngx_http_idem_link_t *(*ngx_http_idem_route_pt)(
    ngx_http_idem_redis_t *rd, const u_char *key);
typedef ngx_http_idem_link_t *(*ngx_http_idem_redirect_pt)(
    ngx_http_idem_redis_t *rd, ngx_http_idem_link_t *from,
    idem_redirect_t *to);


/*
 * One configured Redis server.  The configuration part is set when the
 * directive is parsed; the links and queues are each worker's own.
 */
struct ngx_http_idem_redis_s {
    ngx_str_t                    name;          /* as written, for logs */
    ngx_str_t                    host;          /* numeric address or path */
    int                          port;          /* 0 for a unix socket */
    ngx_str_t                    user;
    ngx_str_t                    password;
    ngx_int_t                    db;
    ngx_msec_t                   connect_timeout;
    ngx_msec_t                   timeout;
    ngx_uint_t                   subscribe;     /* some location waits */
    ngx_array_t                 *waits;         /* WAIT settings: msec[2] */
    ngx_msec_t                   waits_sum;     /* of their timeouts */
    ngx_http_idem_topology_e     topology;      /* what sets the hooks */
    ngx_http_idem_locate_pt      locate;        /* Sentinel, Cluster */
    void                        *locate_data;
    ngx_http_idem_route_pt       route;         /* Cluster */
    ngx_http_idem_redirect_pt    redirect;

    ngx_http_idem_script_t      *scripts;

    ngx_log_t                   *log;
    ngx_http_idem_link_t         cmd;
    ngx_http_idem_link_t         sub;
    ngx_queue_t                  waiters;       /* ngx_http_idem_waiter_t */
    ngx_queue_t                  resend;        /* ngx_http_idem_cmd_t */
    ngx_queue_t                  held;          /* ngx_http_idem_cmd_t */
    ngx_http_idem_cmd_t         *timing_out;
    ngx_http_idem_link_t        *replying;      /* whose reply is handled */
    ngx_uint_t                   resend_n;
    size_t                       resend_size;
    ngx_uint_t                   gen;           /* answers of locate */
    u_char                       addr[NGX_SOCKADDR_STRLEN + 1];
    unsigned                     locating:1;    /* locate not answered */
    unsigned                     exiting:1;
};


/*
 * Durable commands (the scripts that close or give back a claim) are
 * fenced by an owner token, so one that could not be sent, or whose answer
 * never came, is sent again once Redis is back instead of leaving its
 * record to turn unknown; bounded in count and bytes per worker and server.
 */
#define NGX_HTTP_IDEM_RESEND_MAX       1024
#define NGX_HTTP_IDEM_RESEND_BYTES     (64 * 1024 * 1024)


/*
 * reply is NULL when no answer came: the connection went or the command
 * timed out.  The command was written then, so it may have run.
 */
typedef void (*ngx_http_idem_reply_pt)(ngx_http_idem_cmd_t *cmd,
    redisReply *reply);

/* the reply of command i of a batch but its last (NULL: none came) */
typedef void (*ngx_http_idem_part_pt)(ngx_http_idem_cmd_t *cmd, ngx_uint_t i,
    redisReply *reply);

/*
 * A command outlives the request that sent it (a reply may come after the
 * client has gone), so it is allocated outside any pool; whoever set
 * "data" clears it when that goes away, and the transport frees the
 * command after its handler ran.
 */
struct ngx_http_idem_cmd_s {
    ngx_http_idem_redis_t       *redis;
    ngx_http_idem_script_e       script;    /* NSCRIPTS: a native one */
    ngx_http_idem_reply_pt       handler;
    void                        *data;
    ngx_http_idem_link_t        *link;      /* where it was written */
    ngx_event_t                  timer;
    ngx_queue_t                  queue;     /* in redis->resend */
    size_t                       size;
    ngx_uint_t                   argc;
    const char                 **argv;
    size_t                      *argvlen;
    u_char                      *pos;       /* next free byte for args */
    u_char                      *key;       /* IDEM_RECORD_KEY_LEN */
    ngx_uint_t                   arg0;      /* argv index of argument 0 */
    ngx_uint_t                   hidden;    /* the last ones, never sent */
    uint32_t                     skip;      /* own args not sent: bit i */
    ngx_uint_t                   batch;     /* >0: commands of this many
                                               arguments each, pipelined */
    ngx_http_idem_part_pt        part_handler;  /* a batch's earlier replies */
    ngx_uint_t                   part;      /* the next reply's command */
    ngx_uint_t                   got;       /* bit i: command i answered */
    ngx_uint_t                   nil;       /* bit i: ... with NIL */
    ngx_msec_t                   timeout;   /* 0: the server's timeout */
    ngx_uint_t                   redirects; /* MOVED and ASK followed */
    uint64_t                     sent;      /* us, for idempotency_metrics */
    unsigned                     durable:1; /* sent again after a loss */
    unsigned                     eval:1;    /* resent as EVAL (NOSCRIPT) */
    unsigned                     told:1;    /* the handler has run */
    unsigned                     resent:1;  /* from the resend queue */
    unsigned                     held:1;    /* waited for locate */
    unsigned                     pinned:1;  /* goes on "link" only */
    unsigned                     asking:1;  /* ASK: after ASKING */
    unsigned                     batched:1; /* its change went in a batch:
                                               its audit part is unused */
};


/* a record's waiter: woken when the record may have changed */
typedef void (*ngx_http_idem_wake_pt)(ngx_http_idem_waiter_t *w);

struct ngx_http_idem_waiter_s {
    ngx_queue_t                  queue;
    const u_char                *key;       /* IDEM_RECORD_KEY_LEN bytes */
    ngx_http_idem_wake_pt        wake;
    void                        *data;
    unsigned                     linked:1;
};


/*
 * A write waiting for replicas (idempotency_redis_wait).  "acked" is the
 * number of replicas that had the write in time, -1 when WAIT got no
 * answer.
 */
typedef void (*ngx_http_idem_replicas_pt)(ngx_http_idem_replicas_t *w,
    ngx_int_t acked);

struct ngx_http_idem_replicas_s {
    ngx_queue_t                  queue;
    ngx_http_idem_replicas_pt    handler;
    void                        *data;
    unsigned                     linked:1;
};


#endif /* NGX_HTTP_IDEMPOTENCY_TRANSPORT_H */
