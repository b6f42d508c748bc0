/*
 * One call of an intended action with the retry rule, bounded by its
 * deadline: attempts (call_http), the rule (call_policy), the status
 * endpoint after a lost answer, and the waits.  Shared by idempotency-call
 * and idempotency-mcp; the key is on disk (call_state) before this runs.
 */

#ifndef CALL_RUN_H
#define CALL_RUN_H

#include <cjson/cJSON.h>

#include "call_http.h"
#include "call_policy.h"


typedef struct {
    /* in */
    const char          *method;
    const char          *url;
    const char          *status_url;    /* or NULL */
    struct curl_slist   *headers;       /* with the key */
    const char          *body;
    size_t               body_len;
    long                 max_time_ms;
    long long            deadline;      /* call_now_ms() + the bound */
    volatile int        *cancel;        /* or NULL: stops the waits */

    /* out */
    call_resp_t          resp;          /* the last answer */
    call_resp_t          status;        /* the last status endpoint answer */
    char                 state_seen[32];
    call_outcome_e       outcome;
    int                  final;         /* resp holds the answer to report */
    int                  gave_up;       /* the deadline came first */
    int                  cancelled;
    int                  attempts;
    const char          *error;
    char                 operation_id[33];
} call_run_t;


void call_run_init(call_run_t *run);
void call_run_free(call_run_t *run);
int call_run_loop(call_run_t *run);
void call_run_status(call_run_t *run);
long long call_now_ms(void);
void call_run_problem(cJSON *o, call_run_t *run);

#endif /* CALL_RUN_H */
