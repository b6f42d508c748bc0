/*
 * The module's problem answers (RFC 9457) as one table: type, title,
 * status, detail, and what a client does on receiving each one.  The
 * module answers from it and idempotency-call classifies from it, so a
 * new answer cannot reach clients without a rule for them.  Pure C.
 */

#ifndef IDEM_ANSWER_H
#define IDEM_ANSWER_H

#include <stddef.h>


#define IDEM_PROBLEM_TYPE_PREFIX  "urn:ngx-idempotency:problem:"


typedef enum {
    IDEM_ACT_FINAL = 0,      /* the answer stands: do not resend */
    IDEM_ACT_RETRY_AFTER,    /* resend the same request, same key, after
                                Retry-After */
    IDEM_ACT_WAIT_RETRY,     /* wait (status endpoint or Retry-After), then
                                resend the same request */
    IDEM_ACT_ASK_PERSON,     /* stop: a person must decide (approve,
                                decline, new key) */
    IDEM_ACT_OPERATOR        /* stop: an operator must act (unknown
                                outcome, store error) */
} idem_action_e;


typedef struct {
    const char    *slug;         /* type = IDEM_PROBLEM_TYPE_PREFIX slug */
    const char    *title;
    int            status;       /* 0: the location's conflict status
                                    (409 or 422) */
    unsigned       retry_after:1;
    unsigned       stored:1;     /* carries response_status and location */
    unsigned       upstream:1;   /* status and Retry-After are the
                                    upstream's answer to the attempt
                                    waited on */
    idem_action_e  action;
    const char    *action_text;  /* one sentence for a client / an agent */
    const char    *detail;
} idem_answer_t;


/*
 * The rows of idem_answers[], by name.  The glue's ngx_http_idem_problem_e
 * takes its values from these, and idem_answer.c places each row at its
 * name, so the module's enum, this table and its order cannot drift apart.
 */
typedef enum {
    IDEM_ANS_KEY_MISSING = 0,
    IDEM_ANS_KEY_MALFORMED,
    IDEM_ANS_MISMATCH,
    IDEM_ANS_IN_PROGRESS,
    IDEM_ANS_UNKNOWN,
    IDEM_ANS_NOT_STORED,
    IDEM_ANS_STORE_DOWN,
    IDEM_ANS_STORE_ERROR,
    IDEM_ANS_NOT_REPLICATED,
    IDEM_ANS_NOT_FOUND,
    IDEM_ANS_NOT_RESOLVABLE,
    IDEM_ANS_BAD_ADMIN,
    IDEM_ANS_RETRY_LATER,
    IDEM_ANS_CONFIRM_REQUIRED,
    IDEM_ANS_CONFIRM_INVALID,
    IDEM_ANS_CONFIRM_EXPIRED,
    IDEM_ANS_BAD_APPROVAL,
    IDEM_ANS_APPROVAL_MISMATCH,
    IDEM_ANS_NOT_APPROVABLE,
    IDEM_ANS_LOCK_HELD,
    IDEM_ANS_BODY_UNREADABLE,
    IDEM_ANS_METHOD_NOT_ALLOWED,
    IDEM_ANS_UNSUPPORTED_MEDIA,
    IDEM_ANS_LOCK_VALUE_MISSING,
    IDEM_ANS_IDENTITY_ELSEWHERE,
    IDEM_ANS_CROSS_SITE,
    IDEM_ANS_CONFIRM_DECLINED,
    IDEM_ANS_APPROVER_MISMATCH,
    IDEM_ANS_AUDIT_UNAVAILABLE,
    IDEM_ANS_BODY_TOO_LARGE,
    IDEM_ANS_INTERNAL_ERROR,
    IDEM_ANS_N
} idem_answer_e;


extern const idem_answer_t  idem_answers[];
extern const size_t         idem_answers_n;


/* NULL if unknown */
const idem_answer_t *idem_answer_find(const char *slug, size_t len);

/* the full type (IDEM_PROBLEM_TYPE_PREFIX slug) or a bare slug; NULL if
   unknown */
const idem_answer_t *idem_answer_from_type(const char *type, size_t len);

/* "final", "retry_after", "wait_retry", "ask_person", "operator" */
const char *idem_action_name(idem_action_e a);


#endif /* IDEM_ANSWER_H */
