/*
 * The retry rule of idempotency-call and idempotency-mcp (tools/
 * call_policy.c, driven by the core's answer table) against the table in
 * docs/agents.md, read from the file itself: a row the code does not
 * follow, a documented outcome the code does not name, or a type of the
 * answer table without a row, fails here.  argv[1] is t/data/jcs; the docs are found
 * from there.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "idem_answer.h"
#include "call_policy.h"


static char  documented[4096];  /* " slug slug ... " of the table's rows */


static const char *
act_name(call_act_e act)
{
    return act == CALL_ACT_WAIT ? "wait"
           : act == CALL_ACT_AMBIGUOUS ? "ask" : "final";
}


/* "`problem:lock-held`", "`status:201 reused`", "`transport`" */
static int
parse_answer(const char *cell, call_answer_t *a, char *slug, size_t n)
{
    memset(a, 0, sizeof(call_answer_t));
    a->transport_ok = 1;

    if (strncmp(cell, "transport", 9) == 0) {
        a->transport_ok = 0;
        return 0;
    }

    if (sscanf(cell, "problem:%63[a-z-]", slug) == 1) {
        a->slug = slug;
        strncat(documented, slug, sizeof(documented) - strlen(documented) - 2);
        strcat(documented, " ");
        a->status = 409;
        return 0;
    }

    if (sscanf(cell, "status:%ld", &a->status) == 1) {
        a->replayed = (strstr(cell, " replayed`") != NULL);
        a->reused = (strstr(cell, " reused`") != NULL);
        return 0;
    }

    return -1;
}


/* "| `answer` ... | act | `outcome` |" */
static void
check_row(char *line)
{
    char            slug[64], *cells[4], *p = line;
    const char     *want_out, *want_act;
    call_answer_t   a;
    call_outcome_e  out;
    call_act_e      act;
    int             i;

    for (i = 0; i < 4 && (p = strchr(p, '|')) != NULL; i++) {
        *p++ = '\0';
        cells[i] = p;
    }

    if (i < 4 || cells[0][1] != '`' || parse_answer(cells[0] + 2, &a, slug,
                                                    sizeof(slug)) != 0)
    {
        ok(0, "a row of the table that parses: %s", line);
        return;
    }

    want_act = strtok(cells[1], " ");
    want_out = strtok(cells[2], " `");
    act = call_policy(&a, &out);

    ok(strcmp(act_name(act), want_act) == 0
       && strcmp(call_outcome_name(out), want_out) == 0,
       "%.60s: %s %s (the code: %s %s)", cells[0] + 1, want_act, want_out,
       act_name(act), call_outcome_name(out));
}


int
main(int argc, char **argv)
{
    char   path[4096], line[1024];
    FILE  *f;
    int    in = 0, rows = 0;

    documented[0] = ' ';

    snprintf(path, sizeof(path), "%s/../../../docs/agents.md",
             argc > 1 ? argv[1] : "t/data/jcs");

    f = fopen(path, "r");
    if (!ok(f != NULL, "docs/agents.md opens (%s)", path)) {
        return done_testing();
    }

    while (fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, "retry-rule-table: begin")) {
            in = 1;

        } else if (strstr(line, "retry-rule-table: end")) {
            in = 0;

        } else if (in && strncmp(line, "| `", 3) == 0) {
            line[strcspn(line, "\n")] = '\0';
            check_row(line);
            rows++;
        }
    }

    fclose(f);
    ok(rows >= 30, "the table has its rows (%d)", rows);

    /* every type of the module's answer table has its row */
    for (size_t i = 0; i < idem_answers_n; i++) {
        char  w[80];

        snprintf(w, sizeof(w), " %s ", idem_answers[i].slug);
        ok(strstr(documented, w) != NULL, "%s (%s): a row in docs/agents.md",
           idem_answers[i].slug, idem_action_name(idem_answers[i].action));
    }

    /* the outcome names the results use: unique, none missing */
    ok(strcmp(call_outcome_name(CALL_OUT_REFUSED), "refused") == 0,
       "the client's own refusal is named");
    ok(call_outcome_done(CALL_OUT_REUSED) && !call_outcome_done(CALL_OUT_LOCK_HELD),
       "reused is done, lock_held is not");

    return done_testing();
}
