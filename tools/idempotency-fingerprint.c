/*
 * idempotency-fingerprint: computes the request fingerprint of
 * docs/fingerprint.md offline, with the same code the module runs.
 *
 *   idempotency-fingerprint --method POST --route /orders \
 *       [--query 'a=1'] [--scope alice] [--header 'x-tenant: t1']... \
 *       [--content-type application/json] [--exclude /json/pointer]...
 *       [--body-file F] [--preimage]
 *
 * Prints the 64-hex fingerprint (or, with --preimage, the exact bytes
 * that are hashed) on stdout and the body form on stderr.  The body is
 * read from --body-file, or from stdin when none is given.
 */

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem_fingerprint.h"


#define FP_MAX_HEADERS  64


static void
usage(FILE *f)
{
    fputs("usage: idempotency-fingerprint --method M --route R [--query Q]\n"
          "         [--scope S] [--header NAME:VALUE]... [--content-type T]\n"
          "         [--exclude POINTER]... [--body-file F] [--preimage]\n"
          "\n"
          "  --method M         request method, e.g. POST\n"
          "  --route R          normalized URI ($uri), e.g. /orders\n"
          "  --query Q          raw query string ($args), default empty\n"
          "  --scope S          evaluated idempotency_scope, default empty\n"
          "  --header N:V       a header listed in\n"
          "                     idempotency_fingerprint_headers; the name is\n"
          "                     lowercased, blanks around the value dropped\n"
          "  --content-type T   the request Content-Type; JSON types\n"
          "                     (application/json, */*+json) are\n"
          "                     canonicalized, anything else hashed raw\n"
          "  --exclude POINTER  a JSON pointer of\n"
          "                     idempotency_fingerprint_exclude: that member\n"
          "                     of a JSON body does not count (repeatable)\n"
          "  --body-file F      the body (default: read stdin; - is stdin)\n"
          "  --preimage         print the canonical preimage instead of the\n"
          "                     fingerprint\n", f);
}


static int
fp_stdout_write(idem_sink_t *sink, const char *p, size_t n)
{
    return (fwrite(p, 1, n, stdout) == n) ? 0 : -1;
}


static char *
read_all(FILE *f, size_t *len)
{
    char    *buf, *p;
    size_t   size, n;

    size = 65536;
    *len = 0;
    buf = malloc(size);

    while (buf != NULL) {
        n = fread(buf + *len, 1, size - *len, f);
        *len += n;

        if (n == 0) {
            if (ferror(f)) {
                free(buf);
                return NULL;
            }
            return buf;
        }

        if (*len == size) {
            size *= 2;
            p = realloc(buf, size);
            if (p == NULL) {
                free(buf);
            }
            buf = p;
        }
    }

    return NULL;
}


static char *
read_body(const char *path, size_t *len)
{
    FILE  *f;
    char  *body;

    if (path == NULL || strcmp(path, "-") == 0) {
        return read_all(stdin, len);
    }

    f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return NULL;
    }

    body = read_all(f, len);
    fclose(f);

    return body;
}


/* "Name: value" -> lowercased name, value without surrounding blanks */
static int
add_header(idem_fp_input_t *in, idem_str_t *names, idem_str_t *values,
    char *arg)
{
    char    *colon, *v, *end, *p;
    size_t   i;

    colon = strchr(arg, ':');
    if (colon == NULL || colon == arg) {
        fprintf(stderr, "--header wants NAME:VALUE, got \"%s\"\n", arg);
        return -1;
    }

    if (in->nheaders == FP_MAX_HEADERS) {
        fprintf(stderr, "more than %d headers\n", FP_MAX_HEADERS);
        return -1;
    }

    for (p = arg; p < colon; p++) {
        if (*p >= 'A' && *p <= 'Z') {
            *p += 'a' - 'A';
        }
    }

    v = colon + 1;
    end = v + strlen(v);

    while (*v == ' ' || *v == '\t') {
        v++;
    }

    while (end > v && (end[-1] == ' ' || end[-1] == '\t')) {
        end--;
    }

    for (i = 0; i < in->nheaders; i++) {
        if (names[i].len == (size_t) (colon - arg)
            && memcmp(names[i].data, arg, names[i].len) == 0)
        {
            fprintf(stderr, "header \"%.*s\" given twice\n",
                    (int) (colon - arg), arg);
            return -1;
        }
    }

    names[in->nheaders].data = arg;
    names[in->nheaders].len = colon - arg;
    values[in->nheaders].data = v;
    values[in->nheaders].len = end - v;
    in->nheaders++;

    return 0;
}


static void
set_str(idem_str_t *s, const char *v)
{
    s->data = v;
    s->len = strlen(v);
}


typedef struct {
    idem_fp_input_t   in;
    idem_ptr_set_t   *exclude;
    idem_str_t        names[FP_MAX_HEADERS];
    idem_str_t        values[FP_MAX_HEADERS];
    const char       *body_file;
    const char       *ct;
    int               preimage;
} fp_args_t;


/* the same pointers, refused for the same reasons, as nginx -t */
static int
add_exclude(fp_args_t *a, const char *ptr)
{
    idem_ptr_rc_t  rc;

    if (a->exclude == NULL) {
        a->exclude = idem_ptr_set_create();
        if (a->exclude == NULL) {
            fputs("out of memory\n", stderr);
            return -1;
        }

        a->in.exclude = a->exclude;
    }

    rc = idem_ptr_set_add(a->exclude, ptr, strlen(ptr));
    if (rc != IDEM_PTR_OK) {
        fprintf(stderr, "--exclude \"%s\": %s\n", ptr, idem_ptr_strerror(rc));
        return -1;
    }

    return 0;
}


/* 0 to go on, -1 when --help was answered, else the exit status */
static int
parse_args(int argc, char **argv, fp_args_t *a)
{
    static const struct option  opts[] = {
        { "method",       required_argument, NULL, 'm' },
        { "route",        required_argument, NULL, 'r' },
        { "query",        required_argument, NULL, 'q' },
        { "scope",        required_argument, NULL, 's' },
        { "header",       required_argument, NULL, 'H' },
        { "content-type", required_argument, NULL, 'c' },
        { "exclude",      required_argument, NULL, 'x' },
        { "body-file",    required_argument, NULL, 'b' },
        { "preimage",     no_argument,       NULL, 'p' },
        { "help",         no_argument,       NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };

    int  c;

    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': set_str(&a->in.method, optarg); break;
        case 'r': set_str(&a->in.route, optarg); break;
        case 'q': set_str(&a->in.query, optarg); break;
        case 's': set_str(&a->in.scope, optarg); break;
        case 'c': a->ct = optarg; break;
        case 'b': a->body_file = optarg; break;
        case 'p': a->preimage = 1; break;

        case 'H':
            if (add_header(&a->in, a->names, a->values, optarg) != 0) {
                return 2;
            }
            break;

        case 'x':
            if (add_exclude(a, optarg) != 0) {
                return 2;
            }
            break;

        case 'h':
            usage(stdout);
            return -1;

        default:
            usage(stderr);
            return 2;
        }
    }

    if (optind != argc || a->in.method.data == NULL
        || a->in.route.data == NULL)
    {
        fputs("--method and --route are required\n", stderr);
        usage(stderr);
        return 2;
    }

    return 0;
}


/* the fingerprint, or with --preimage the bytes hashed, on stdout */
static int
fingerprint(fp_args_t *a, idem_fp_result_t *res)
{
    idem_sink_t  sink;
    int          rc;

    if (a->preimage) {
        sink.write = fp_stdout_write;
        sink.data = NULL;
        rc = idem_fingerprint_preimage(&a->in, &sink, res);
        return (fflush(stdout) != 0) ? -1 : rc;
    }

    rc = idem_fingerprint(&a->in, res);
    if (rc == 0) {
        printf("%s\n", res->hex);
    }

    return rc;
}


int
main(int argc, char **argv)
{
    fp_args_t          a;
    idem_fp_result_t   res;
    char              *body;
    int                rc;

    memset(&a, 0, sizeof(fp_args_t));
    a.in.header_names = a.names;
    a.in.header_values = a.values;
    set_str(&a.in.query, "");
    set_str(&a.in.scope, "");

    rc = parse_args(argc, argv, &a);
    if (rc != 0) {
        idem_ptr_set_free(a.exclude);
        return (rc < 0) ? 0 : rc;
    }

    body = read_body(a.body_file, &a.in.body_len);
    if (body == NULL) {
        fputs("cannot read the body\n", stderr);
        idem_ptr_set_free(a.exclude);
        return 1;
    }

    a.in.body = body;
    a.in.body_json = (a.ct != NULL
                      && idem_media_type_is_json(a.ct, strlen(a.ct)));

    rc = fingerprint(&a, &res);
    free(body);
    idem_ptr_set_free(a.exclude);

    if (rc != 0) {
        fputs("fingerprint failed\n", stderr);
        return 1;
    }

    if (res.body_form == IDEM_BODY_RAW_INVALID_JSON) {
        fprintf(stderr, "body: %s (%s)\n", idem_body_form_name(res.body_form),
                idem_jcs_strerror(res.json_rc));
    } else {
        fprintf(stderr, "body: %s\n", idem_body_form_name(res.body_form));
    }

    return 0;
}
