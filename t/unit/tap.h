/*
 * A tiny TAP producer for the unit tests (one test program per file, so
 * the state is static here).  prove reads the output; done_testing()
 * gives the exit status: 0 only if every test passed and the plan held.
 */

#ifndef TAP_H
#define TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* not every test uses every helper: no unused-function warnings */
#define TAP_FN  static __attribute__((unused))

static int  tap_run;
static int  tap_failed;
static int  tap_planned = -1;


TAP_FN void
plan(int n)
{
    tap_planned = n;
    printf("1..%d\n", n);
    fflush(stdout);
}


TAP_FN void
diag(const char *fmt, ...)
{
    va_list  ap;

    fflush(stdout);
    fputs("# ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
}


TAP_FN int
tap_vok(int pass, const char *fmt, va_list ap)
{
    tap_run++;

    if (!pass) {
        tap_failed++;
        fputs("not ", stdout);
    }

    printf("ok %d - ", tap_run);
    vprintf(fmt, ap);
    putchar('\n');
    fflush(stdout);

    return pass;
}


__attribute__((format(printf, 2, 3)))
TAP_FN int
ok(int pass, const char *fmt, ...)
{
    va_list  ap;
    int      rc;

    va_start(ap, fmt);
    rc = tap_vok(pass, fmt, ap);
    va_end(ap);

    return rc;
}


/* got may be NULL (counts as a failure unless expected is NULL too) */
__attribute__((format(printf, 3, 4)))
TAP_FN int
is_str(const char *got, const char *expected, const char *fmt, ...)
{
    va_list  ap;
    int      pass;

    if (got == NULL || expected == NULL) {
        pass = (got == expected);
    } else {
        pass = (strcmp(got, expected) == 0);
    }

    va_start(ap, fmt);
    tap_vok(pass, fmt, ap);
    va_end(ap);

    if (!pass) {
        diag("       got: '%s'", got ? got : "(null)");
        diag("  expected: '%s'", expected ? expected : "(null)");
    }

    return pass;
}


__attribute__((format(printf, 3, 4)))
TAP_FN int
is_int(long got, long expected, const char *fmt, ...)
{
    va_list  ap;
    int      pass;

    pass = (got == expected);

    va_start(ap, fmt);
    tap_vok(pass, fmt, ap);
    va_end(ap);

    if (!pass) {
        diag("       got: %ld", got);
        diag("  expected: %ld", expected);
    }

    return pass;
}


/* prints the plan if none was given; returns the exit status */
TAP_FN int
done_testing(void)
{
    if (tap_planned < 0) {
        printf("1..%d\n", tap_run);
        tap_planned = tap_run;
    }

    fflush(stdout);

    if (tap_run != tap_planned) {
        diag("planned %d tests but ran %d", tap_planned, tap_run);
        return 255;
    }

    if (tap_failed) {
        diag("failed %d test(s) of %d", tap_failed, tap_run);
        return (tap_failed < 254) ? tap_failed : 254;
    }

    return 0;
}

#endif /* TAP_H */
