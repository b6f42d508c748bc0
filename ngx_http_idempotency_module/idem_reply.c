/*
 * Decoders of Redis's replies to the module's commands (idem_reply.h).
 * Whatever they accept, the module acts on; anything else is store-error.
 */

#include <string.h>

#include "idem_reply.h"


static int
idem_rv_is(const idem_rv_t *v, const char *lit)
{
    size_t  len = strlen(lit);

    return v->is_str && v->len == len && memcmp(v->data, lit, len) == 0;
}


/* 0..10^18-1 in decimal, or -1 */
static long long
idem_rv_decimal(const idem_rv_t *v)
{
    size_t     i;
    long long  n;

    if (!v->is_str || v->len == 0 || v->len > IDEM_NUM_MAX) {
        return -1;
    }

    n = 0;

    for (i = 0; i < v->len; i++) {
        if (v->data[i] < '0' || v->data[i] > '9') {
            return -1;
        }

        n = n * 10 + (v->data[i] - '0');
    }

    return n;
}


static idem_claim_kind_e
idem_claim_value(const char *data, size_t len, idem_claim_t *c)
{
    if (idem_value_decode(data, len, &c->rec) != 0) {
        return IDEM_CLAIM_CORRUPT;
    }

    return IDEM_CLAIM_RECORD;
}


idem_claim_kind_e
idem_claim_set_decode(const char *data, size_t len, idem_claim_t *c)
{
    memset(c, 0, sizeof(*c));

    c->kind = data ? idem_claim_value(data, len, c) : IDEM_CLAIM_CLAIMED;

    return c->kind;
}


/* {"claimed"}, or a proposal claimed: {"claimed", op id[, approver]} */
static idem_claim_kind_e
idem_claim_claimed(const idem_rv_t *el, size_t n, idem_claim_t *c)
{
    if (n == 1) {
        return IDEM_CLAIM_CLAIMED;
    }

    if (n > 3 || !el[1].is_str || el[1].len != IDEM_TOKEN_LEN
        || !idem_is_hex(el[1].data, el[1].len)
        || (n == 3 && (!el[2].is_str || el[2].len == 0
                       || el[2].len > IDEM_APPROVER_MAX)))
    {
        return IDEM_CLAIM_INVALID;
    }

    c->op = el[1].data;

    if (n == 3) {
        c->approver = el[2].data;
        c->approver_len = el[2].len;
    }

    return IDEM_CLAIM_CLAIMED;
}


/* {"locked", lease ms left | "", holder's op id | ""} */
static idem_claim_kind_e
idem_claim_locked(const idem_rv_t *el, size_t n, idem_claim_t *c)
{
    long long  left;

    if (n != 3 || !el[1].is_str || !el[2].is_str) {
        return IDEM_CLAIM_INVALID;
    }

    left = el[1].len ? idem_rv_decimal(&el[1]) : 0;

    if (left < 0
        || (el[2].len != 0 && (el[2].len != IDEM_TOKEN_LEN
                               || !idem_is_hex(el[2].data, el[2].len))))
    {
        return IDEM_CLAIM_INVALID;
    }

    c->lease_left = (unsigned long long) left;
    c->op = el[2].len ? el[2].data : NULL;

    return IDEM_CLAIM_LOCKED;
}


/* {"reused", value}, or with the lease left of the claim it holds */
static idem_claim_kind_e
idem_claim_reused(const idem_rv_t *el, size_t n, idem_claim_t *c)
{
    long long  left;

    if (n == 2 && (c->rec.state == 'u'
                   || (c->rec.state == 'c' && c->rec.status < 300)))
    {
        return IDEM_CLAIM_REUSED;
    }

    if (n == 3 && c->rec.state == 'i') {
        left = idem_rv_decimal(&el[2]);

        if (left > 0 && left <= c->rec.lease_ms) {
            c->lease_left = (unsigned long long) left;
            return IDEM_CLAIM_REUSED;
        }
    }

    return IDEM_CLAIM_INVALID;
}


static idem_claim_kind_e
idem_claim_kind(const idem_rv_t *el, size_t n, idem_claim_t *c)
{
    long long  left;

    if (n >= 1 && idem_rv_is(&el[0], "claimed")) {
        return idem_claim_claimed(el, n, c);
    }

    if (n >= 1 && idem_rv_is(&el[0], "locked")) {
        return idem_claim_locked(el, n, c);
    }

    if (n == 1 && idem_rv_is(&el[0], "elsewhere")) {
        return IDEM_CLAIM_ELSEWHERE;
    }

    if (n < 2 || !el[1].is_str
        || idem_value_decode(el[1].data, el[1].len, &c->rec) != 0)
    {
        return IDEM_CLAIM_INVALID;
    }

    if (n == 2 && idem_rv_is(&el[0], "record") && c->rec.state != 'r') {
        return IDEM_CLAIM_RECORD;
    }

    if (n == 2 && idem_rv_is(&el[0], "released") && c->rec.state == 'r') {
        return IDEM_CLAIM_RELEASED;
    }

    if (idem_rv_is(&el[0], "reused")) {
        return idem_claim_reused(el, n, c);
    }

    if (n == 3 && idem_rv_is(&el[0], "in_progress") && c->rec.state == 'i') {
        left = idem_rv_decimal(&el[2]);

        if (left > 0 && left <= c->rec.lease_ms) {
            c->lease_left = (unsigned long long) left;
            return IDEM_CLAIM_IN_PROGRESS;
        }
    }

    return IDEM_CLAIM_INVALID;
}


idem_claim_kind_e
idem_claim_decode(const idem_rv_t *el, size_t n, idem_claim_t *c)
{
    memset(c, 0, sizeof(*c));

    c->kind = idem_claim_kind(el, n, c);

    if (c->kind == IDEM_CLAIM_INVALID) {
        memset(c, 0, sizeof(*c));
    }

    return c->kind;
}


static idem_status_kind_e
idem_status_kind(const idem_rv_t *el, size_t n, idem_status_t *s)
{
    if (n == 0) {
        return IDEM_STATUS_NONE;
    }

    if ((n != 2 && n != 3) || !el[0].is_str
        || idem_value_decode(el[0].data, el[0].len, &s->rec) != 0
        || s->rec.state == 'r'
        || !(idem_rv_is(&el[1], "0") || idem_rv_is(&el[1], "1")))
    {
        return IDEM_STATUS_INVALID;
    }

    if (n == 2) {
        /* an alias never comes without its third element */
        if (s->rec.state == 's') {
            return IDEM_STATUS_INVALID;
        }

    } else if (s->rec.state == 's') {
        /*
         * the state of the operation it reuses, or "" (status.lua's
         * answer for a marker, an alias or no record there)
         */
        if (!el[2].is_str || el[2].len > 1
            || (el[2].len == 1 && memchr("icuap", el[2].data[0], 5) == NULL))
        {
            return IDEM_STATUS_INVALID;
        }

        s->alias_state = el[2].len ? idem_state_name(el[2].data[0]) : NULL;

    } else {
        /* an operation in progress or unknown: the lock it holds */
        if ((s->rec.state != 'i' && s->rec.state != 'u') || !el[2].is_str
            || !idem_is_key(el[2].data, el[2].len, IDEM_LOCK_SUFFIX))
        {
            return IDEM_STATUS_INVALID;
        }

        s->lock = el[2].data;
    }

    /* only a claim can lapse */
    if (idem_rv_is(&el[1], "1") && s->rec.state != 'i') {
        return IDEM_STATUS_INVALID;
    }

    s->state = idem_state_name(idem_rv_is(&el[1], "1") ? 'u' : s->rec.state);

    return IDEM_STATUS_RECORD;
}


idem_status_kind_e
idem_status_decode(const idem_rv_t *el, size_t n, idem_status_t *s)
{
    idem_status_kind_e  kind;

    memset(s, 0, sizeof(*s));

    kind = idem_status_kind(el, n, s);

    /* no record, or not an answer status.lua gives: nothing is set */
    if (kind != IDEM_STATUS_RECORD) {
        memset(s, 0, sizeof(*s));
    }

    s->kind = kind;

    return kind;
}


idem_admin_kind_e
idem_admin_decode(const idem_rv_t *el, size_t n, const char **state)
{
    size_t  i;

    /* the states an operator may not resolve */
    static const char  states[] = "icapsd";

    *state = NULL;

    if (n == 1 && idem_rv_is(&el[0], "none")) {
        return IDEM_ADMIN_NONE;
    }

    if (n == 1 && idem_rv_is(&el[0], "released")) {
        return IDEM_ADMIN_RELEASED;
    }

    if (n == 1 && idem_rv_is(&el[0], "completed")) {
        return IDEM_ADMIN_COMPLETED;
    }

    if (n == 2 && idem_rv_is(&el[0], "refused")) {
        for (i = 0; states[i]; i++) {
            if (idem_rv_is(&el[1], idem_state_name(states[i]))) {
                *state = idem_state_name(states[i]);
                return IDEM_ADMIN_REFUSED;
            }
        }
    }

    return IDEM_ADMIN_INVALID;
}


idem_approve_kind_e
idem_approve_decode(const idem_rv_t *el, size_t n, const char **state,
    long long *until)
{
    static const char   states[] = "icusdp";
    const char         *name;
    size_t              i;

    *state = NULL;
    *until = -1;

    if (n == 1 && idem_rv_is(&el[0], "none")) {
        return IDEM_APPROVE_NONE;
    }

    if (n == 1 && idem_rv_is(&el[0], "mismatch")) {
        return IDEM_APPROVE_MISMATCH;
    }

    if (n == 2 && idem_rv_is(&el[0], "refused") && el[1].is_str) {
        for (i = 0; states[i]; i++) {
            name = idem_state_name(states[i]);

            if (idem_rv_is(&el[1], name)) {
                *state = name;
                return IDEM_APPROVE_REFUSED;
            }
        }
    }

    if (n == 2 && (idem_rv_is(&el[0], "approved")
                   || idem_rv_is(&el[0], "declined")))
    {
        *until = idem_rv_decimal(&el[1]);

        if (*until >= 0 && *until <= IDEM_TIME_MS_MAX) {
            return idem_rv_is(&el[0], "approved") ? IDEM_APPROVE_APPROVED
                                                  : IDEM_APPROVE_DECLINED;
        }

        *until = -1;
    }

    return IDEM_APPROVE_INVALID;
}


idem_close_kind_e
idem_close_decode(long long n)
{
    switch (n) {
    case 0:
        return IDEM_CLOSE_NOT_HELD;
    case 1:
        return IDEM_CLOSE_DONE;
    case 2:
        return IDEM_CLOSE_MARKED;
    default:
        return IDEM_CLOSE_INVALID;
    }
}
