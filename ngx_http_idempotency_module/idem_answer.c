/*
 * The module's problem answers and the client's action on each.  The
 * details are the module's words to the client of this request; the
 * action_text is the rule a program (idempotency-call, an agent's host)
 * follows, and matches docs/agents.md and docs/directives.md's "Problem
 * types", which t/unit/test_answer.c checks.  Pure C.
 */

#include <string.h>

#include "idem_answer.h"


#define IDEM_PREFIX_LEN  (sizeof(IDEM_PROBLEM_TYPE_PREFIX) - 1)


const idem_answer_t  idem_answers[] = {

    [IDEM_ANS_KEY_MISSING] =
    { "key-missing", "Idempotency key required",
      400, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend as is: add an Idempotency-Key, one new value per "
      "intended action",
      "this endpoint requires an idempotency key header" },

    [IDEM_ANS_KEY_MALFORMED] =
    { "key-malformed", "Malformed idempotency key",
      400, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend: the key is invalid, a client bug to fix",
      "the idempotency key header is malformed" },

    [IDEM_ANS_MISMATCH] =
    { "fingerprint-mismatch", "Idempotency key reused for another request",
      0, 0, 0, 0, IDEM_ACT_FINAL,
      "stop: the key belongs to another request; a new request needs a "
      "new key",
      "this idempotency key was used for a different request; "
      "use a new key for a new request" },

    [IDEM_ANS_IN_PROGRESS] =
    { "in-progress", "Request with this idempotency key is in progress",
      409, 1, 0, 0, IDEM_ACT_WAIT_RETRY,
      "wait Retry-After (or ask the status endpoint), then resend the same "
      "request with the same key",
      "a request with this idempotency key is being processed; "
      "retry later with the same key" },

    [IDEM_ANS_UNKNOWN] =
    { "outcome-unknown", "Outcome of the original request is unknown",
      409, 0, 0, 0, IDEM_ACT_OPERATOR,
      "stop: the action may or may not have happened; check its effect or "
      "ask an operator to resolve the key",
      "the original request may or may not have been executed; "
      "it is not retried automatically: check the operation's "
      "status before acting" },

    [IDEM_ANS_NOT_STORED] =
    { "response-not-stored", "Original response was too large to store",
      409, 0, 1, 0, IDEM_ACT_FINAL,
      "do not resend: the action happened; fetch its result from the "
      "upstream (location)",
      "the request was executed, but its response was larger "
      "than idempotency_store_max and cannot be replayed" },

    [IDEM_ANS_STORE_DOWN] =
    { "store-unavailable", "Idempotency store unavailable",
      503, 1, 0, 0, IDEM_ACT_RETRY_AFTER,
      "resend the same request with the same key after Retry-After",
      "the idempotency store cannot be reached; nothing was "
      "done, retry with the same key" },

    [IDEM_ANS_STORE_ERROR] =
    { "store-error", "Idempotency store returned an unexpected record",
      500, 0, 0, 0, IDEM_ACT_OPERATOR,
      "stop: an operator has to look at the store's data for this key",
      "the idempotency store holds a record this module cannot "
      "read; nothing was executed" },

    [IDEM_ANS_NOT_REPLICATED] =
    { "store-not-replicated", "Idempotency store not replicated in time",
      503, 1, 0, 0, IDEM_ACT_RETRY_AFTER,
      "resend the same request with the same key after Retry-After",
      "the idempotency store did not copy the claim to enough replicas "
      "in time; nothing was executed, retry with the same key" },

    [IDEM_ANS_NOT_FOUND] =
    { "not-found", "No record for this idempotency key",
      404, 0, 0, 0, IDEM_ACT_FINAL,
      "no record: a resend of the action itself would execute it",
      "no request with this idempotency key is known in this scope" },

    [IDEM_ANS_NOT_RESOLVABLE] =
    { "not-resolvable", "Record is not unknown",
      409, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend: the record is not one to resolve (see state)",
      "only a record whose outcome is unknown, or whose "
      "owner's lease lapsed, can be resolved" },

    [IDEM_ANS_BAD_ADMIN] =
    { "bad-admin-request", "Unknown admin action",
      400, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend: fix the admin request",
      "use ?action=release, or ?action=complete&status=NNN, each "
      "parameter once" },

    [IDEM_ANS_RETRY_LATER] =
    { "retry-later", "The upstream asked to retry later",
      0, 1, 0, 1, IDEM_ACT_RETRY_AFTER,
      "resend the same request with the same key after Retry-After; that "
      "resend executes",
      "the attempt this request waited for was answered by the upstream "
      "with a status meaning \"not done, try later\" and was not "
      "recorded; retry with the same key after Retry-After" },

    [IDEM_ANS_CONFIRM_REQUIRED] =
    { "confirmation-required", "Confirmation required",
      428, 0, 0, 0, IDEM_ACT_ASK_PERSON,
      "stop: a person approves the proposal; then send the same request "
      "with the same key and the approval",
      "this request needs an approval bound to its idempotency key and "
      "fingerprint; nothing was executed: send the same request again "
      "with an Idempotency-Confirmation header (see proposal)" },

    [IDEM_ANS_CONFIRM_INVALID] =
    { "confirmation-invalid", "Confirmation refused",
      428, 0, 0, 0, IDEM_ACT_ASK_PERSON,
      "stop: that approval is not valid for this request; ask a person "
      "for a new one",
      "the Idempotency-Confirmation header is not a valid approval of this "
      "request (see reason); nothing was executed" },

    [IDEM_ANS_CONFIRM_EXPIRED] =
    { "confirmation-expired", "Confirmation expired",
      428, 0, 0, 0, IDEM_ACT_ASK_PERSON,
      "stop: the approval expired; ask a person for a new one",
      "the approval of this request has expired; nothing was executed: "
      "ask for a new approval" },

    [IDEM_ANS_BAD_APPROVAL] =
    { "bad-approval-request", "Malformed approval",
      400, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend: fix the approval request",
      "send a JSON object with operation_id (32 hex), fingerprint (64 hex), "
      "approved_by (1 to 256 bytes) and expires_in (seconds)" },

    [IDEM_ANS_APPROVAL_MISMATCH] =
    { "approval-mismatch", "Approval of another request",
      409, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend: what was approved is not the request that waits",
      "the fingerprint is not the proposal's: what was approved is not "
      "the request that waits; nothing was approved" },

    [IDEM_ANS_NOT_APPROVABLE] =
    { "not-approvable", "Operation is not awaiting confirmation",
      409, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend: the operation has run or is running (see state)",
      "only an operation awaiting confirmation (or approved, to renew the "
      "approval) can be approved; this one has run or is running" },

    [IDEM_ANS_LOCK_HELD] =
    { "lock-held", "Another operation holds the lock",
      409, 1, 0, 0, IDEM_ACT_WAIT_RETRY,
      "wait Retry-After, then resend the same request with the same key",
      "another operation holds this request's lock (idempotency_lock); "
      "nothing was executed: retry with the same key after Retry-After" },

    [IDEM_ANS_BODY_UNREADABLE] =
    { "body-unreadable", "Request body could not be read",
      400, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend as is: send plain JSON, each member once, at most "
      "1 MiB",
      "this endpoint decides by members of the JSON body (its business "
      "identity, lock or confirmation), and the body could not be read as "
      "the upstream would read it (not canonical JSON, such as duplicate "
      "member names, or larger than 1 MiB); nothing was executed" },

    [IDEM_ANS_METHOD_NOT_ALLOWED] =
    { "method-not-allowed", "Method not allowed",
      405, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend: use a method the Allow header lists",
      "this endpoint does not handle this method (see Allow); nothing "
      "was done" },

    [IDEM_ANS_UNSUPPORTED_MEDIA] =
    { "unsupported-media-type", "Unsupported media type",
      415, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend as is: send the body as application/json",
      "this endpoint reads a JSON body and the request's is of another "
      "media type; nothing was done" },

    [IDEM_ANS_LOCK_VALUE_MISSING] =
    { "lock-value-missing", "Lock value missing",
      400, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend as is: the request must name the value it locks",
      "this endpoint takes a lock named by the request "
      "(idempotency_lock), and the request names none; nothing was "
      "executed" },

    [IDEM_ANS_IDENTITY_ELSEWHERE] =
    { "identity-held-elsewhere", "Business identity held by another endpoint",
      409, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend: use a new key with a corrected request",
      "this request's business identity is held by an operation of "
      "another endpoint, whose answer is not this request's; nothing was "
      "executed" },

    [IDEM_ANS_CROSS_SITE] =
    { "cross-site-request", "Request from another site",
      403, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend: the request must come from the endpoint's own site",
      "the request's Origin or Sec-Fetch-Site says it comes from another "
      "site; nothing was done" },

    [IDEM_ANS_CONFIRM_DECLINED] =
    { "confirmation-declined", "Confirmation declined",
      403, 0, 0, 0, IDEM_ACT_FINAL,
      "stop: a person declined this action; a new intended action needs a "
      "new key",
      "a person declined this operation; nothing was executed and nothing "
      "will be under this key" },

    [IDEM_ANS_APPROVER_MISMATCH] =
    { "approver-mismatch", "Approver is not the authenticated user",
      403, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend: the approver is the authenticated user, never a "
      "name in the request",
      "the approver is who this server authenticated, not a name in the "
      "request; nothing was recorded" },

    [IDEM_ANS_AUDIT_UNAVAILABLE] =
    { "audit-unavailable", "Audit unavailable",
      503, 1, 0, 0, IDEM_ACT_RETRY_AFTER,
      "resend the same request with the same key after Retry-After",
      "the audit device could not record this request, so it was not "
      "executed; retry with the same key after Retry-After" },

    [IDEM_ANS_BODY_TOO_LARGE] =
    { "body-too-large", "Request body too large",
      413, 0, 0, 0, IDEM_ACT_FINAL,
      "do not resend as is: the body is over this endpoint's limit",
      "the request body is larger than this endpoint takes "
      "(client_max_body_size); nothing was done" },

    [IDEM_ANS_INTERNAL_ERROR] =
    { "internal-error", "Internal error",
      500, 0, 0, 0, IDEM_ACT_OPERATOR,
      "stop: an operator reads the server's error log",
      "the server could not answer this request (see its error log); "
      "nothing was done" }
};

const size_t  idem_answers_n = sizeof(idem_answers) / sizeof(idem_answers[0]);


/* a row left out of the initializers above would be all zeros */
typedef char  idem_answers_complete_t[
    sizeof(idem_answers) / sizeof(idem_answers[0]) == IDEM_ANS_N ? 1 : -1];


const idem_answer_t *
idem_answer_find(const char *slug, size_t len)
{
    size_t  i;

    for (i = 0; i < idem_answers_n; i++) {
        if (idem_answers[i].slug != NULL
            && strlen(idem_answers[i].slug) == len
            && memcmp(idem_answers[i].slug, slug, len) == 0)
        {
            return &idem_answers[i];
        }
    }

    return NULL;
}


const idem_answer_t *
idem_answer_from_type(const char *type, size_t len)
{
    if (type == NULL || len == 0) {
        return NULL;
    }

    if (len >= IDEM_PREFIX_LEN
        && memcmp(type, IDEM_PROBLEM_TYPE_PREFIX, IDEM_PREFIX_LEN) == 0)
    {
        return idem_answer_find(type + IDEM_PREFIX_LEN,
                                len - IDEM_PREFIX_LEN);
    }

    /* a bare slug never contains ':', so another URN is never one */
    if (memchr(type, ':', len) != NULL) {
        return NULL;
    }

    return idem_answer_find(type, len);
}


const char *
idem_action_name(idem_action_e a)
{
    switch (a) {
    case IDEM_ACT_FINAL:
        return "final";
    case IDEM_ACT_RETRY_AFTER:
        return "retry_after";
    case IDEM_ACT_WAIT_RETRY:
        return "wait_retry";
    case IDEM_ACT_ASK_PERSON:
        return "ask_person";
    case IDEM_ACT_OPERATOR:
        return "operator";
    }

    return NULL;
}
