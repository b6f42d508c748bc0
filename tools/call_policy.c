/*
 * The retry rule (call_policy.h).  A problem answer's action comes from
 * its type; a plain answer's from its status and the module's marks.
 */

#include <stddef.h>
#include <string.h>

#include "call_policy.h"


static const char  *outcome_names[CALL_OUT_N] = {
    "created", "replayed", "reused", "in_progress", "conflict", "unknown",
    "confirmation_required", "declined", "lock_held", "rejected",
    "unavailable", "transport_failed", "refused"
};


const char *
call_outcome_name(call_outcome_e o)
{
    return (o < CALL_OUT_N) ? outcome_names[o] : "refused";
}


/* the action took effect exactly once: nothing more to do */
int
call_outcome_done(call_outcome_e o)
{
    return o == CALL_OUT_CREATED || o == CALL_OUT_REPLAYED
           || o == CALL_OUT_REUSED;
}


typedef struct {
    const char      *slug;
    call_act_e       act;
    call_outcome_e   out;
} policy_row_t;


/*
 * The module's answer types whose meaning for a client is not "final":
 * the documented client action of each (docs/directives.md, "Problem
 * types"; docs/agents.md, "The retry rule").  Every other type is final.
 */
static const policy_row_t  policy_rows[] = {
    { "in-progress",            CALL_ACT_WAIT,  CALL_OUT_IN_PROGRESS },
    { "lock-held",              CALL_ACT_WAIT,  CALL_OUT_LOCK_HELD },
    { "store-unavailable",      CALL_ACT_WAIT,  CALL_OUT_UNAVAILABLE },
    { "store-not-replicated",   CALL_ACT_WAIT,  CALL_OUT_UNAVAILABLE },
    { "retry-later",            CALL_ACT_WAIT,  CALL_OUT_UNAVAILABLE },
    { "audit-unavailable",      CALL_ACT_WAIT,  CALL_OUT_UNAVAILABLE },
    { "fingerprint-mismatch",   CALL_ACT_FINAL, CALL_OUT_CONFLICT },
    { "identity-held-elsewhere", CALL_ACT_FINAL, CALL_OUT_CONFLICT },
    { "outcome-unknown",        CALL_ACT_FINAL, CALL_OUT_UNKNOWN },
    { "confirmation-required",  CALL_ACT_FINAL, CALL_OUT_CONFIRM },
    { "confirmation-invalid",   CALL_ACT_FINAL, CALL_OUT_CONFIRM },
    { "confirmation-declined",  CALL_ACT_FINAL, CALL_OUT_DECLINED },
    /* done earlier; only the body was too large to keep */
    { "response-not-stored",    CALL_ACT_FINAL, CALL_OUT_REPLAYED },
    { NULL, CALL_ACT_FINAL, CALL_OUT_REJECTED }
};


static call_act_e
policy_problem(const call_answer_t *a, call_outcome_e *out)
{
    const policy_row_t  *p;

    for (p = policy_rows; p->slug != NULL; p++) {
        if (strcmp(p->slug, a->slug) == 0) {
            break;
        }
    }

    *out = p->out;

    if (p->slug == NULL && a->status == 428) {
        /* a confirmation answer of a newer module: a person decides */
        *out = CALL_OUT_CONFIRM;
    }

    return p->act;
}


call_act_e
call_policy(const call_answer_t *a, call_outcome_e *out)
{
    int  ok = (a->status >= 200 && a->status < 400);

    if (!a->transport_ok) {
        *out = CALL_OUT_TRANSPORT_FAILED;
        return CALL_ACT_AMBIGUOUS;
    }

    if (a->slug != NULL) {
        return policy_problem(a, out);
    }

    if (a->replayed || a->reused) {
        *out = !ok ? CALL_OUT_REJECTED
                   : a->reused ? CALL_OUT_REUSED : CALL_OUT_REPLAYED;
        return CALL_ACT_FINAL;
    }

    switch (a->status) {

    case 429:
    case 503:
        /* the upstream's "not done, try later": the module released it */
        *out = CALL_OUT_UNAVAILABLE;
        return CALL_ACT_WAIT;

    case 502:
    case 504:
        /* nginx's own: not connected (released) or no answer (unknown) */
        *out = CALL_OUT_TRANSPORT_FAILED;
        return CALL_ACT_AMBIGUOUS;

    case 428:
        *out = CALL_OUT_CONFIRM;
        return CALL_ACT_FINAL;
    }

    *out = ok ? CALL_OUT_CREATED : CALL_OUT_REJECTED;
    return CALL_ACT_FINAL;
}
