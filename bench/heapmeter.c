/*
 * heapmeter: an LD_PRELOAD heap meter for the per-request memory test.
 *
 * It wraps malloc, calloc, realloc, free, memalign, posix_memalign,
 * aligned_alloc, valloc and pvalloc (everything nginx, its pools, OpenSSL,
 * hiredis and cJSON allocate with), and keeps the bytes in use (usable
 * size + the allocator's 8-byte chunk header) and their peak.
 *
 * On the signal SIGRTMIN+4 the process writes one line
 *     <sequence> <bytes in use> <peak since the last signal>
 * to $HEAPMETER_OUT.<pid> and restarts the peak from the bytes in use.
 * So "signal; load; signal" gives the peak of that window over the heap at
 * its start: with one request at a time, what one request holds at most.
 *
 * Build: cc -O2 -shared -fPIC -o heapmeter.so heapmeter.c
 * Use:   HEAPMETER_OUT=/tmp/x LD_PRELOAD=/path/heapmeter.so nginx ...
 *        (nginx forks its workers, so they keep the library; the output
 *        path is read at load time, before nginx clears the environment)
 */

#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void  __libc_free(void *p);


static long           hm_cur, hm_peak;
static unsigned long  hm_seq;
static char           hm_path[4000];


static inline long
hm_size(void *p)
{
    return (long) (malloc_usable_size(p) + sizeof(size_t));
}


static inline void
hm_add(long n)
{
    long  c;

    c = __atomic_add_fetch(&hm_cur, n, __ATOMIC_RELAXED);
    if (c > hm_peak) {
        hm_peak = c;
    }
}


static inline void
hm_sub(long n)
{
    __atomic_sub_fetch(&hm_cur, n, __ATOMIC_RELAXED);
}


void *
malloc(size_t n)
{
    void  *p = __libc_malloc(n);

    if (p) {
        hm_add(hm_size(p));
    }

    return p;
}


void *
calloc(size_t n, size_t size)
{
    void  *p = __libc_calloc(n, size);

    if (p) {
        hm_add(hm_size(p));
    }

    return p;
}


void *
realloc(void *old, size_t n)
{
    long   was;
    void  *p;

    was = old ? hm_size(old) : 0;
    p = __libc_realloc(old, n);

    if (p) {
        hm_sub(was);
        hm_add(hm_size(p));

    } else if (old && n == 0) {
        hm_sub(was);        /* realloc(p, 0) freed it */
    }

    return p;
}


void
free(void *p)
{
    if (p) {
        hm_sub(hm_size(p));
        __libc_free(p);
    }
}


void *
memalign(size_t align, size_t n)
{
    void  *p = __libc_memalign(align, n);

    if (p) {
        hm_add(hm_size(p));
    }

    return p;
}


void *
aligned_alloc(size_t align, size_t n)
{
    return memalign(align, n);
}


int
posix_memalign(void **out, size_t align, size_t n)
{
    void  *p;

    if (align < sizeof(void *) || (align & (align - 1)) != 0) {
        return EINVAL;
    }

    p = memalign(align, n);
    if (p == NULL) {
        return ENOMEM;
    }

    *out = p;
    return 0;
}


void *
valloc(size_t n)
{
    return memalign(sysconf(_SC_PAGESIZE), n);
}


void *
pvalloc(size_t n)
{
    size_t  page = sysconf(_SC_PAGESIZE);

    return memalign(page, (n + page - 1) & ~(page - 1));
}


/* the report, async-signal-safe */

static char *
hm_num(char *p, unsigned long v)
{
    char  tmp[24];
    int   i = 0;

    do {
        tmp[i++] = (char) ('0' + v % 10);
        v /= 10;
    } while (v);

    while (i) {
        *p++ = tmp[--i];
    }

    return p;
}


static void
hm_report(int signo __attribute__((unused)))
{
    char   line[96], path[4100], *p;
    long   cur, peak;
    int    fd, saved;
    size_t n;

    saved = errno;

    cur = hm_cur;
    peak = hm_peak;
    hm_peak = cur;
    hm_seq++;

    n = strlen(hm_path);
    memcpy(path, hm_path, n);
    p = path + n;
    *p++ = '.';
    p = hm_num(p, (unsigned long) getpid());
    *p = '\0';

    p = hm_num(line, hm_seq);
    *p++ = ' ';
    p = hm_num(p, cur > 0 ? (unsigned long) cur : 0);
    *p++ = ' ';
    p = hm_num(p, peak > 0 ? (unsigned long) peak : 0);
    *p++ = '\n';

    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        if (write(fd, line, p - line) < 0) {
            /* nothing to do about it in a signal handler */
        }
        close(fd);
    }

    errno = saved;
}


/*
 * For a program that links this file in instead of preloading it
 * (bench/fpbench.c): the bytes in use and the peak since the last call,
 * which restarts the peak from the bytes in use.
 */
void
heapmeter_window(long *cur, long *peak)
{
    *cur = hm_cur;
    *peak = hm_peak;
    hm_peak = hm_cur;
}


__attribute__((constructor))
static void
hm_init(void)
{
    const char        *out;
    struct sigaction   sa;

    out = getenv("HEAPMETER_OUT");
    if (out == NULL || strlen(out) >= sizeof(hm_path)) {
        return;
    }

    strcpy(hm_path, out);

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = hm_report;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGRTMIN + 4, &sa, NULL);
}
