/*
 * The retry loop (call_run.h).
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "call_state.h"
#include "call_run.h"


long long
call_now_ms(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}


void
call_run_init(call_run_t *run)
{
    memset(run, 0, sizeof(call_run_t));
    run->resp.retry_after = -1;
    run->status.retry_after = -1;
}


void
call_run_free(call_run_t *run)
{
    call_resp_reset(&run->resp);
    call_resp_reset(&run->status);
}


static long
time_left(call_run_t *run)
{
    long long  left = run->deadline - call_now_ms();

    return (left > 0) ? (long) left : 0;
}


static int
cancelled(call_run_t *run)
{
    /* set by another thread (idempotency-mcp's reader) */
    return run->cancel != NULL && __atomic_load_n(run->cancel, __ATOMIC_RELAXED);
}


/*
 * Asks the status endpoint for the key; the record's state goes to
 * run->state_seen ("" when there is no answer, "none" for 404).
 */
void
call_run_status(call_run_t *run)
{
    call_resp_t  *s = &run->status;
    cJSON        *doc;
    const char   *v;
    long          t = time_left(run);

    run->state_seen[0] = '\0';

    if (run->status_url == NULL || t == 0) {
        return;
    }

    t = (t < 5000) ? t : 5000;
    s->cancel = run->cancel;

    if (call_http_do("GET", run->status_url, run->headers, NULL, 0, t, s)
        != 0 || s->curl_rc != CURLE_OK)
    {
        return;
    }

    if (s->status == 404 && strcmp(s->slug, "not-found") == 0) {
        strcpy(run->state_seen, "none");
        return;
    }

    doc = (s->status == 200) ? cJSON_ParseWithLength(s->body, s->len) : NULL;

    if ((v = call_json_str(doc, "state")) != NULL) {
        snprintf(run->state_seen, sizeof(run->state_seen), "%s", v);
    }

    if ((v = call_json_str(doc, "operation_id")) != NULL && strlen(v) == 32) {
        memcpy(run->operation_id, v, 33);
    }

    cJSON_Delete(doc);
}


static long
backoff_ms(int attempt)
{
    long  b = 250L << (attempt < 5 ? attempt - 1 : 4);

    return b / 2 + random() % (b / 2 + 1);
}


/*
 * Sleeps ms unless that passes the deadline: 0 slept, -1 out of time or
 * cancelled.  In slices, so that a cancel is seen soon.
 */
static int
wait_within(call_run_t *run, long ms)
{
    struct timespec  ts;
    long long        until;
    long             step;

    if (ms >= time_left(run)) {
        return -1;
    }

    until = call_now_ms() + ms;

    while (!cancelled(run) && (step = (long) (until - call_now_ms())) > 0) {
        step = (step < 100) ? step : 100;
        ts.tv_sec = 0;
        ts.tv_nsec = step * 1000000L;
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
            /* the rest of the slice */
        }
    }

    return cancelled(run) ? -1 : 0;
}


static void
run_stopped(call_run_t *run, const char *why)
{
    if (cancelled(run)) {
        run->cancelled = 1;
        run->error = "cancelled: the key is kept, the same call resumes it";
        return;
    }

    run->gave_up = 1;
    run->error = why;
}


/* after a lost answer: 1 to resend, 0 stop */
static int
after_ambiguous(call_run_t *run)
{
    int  busy;

    call_run_status(run);

    if (strcmp(run->state_seen, "unknown") == 0) {
        run->outcome = CALL_OUT_UNKNOWN;
        run->error = "the status endpoint reports the outcome unknown";
        return 0;
    }

    /* in_progress: the first attempt still runs; completed: will replay */
    busy = (strcmp(run->state_seen, "in_progress") == 0);

    if (wait_within(run, busy ? 1000 : backoff_ms(run->attempts)) == 0) {
        return 1;
    }

    run->outcome = busy ? CALL_OUT_IN_PROGRESS : CALL_OUT_TRANSPORT_FAILED;
    run_stopped(run, "no final answer before the deadline");
    return 0;
}


static int
after_wait(call_run_t *run)
{
    long  ra = run->resp.retry_after;

    if (wait_within(run, (ra >= 0 ? ra : 1) * 1000) == 0) {
        return 1;
    }

    run->final = 1;
    run_stopped(run, "Retry-After passes the deadline");
    return 0;
}


static call_act_e
run_classify(call_run_t *run)
{
    call_resp_t    *r = &run->resp;
    call_answer_t   a;

    a.transport_ok = (r->curl_rc == CURLE_OK);
    a.status = r->status;
    a.slug = (r->problem != NULL) ? r->slug : NULL;
    a.replayed = r->replayed;
    a.reused = r->reused;

    return call_policy(&a, &run->outcome);
}


/* 0: run->outcome says how it ended; -1: out of memory or libcurl */
int
call_run_loop(call_run_t *run)
{
    call_act_e  act;
    long        t;

    run->resp.cancel = run->cancel;

    for ( ;; ) {
        t = time_left(run);
        if (t == 0 || cancelled(run)) {
            if (run->attempts == 0) {
                run->outcome = CALL_OUT_TRANSPORT_FAILED;
            }
            run_stopped(run, "no final answer before the deadline");
            return 0;
        }

        run->attempts++;
        run->final = 0;

        if (call_http_do(run->method, run->url, run->headers, run->body,
                         run->body_len,
                         t < run->max_time_ms ? t : run->max_time_ms,
                         &run->resp)
            != 0)
        {
            return -1;
        }

        act = run_classify(run);

        if (act == CALL_ACT_FINAL) {
            run->final = 1;
            return 0;
        }

        if (act == CALL_ACT_WAIT ? !after_wait(run) : !after_ambiguous(run)) {
            return 0;
        }
    }
}


/*
 * What both front ends show of a problem answer (run->resp.problem): its
 * slug and detail into o; its operation_id, when it is one, into
 * run->operation_id.
 */
void
call_run_problem(cJSON *o, call_run_t *run)
{
    call_resp_t  *r = &run->resp;
    const char   *v;

    cJSON_AddStringToObject(o, "problem", r->slug);

    if ((v = call_json_str(r->problem, "detail")) != NULL) {
        cJSON_AddStringToObject(o, "detail", v);
    }

    if ((v = call_json_str(r->problem, "operation_id")) != NULL
        && strlen(v) == 32)
    {
        memcpy(run->operation_id, v, 33);
    }
}
