/*
 * What ngx_http_idempotency_claim.c exports: the claim and its answer,
 * and the one hook through which a feature takes part in every claim.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_CLAIM_H
#define NGX_HTTP_IDEMPOTENCY_CLAIM_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


/*
 * A feature's part in a claim (idempotency_unique/lock, idempotency_confirm,
 * idempotency_audit): the Redis keys and arguments it adds, the record it
 * writes instead, and its reading of the reply.  Registered once
 * (ngx_http_idem_claim_add_part); the claim calls every part's hook in the
 * order of registration and names none.  Every hook may be NULL.  Those
 * that answer return NGX_DECLINED when what they are shown is not theirs.
 */
struct ngx_http_idem_claim_part_s {
    /* before the first look; NGX_ERROR: the answer is "store down" */
    ngx_int_t   (*prepare)(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx);

    /* the first look, when the part makes it; *cmd NULL: it failed */
    ngx_int_t   (*look)(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
                    ngx_http_idem_cmd_t **cmd);

    /* whether SET NX cannot make the first look, so claim.lua must */
    ngx_uint_t  (*scripted)(ngx_http_idem_ctx_t *ctx);

    /* claim.lua's KEYS after the record's, written at keys: how many */
    ngx_uint_t  (*keys)(ngx_http_idem_ctx_t *ctx, u_char **keys);

    /* the claim.lua command, when the part builds it (*cmd NULL: failed) */
    ngx_int_t   (*create)(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
                    u_char **keys, ngx_uint_t n, size_t size,
                    ngx_http_idem_cmd_t **cmd);

    /* its named arguments of claim.lua */
    void        (*args)(ngx_http_idem_ctx_t *ctx, ngx_http_idem_cmd_t *cmd);

    /* the record this attempt writes, as the part would have it */
    void        (*value)(ngx_http_idem_ctx_t *ctx, idem_value_t *v);

    /* a reply first: NGX_DONE when the part has dealt with it */
    ngx_int_t   (*reply)(ngx_http_idem_cmd_t *cmd, redisReply **reply);

    /* the reply read by the part (ngx_http_idem_claim_decode otherwise) */
    ngx_int_t   (*parse)(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
                    ngx_http_idem_cmd_t *cmd, redisReply *reply,
                    ngx_http_idem_answer_e *answer);

    /* what claim.lua said, when it is of the part's kinds */
    ngx_int_t   (*decoded)(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
                    idem_claim_t *c, ngx_http_idem_answer_e *answer);

    /* a record of the key, copied into ctx, met by the first look ("look")
     * or by claim.lua; "same": of this request's fingerprint */
    ngx_int_t   (*held)(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
                    idem_value_t *v, ngx_uint_t same, ngx_uint_t look,
                    ngx_http_idem_answer_e *answer);

    /* the answer is known: NGX_DONE when the part resumes the request */
    ngx_int_t   (*answered)(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
                    ngx_http_idem_cmd_t *cmd);

    /* on a cluster, the business keys taken and the gate opened, before
     * the request runs: NGX_ERROR refuses it with ctx->answer */
    ngx_int_t   (*let)(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx);
};


/* claim.lua's KEYS the parts may add beside the record (and the stream) */
#define NGX_HTTP_IDEM_CLAIM_KEYS  3

ngx_int_t ngx_http_idem_claim_add_part(ngx_http_idem_claim_part_t *part);

ngx_int_t ngx_http_idem_claim_send(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_resume(ngx_http_idem_ctx_t *ctx);

/* for the parts */
void ngx_http_idem_claim_answered(ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_claim_made_on(ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_set_state(ngx_http_idem_ctx_t *ctx, char state);
ngx_int_t ngx_http_idem_claim_op(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, const char *id);
ngx_int_t ngx_http_idem_claim_record(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_value_t *v);
ngx_http_idem_answer_e ngx_http_idem_claim_held(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_value_t *v, ngx_uint_t look);
ngx_http_idem_answer_e ngx_http_idem_claim_decode(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_cmd_t *cmd, redisReply *reply);
ngx_uint_t ngx_http_idem_claim_native(ngx_http_idem_cmd_t *cmd);

/* SET key value NX PX ttl GET: its arguments after the key */
#define NGX_HTTP_IDEM_CLAIM_SET_NARGS  5

ngx_http_idem_cmd_t *ngx_http_idem_claim_set_more(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_uint_t more, size_t size);
int64_t ngx_http_idem_claim_record_ttl(ngx_http_idem_ctx_t *ctx);

#endif /* NGX_HTTP_IDEMPOTENCY_CLAIM_H */
