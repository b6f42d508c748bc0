/*
 * The retry rule of docs/agents.md as a pure function: what one answer
 * means for the call (done, wait then resend, ask then resend) and which
 * outcome it is, from the core's answer table (idem_answer.h).  No I/O, no
 * libcurl: t/unit/test_call_policy.c checks it against docs/agents.md's
 * table.
 */

#ifndef CALL_POLICY_H
#define CALL_POLICY_H

typedef enum {
    CALL_OUT_CREATED = 0,
    CALL_OUT_REPLAYED,
    CALL_OUT_REUSED,
    CALL_OUT_IN_PROGRESS,
    CALL_OUT_CONFLICT,
    CALL_OUT_UNKNOWN,
    CALL_OUT_CONFIRM,
    CALL_OUT_DECLINED,
    CALL_OUT_LOCK_HELD,
    CALL_OUT_REJECTED,          /* a final answer that is not 2xx/3xx */
    CALL_OUT_UNAVAILABLE,       /* "not now": Redis, replicas, upstream */
    CALL_OUT_TRANSPORT_FAILED,
    CALL_OUT_REFUSED,           /* the client's own refusal, nothing sent */
    CALL_OUT_N
} call_outcome_e;


typedef enum {
    CALL_ACT_FINAL,         /* report it */
    CALL_ACT_AMBIGUOUS,     /* may or may not have run: ask, then resend */
    CALL_ACT_WAIT           /* not done: wait Retry-After, resend */
} call_act_e;


/* one answer, as the rule sees it */
typedef struct {
    int          transport_ok;
    long         status;
    const char  *slug;      /* the module's problem type, or NULL */
    int          replayed;  /* Idempotent-Replayed: true */
    int          reused;    /* Idempotent-Reused: true */
} call_answer_t;


call_act_e call_policy(const call_answer_t *a, call_outcome_e *out);
const char *call_outcome_name(call_outcome_e o);
int call_outcome_done(call_outcome_e o);

#endif /* CALL_POLICY_H */
