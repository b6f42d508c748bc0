/*
 * The answer table (idem_answer.c): every row complete (slug, title,
 * action, the action's sentence, detail, a status), slugs unique and in
 * the order the glue's enum names them, the look-ups by slug and by type,
 * and every type documented for clients: a "### slug" section in
 * docs/directives.md's "Problem types" and a row naming its action in
 * docs/agents.md's table.  A type added without its rule or its docs
 * fails here.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem_answer.h"
#include "tap.h"


/* the glue's ngx_http_idem_problem_e takes these indexes for its values */
static const struct {
    idem_answer_e   index;
    const char     *slug;
} expected[] = {
    { IDEM_ANS_KEY_MISSING, "key-missing" },
    { IDEM_ANS_KEY_MALFORMED, "key-malformed" },
    { IDEM_ANS_MISMATCH, "fingerprint-mismatch" },
    { IDEM_ANS_IN_PROGRESS, "in-progress" },
    { IDEM_ANS_UNKNOWN, "outcome-unknown" },
    { IDEM_ANS_NOT_STORED, "response-not-stored" },
    { IDEM_ANS_STORE_DOWN, "store-unavailable" },
    { IDEM_ANS_STORE_ERROR, "store-error" },
    { IDEM_ANS_NOT_REPLICATED, "store-not-replicated" },
    { IDEM_ANS_NOT_FOUND, "not-found" },
    { IDEM_ANS_NOT_RESOLVABLE, "not-resolvable" },
    { IDEM_ANS_BAD_ADMIN, "bad-admin-request" },
    { IDEM_ANS_RETRY_LATER, "retry-later" },
    { IDEM_ANS_CONFIRM_REQUIRED, "confirmation-required" },
    { IDEM_ANS_CONFIRM_INVALID, "confirmation-invalid" },
    { IDEM_ANS_CONFIRM_EXPIRED, "confirmation-expired" },
    { IDEM_ANS_BAD_APPROVAL, "bad-approval-request" },
    { IDEM_ANS_APPROVAL_MISMATCH, "approval-mismatch" },
    { IDEM_ANS_NOT_APPROVABLE, "not-approvable" },
    { IDEM_ANS_LOCK_HELD, "lock-held" },
    { IDEM_ANS_BODY_UNREADABLE, "body-unreadable" },
    { IDEM_ANS_METHOD_NOT_ALLOWED, "method-not-allowed" },
    { IDEM_ANS_UNSUPPORTED_MEDIA, "unsupported-media-type" },
    { IDEM_ANS_LOCK_VALUE_MISSING, "lock-value-missing" },
    { IDEM_ANS_IDENTITY_ELSEWHERE, "identity-held-elsewhere" },
    { IDEM_ANS_CROSS_SITE, "cross-site-request" },
    { IDEM_ANS_CONFIRM_DECLINED, "confirmation-declined" },
    { IDEM_ANS_APPROVER_MISMATCH, "approver-mismatch" },
    { IDEM_ANS_AUDIT_UNAVAILABLE, "audit-unavailable" },
    { IDEM_ANS_BODY_TOO_LARGE, "body-too-large" },
    { IDEM_ANS_INTERNAL_ERROR, "internal-error" }
};

#define NEXPECTED  (sizeof(expected) / sizeof(expected[0]))


static int
nonempty(const char *s)
{
    return s != NULL && s[0] != '\0';
}


static void
test_rows(void)
{
    size_t              i, j;
    const char         *name;
    const idem_answer_t *a;

    is_int((long) idem_answers_n, (long) IDEM_ANS_N,
           "idem_answers_n is the number of names");
    is_int((long) idem_answers_n, (long) NEXPECTED,
           "this test knows every row");

    for (i = 0; i < idem_answers_n; i++) {
        a = &idem_answers[i];
        name = idem_action_name(a->action);

        ok(nonempty(a->slug) && nonempty(a->title) && nonempty(a->detail)
           && nonempty(a->action_text) && name != NULL,
           "row %zu (%s): slug, title, detail, action and its sentence",
           i, a->slug ? a->slug : "(null)");

        ok(a->status == 0 || (a->status >= 400 && a->status <= 599),
           "%s: status %d is 0 (the location's) or 4xx/5xx",
           a->slug ? a->slug : "(null)", a->status);

        for (j = 0; j < i; j++) {
            if (a->slug && idem_answers[j].slug
                && strcmp(a->slug, idem_answers[j].slug) == 0)
            {
                break;
            }
        }

        ok(j == i, "%s: slug unique", a->slug ? a->slug : "(null)");

        /* a retry rule needs something to wait for */
        if (a->action == IDEM_ACT_RETRY_AFTER) {
            ok(a->retry_after, "%s: retry_after action, Retry-After sent",
               a->slug);
        }
    }

    for (i = 0; i < NEXPECTED && i < idem_answers_n; i++) {
        ok(idem_answers[expected[i].index].slug != NULL
           && strcmp(idem_answers[expected[i].index].slug, expected[i].slug)
              == 0,
           "row %d is %s", (int) expected[i].index, expected[i].slug);
    }
}


static void
test_lookup(void)
{
    size_t               i;
    char                 type[256];
    const idem_answer_t *a;

    for (i = 0; i < idem_answers_n; i++) {
        a = &idem_answers[i];
        snprintf(type, sizeof(type), IDEM_PROBLEM_TYPE_PREFIX "%s", a->slug);

        ok(idem_answer_find(a->slug, strlen(a->slug)) == a
           && idem_answer_from_type(a->slug, strlen(a->slug)) == a
           && idem_answer_from_type(type, strlen(type)) == a,
           "%s: found by slug and by type", a->slug);
    }

    ok(idem_answer_find("lock", 4) == NULL, "a prefix of a slug is no slug");
    ok(idem_answer_find("lock-held-", 10) == NULL, "nor a longer name");
    ok(idem_answer_find("LOCK-HELD", 9) == NULL, "slugs are case-sensitive");
    ok(idem_answer_from_type("urn:other:lock-held", 19) == NULL,
       "another URN is not a type of ours");
    ok(idem_answer_from_type(IDEM_PROBLEM_TYPE_PREFIX,
                             sizeof(IDEM_PROBLEM_TYPE_PREFIX) - 1) == NULL,
       "the prefix alone is no type");
    ok(idem_answer_from_type("", 0) == NULL && idem_answer_from_type(NULL, 0)
       == NULL, "nothing is no type");
    ok(idem_answer_from_type("lock-held trailing", 9) != NULL,
       "the length bounds the type");

    is_str(idem_action_name(IDEM_ACT_FINAL), "final", "final");
    is_str(idem_action_name(IDEM_ACT_RETRY_AFTER), "retry_after",
           "retry_after");
    is_str(idem_action_name(IDEM_ACT_WAIT_RETRY), "wait_retry", "wait_retry");
    is_str(idem_action_name(IDEM_ACT_ASK_PERSON), "ask_person", "ask_person");
    is_str(idem_action_name(IDEM_ACT_OPERATOR), "operator", "operator");
    ok(idem_action_name((idem_action_e) 99) == NULL, "no name for no action");
}


static char *
slurp(const char *path)
{
    long   n;
    char  *s;
    FILE  *f;

    f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }

    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);

    s = malloc(n + 1);
    if (s != NULL) {
        s[fread(s, 1, n, f)] = '\0';
    }

    fclose(f);

    return s;
}


/* the text of one "## title" section, up to the next "## " */
static char *
section(char *doc, const char *title)
{
    char  *p, *end;

    p = strstr(doc, title);
    if (p == NULL) {
        return NULL;
    }

    end = strstr(p + strlen(title), "\n## ");
    if (end != NULL) {
        *end = '\0';
    }

    return p;
}


/* a line of text that starts with 'start' and contains both needles */
static int
has_line(const char *text, const char *start, const char *n1,
    const char *n2)
{
    const char  *p, *eol;
    size_t       len;
    char         line[2048];

    for (p = text; *p; p = eol + (*eol != '\0')) {
        eol = strchr(p, '\n');
        if (eol == NULL) {
            eol = p + strlen(p);
        }

        len = (size_t) (eol - p) < sizeof(line) - 1
              ? (size_t) (eol - p) : sizeof(line) - 1;
        memcpy(line, p, len);
        line[len] = '\0';

        if (strncmp(line, start, strlen(start)) == 0
            && strstr(line, n1) != NULL && (n2 == NULL || strstr(line, n2)))
        {
            return 1;
        }
    }

    return 0;
}


static void
test_docs(const char *docs)
{
    size_t               i;
    char                 path[4200], head[128], slug[128], action[64];
    char                *directives, *agents, *types, *table;
    const idem_answer_t *a;

    snprintf(path, sizeof(path), "%s/directives.md", docs);
    directives = slurp(path);
    snprintf(path, sizeof(path), "%s/agents.md", docs);
    agents = slurp(path);

    types = directives ? section(directives, "\n## Problem types\n") : NULL;
    table = agents ? section(agents, "\n## The module's answers\n") : NULL;

    ok(types != NULL, "docs/directives.md has its \"Problem types\"");
    ok(table != NULL, "docs/agents.md has \"The module's answers\"");

    for (i = 0; i < idem_answers_n; i++) {
        a = &idem_answers[i];
        snprintf(head, sizeof(head), "\n### %s\n", a->slug);
        snprintf(slug, sizeof(slug), "`%s`", a->slug);
        snprintf(action, sizeof(action), "`%s`", idem_action_name(a->action));

        ok(types != NULL && strstr(types, head) != NULL,
           "%s: a section in docs/directives.md's Problem types", a->slug);

        ok(table != NULL && has_line(table, "| ", slug, action),
           "%s: a row in docs/agents.md naming its action %s", a->slug,
           action);
    }

    free(directives);
    free(agents);
}


int
main(int argc, char **argv)
{
    char  docs[4096];

    test_rows();
    test_lookup();

    /* argv[1] is t/data/jcs; the docs are the repository's */
    snprintf(docs, sizeof(docs), "%s/../../../docs",
             argc > 1 ? argv[1] : "t/data/jcs");
    test_docs(docs);

    return done_testing();
}
