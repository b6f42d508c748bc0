/*
 * The retry rule (call_policy.h).  A problem answer's action comes from
 * the core's answer table; a plain answer's from its status and the
 * module's marks.
 */

#include <stddef.h>
#include <string.h>

#include "idem_answer.h"
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


/*
 * A problem answer: the client's action is the core's answer table's
 * (idem_answer.c, the one the module answers from); the outcome names
 * which "not yet" or which "stop" it is.
 */
static call_act_e
policy_problem(const call_answer_t *a, call_outcome_e *out)
{
    const idem_answer_t  *ans = idem_answer_find(a->slug, strlen(a->slug));
    const idem_answer_t  *row = idem_answers;

    if (ans == NULL) {
        /* a type of a newer module: final, a person decides a 428 */
        *out = (a->status == 428) ? CALL_OUT_CONFIRM : CALL_OUT_REJECTED;
        return CALL_ACT_FINAL;
    }

    switch (ans->action) {

    case IDEM_ACT_RETRY_AFTER:
    case IDEM_ACT_WAIT_RETRY:
        *out = (ans == &row[IDEM_ANS_IN_PROGRESS]) ? CALL_OUT_IN_PROGRESS
               : (ans == &row[IDEM_ANS_LOCK_HELD]) ? CALL_OUT_LOCK_HELD
               : CALL_OUT_UNAVAILABLE;
        return CALL_ACT_WAIT;

    case IDEM_ACT_ASK_PERSON:
        *out = CALL_OUT_CONFIRM;
        return CALL_ACT_FINAL;

    case IDEM_ACT_OPERATOR:
        *out = (ans == &row[IDEM_ANS_UNKNOWN]) ? CALL_OUT_UNKNOWN
                                               : CALL_OUT_REJECTED;
        return CALL_ACT_FINAL;

    default:
        break;
    }

    *out = (ans == &row[IDEM_ANS_MISMATCH]
            || ans == &row[IDEM_ANS_IDENTITY_ELSEWHERE]) ? CALL_OUT_CONFLICT
           /* done earlier; only the body was too large to keep */
           : (ans == &row[IDEM_ANS_NOT_STORED]) ? CALL_OUT_REPLAYED
           : (ans == &row[IDEM_ANS_CONFIRM_DECLINED]) ? CALL_OUT_DECLINED
           : CALL_OUT_REJECTED;
    return CALL_ACT_FINAL;
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
