/*
 * idempotency-approve: a person's yes to one proposal of idempotency_confirm.
 *
 *   idempotency-approve --key FILE [--kid ID] [--sub NAME] [--ttl SECONDS]
 *                       (--status URL | --trust-file) [--yes]
 *                       [--op ID | ANSWER.json | -]
 *   idempotency-approve --endpoint URL [--header 'Name: value']...
 *                       [--sub NAME] [--ttl SECONDS] [--decline]
 *                       (--status URL | --trust-file) [--yes]
 *                       [--op ID | ANSWER.json | -]
 *   idempotency-approve --keygen ed25519 DIR
 *
 * What the person is shown is the proposal the gateway stored when it
 * answered 428 (--status: the idempotency_status location, asked by
 * operation id), never one the requester hands over: a file whose
 * proposal differs from the gateway's is refused, with the difference.
 * --trust-file shows the file's (an offline signer that checked it some
 * other way).  Every value printed is escaped for the terminal: control
 * characters, DEL and bytes that are not UTF-8 as \xNN.
 *
 * Reads the 428 confirmation-required answer (a file, or stdin), shows its
 * proposal in plain text on stderr, asks on the terminal (not on stdin,
 * which may be the answer itself), and prints the signed approval, a
 * compact JWS for the Idempotency-Confirmation header, on stdout.  The
 * key file is an Ed25519 private key PEM or an HS256 secret, told apart
 * by the PEM armour.  The token is signed with idem_jws.c, the code the
 * module verifies with; docs/confirmation.md describes both.  With
 * --endpoint it signs nothing: it posts the recorded approval to an
 * idempotency_approve location (its --header lines carry the operator's
 * credentials) and prints that endpoint's answer.
 *
 * Exit: 0 approved (token printed), 1 declined, 2 usage or input error.
 */

#define _GNU_SOURCE           /* asprintf, open_memstream */

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <openssl/pem.h>

#include "idem_html.h"
#include "idem_json.h"
#include "idem_jws.h"


#define APPROVE_INPUT_MAX  (4 * 1024 * 1024)
#define APPROVE_TTL        300


typedef struct {
    const char         *key;
    const char         *endpoint;
    struct curl_slist  *headers;
    const char  *kid;
    const char  *sub;
    const char  *input;
    const char  *status;       /* the gateway's status URL */
    const char  *op;
    long         ttl;
    int          yes;
    int          trust_file;
    int          decline;
} approve_opts_t;


static int
usage(void)
{
    fprintf(stderr,
        "usage: idempotency-approve --key FILE [--kid ID] [--sub NAME] "
        "[--ttl SECONDS]\n"
        "           (--status URL | --trust-file) [--yes] "
        "[--op ID | ANSWER.json | -]\n"
        "       idempotency-approve --endpoint URL [--header 'Name: value']... "
        "[--sub NAME]\n"
        "           [--ttl SECONDS] [--decline] (--status URL | --trust-file) "
        "[--yes]\n"
        "           [--op ID | ANSWER.json | -]\n"
        "       idempotency-approve --keygen ed25519 DIR\n");
    return 2;
}


static char *
read_all(FILE *f, size_t *len)
{
    char    *buf;
    size_t   n;

    buf = malloc(APPROVE_INPUT_MAX + 1);
    if (buf == NULL) {
        return NULL;
    }

    n = fread(buf, 1, APPROVE_INPUT_MAX + 1, f);

    if (ferror(f) || n > APPROVE_INPUT_MAX) {
        free(buf);
        return NULL;
    }

    buf[n] = '\0';
    *len = n;

    return buf;
}


/* a JSON document: a file, or stdin */
static cJSON *
read_doc(const char *path)
{
    FILE    *f;
    char    *text;
    size_t   len;
    cJSON   *doc;

    f = (path == NULL || strcmp(path, "-") == 0) ? stdin : fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "idempotency-approve: %s: %s\n", path,
                strerror(errno));
        return NULL;
    }

    text = read_all(f, &len);
    if (f != stdin) {
        fclose(f);
    }

    doc = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);

    return doc;
}


/* the proposal of a 428 answer or of the gateway's status, enough to sign */
static cJSON *
proposal_of(cJSON *doc, const char *what)
{
    cJSON       *p;
    const char  *fp, *idk, *op;

    p = cJSON_GetObjectItemCaseSensitive(doc, "proposal");
    fp = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p,
                                                               "fingerprint"));
    idk = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p,
                                                        "idempotency_key"));
    op = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p,
                                                        "operation_id"));

    if (fp == NULL || strlen(fp) != 64 || strspn(fp, "0123456789abcdef") != 64
        || idk == NULL || idk[0] == '\0' || op == NULL || strlen(op) != 32
        || strspn(op, "0123456789abcdef") != 32)
    {
        fprintf(stderr, "idempotency-approve: %s is not a 428 "
                "confirmation-required answer with a proposal\n", what);
        return NULL;
    }

    return p;
}


static size_t collect(char *data, size_t size, size_t n, void *arg);


static const char *
member(const cJSON *o, const char *name)
{
    const char  *s;

    s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, name));

    return s ? s : "";
}


/* s on stderr, every byte a terminal could act on shown as an escape */
static void
term(const char *s, size_t len)
{
    char  *buf, *e;

    buf = malloc(idem_term_len(s, len) + 1);
    if (buf == NULL) {
        return;
    }

    e = idem_term_put(buf, s, len);
    fwrite(buf, 1, e - buf, stderr);
    free(buf);
}


static void
term_str(const char *s)
{
    term(s, strlen(s));
}


/* a shown value as RFC 8785 JSON (as the fingerprint reads it), escaped */
static void
term_value(const cJSON *v)
{
    idem_sink_t      sink;
    idem_sink_buf_t  b;

    memset(&b, 0, sizeof(b));
    sink.write = idem_sink_buf_write;
    sink.data = &b;

    if (idem_json_canonical(v, &sink) != 0) {
        fprintf(stderr, "?");

    } else {
        term(b.data, b.len);
    }

    free(b.data);
}


static void
show_line(const char *label, const cJSON *p, const char *name)
{
    fprintf(stderr, "  %-17s", label);
    term_str(member(p, name));
    fprintf(stderr, "\n");
}


/*
 * What the person approves, on stderr: stdout carries only the token.
 * Every value goes through term(): a route or a value holding ESC [2K or
 * a bidi override cannot hide or rewrite what the person reads.  Shown
 * values are printed as RFC 8785 JSON, as the fingerprint reads them
 * (cJSON's printer would show 0.30000000000000004 as 0.3).
 */
static void
show_proposal(const cJSON *p)
{
    const char   *label;
    const cJSON  *show, *labels, *m;

    fprintf(stderr, "Operation to %s\n", "approve");

    if (member(p, "describe")[0]) {
        show_line("what:", p, "describe");
    }

    show_line("operation id:", p, "operation_id");
    show_line("idempotency key:", p, "idempotency_key");
    fprintf(stderr, "  request:         ");
    term_str(member(p, "method"));
    fprintf(stderr, " ");
    term_str(member(p, "route"));
    fprintf(stderr, "%s", member(p, "query")[0] ? "?" : "");
    term_str(member(p, "query"));
    fprintf(stderr, "\n");

    if (member(p, "host")[0]) {
        show_line("host:", p, "host");
    }

    show_line("fingerprint:", p, "fingerprint");

    show = cJSON_GetObjectItemCaseSensitive(p, "show");
    labels = cJSON_GetObjectItemCaseSensitive(p, "labels");

    if (cJSON_IsObject(show) && show->child) {
        fprintf(stderr, "  values:\n");

        cJSON_ArrayForEach(m, show) {
            label = cJSON_GetStringValue(
                        cJSON_GetObjectItemCaseSensitive(labels, m->string));
            fprintf(stderr, "    ");
            term_str(label ? label : m->string);
            fprintf(stderr, " = ");
            term_value(m);
            fprintf(stderr, "\n");
        }
    }

    show_line("proposal expires:", p, "expires_at");
}


/* GET url, the answer's body (malloc'ed) and status; NULL on failure */
static char *
http_get(const approve_opts_t *o, const char *url, long *status)
{
    CURL        *c;
    FILE        *mem;
    char        *body;
    size_t       len;
    CURLcode     crc;

    body = NULL;
    len = 0;
    mem = open_memstream(&body, &len);
    c = curl_easy_init();

    if (mem == NULL || c == NULL) {
        return NULL;
    }

    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, o->headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, mem);

    crc = curl_easy_perform(c);
    *status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(c);
    fclose(mem);

    if (crc != CURLE_OK) {
        fprintf(stderr, "idempotency-approve: %s: %s\n", url,
                curl_easy_strerror(crc));
        free(body);
        return NULL;
    }

    return body;
}


/* the gateway's document for operation op: {"state", "proposal", ...} */
static cJSON *
fetch_proposal(const approve_opts_t *o, const char *op)
{
    long    status;
    char   *url, *body;
    cJSON  *doc;

    if (asprintf(&url, "%s%sop=%s", o->status,
                 strchr(o->status, '?') ? "&" : "?", op) < 0)
    {
        return NULL;
    }

    body = http_get(o, url, &status);
    doc = (body && status == 200) ? cJSON_Parse(body) : NULL;

    if (body && status != 200) {
        fprintf(stderr, "idempotency-approve: the gateway answered %ld for "
                "operation %s: ", status, op);
        term_str(body);
        fprintf(stderr, "\n");
    }

    free(body);
    free(url);

    return doc;
}


static void
show_diff(const char *name, const cJSON *file, const cJSON *gw)
{
    char  *a, *b;

    a = file ? cJSON_PrintUnformatted(file) : NULL;
    b = gw ? cJSON_PrintUnformatted(gw) : NULL;

    fprintf(stderr, "  ");
    term_str(name);
    fprintf(stderr, ": the file says ");
    term_str(a ? a : "nothing");
    fprintf(stderr, ", the gateway stored ");
    term_str(b ? b : "nothing");
    fprintf(stderr, "\n");

    cJSON_free(a);
    cJSON_free(b);
}


/* 0 when the file's proposal is the gateway's, member for member */
static int
same_proposal(const cJSON *file, const cJSON *gw)
{
    int           diff;
    const cJSON  *m, *other;

    diff = 0;

    cJSON_ArrayForEach(m, gw) {
        other = cJSON_GetObjectItemCaseSensitive(file, m->string);

        if (!cJSON_Compare(m, other, 1)) {
            show_diff(m->string, other, m);
            diff = 1;
        }
    }

    cJSON_ArrayForEach(m, file) {
        if (cJSON_GetObjectItemCaseSensitive(gw, m->string) == NULL) {
            show_diff(m->string, m, NULL);
            diff = 1;
        }
    }

    return diff;
}


/*
 * The proposal to show: the gateway's (a file given must agree with it),
 * or with --trust-file the file's.  *doc and *gdoc are the caller's to
 * free.
 */
static cJSON *
load(const approve_opts_t *o, cJSON **doc, cJSON **gdoc)
{
    cJSON       *fp, *gp;
    const char  *op, *state;

    *doc = *gdoc = NULL;
    fp = NULL;
    op = o->op;

    if (o->op == NULL) {
        *doc = read_doc(o->input);
        fp = proposal_of(*doc, "the input");

        if (fp == NULL || o->trust_file) {
            return fp;
        }

        op = member(fp, "operation_id");
    }

    *gdoc = fetch_proposal(o, op);
    gp = *gdoc ? proposal_of(*gdoc, "the gateway's answer") : NULL;

    if (gp == NULL) {
        return NULL;
    }

    if (fp && same_proposal(fp, gp)) {
        fprintf(stderr, "idempotency-approve: refused: the proposal given "
                "is not the one the gateway stored (differences above); "
                "nothing was approved\n");
        return NULL;
    }

    state = member(*gdoc, "state");
    fprintf(stderr, "  state now:       ");
    term_str(state);
    fprintf(stderr, "\n");

    return gp;
}


/* 1 on yes; the question goes to the terminal, never to stdin */
static int
ask(const char *what)
{
    FILE  *tty;
    char   line[64];
    int    yes;

    tty = fopen("/dev/tty", "r+");
    if (tty == NULL) {
        fprintf(stderr, "idempotency-approve: no terminal to ask on; "
                "use --yes to approve from a script\n");
        return 0;
    }

    fprintf(tty, "%s this operation? [y/N] ", what);
    fflush(tty);

    yes = fgets(line, sizeof(line), tty) != NULL
          && (strcmp(line, "y\n") == 0 || strcmp(line, "yes\n") == 0
              || strcmp(line, "Y\n") == 0);

    fclose(tty);

    return yes;
}


static int
load_signing_key(const char *path, const char *kid, idem_jws_key_t *key)
{
    FILE  *f;
    char   head[16], err[512];
    size_t n;

    f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "idempotency-approve: %s: %s\n", path,
                strerror(errno));
        return -1;
    }

    n = fread(head, 1, sizeof(head), f);
    fclose(f);

    if (idem_jws_key_load(key, (n >= 10 && memcmp(head, "-----BEGIN", 10) == 0)
                               ? IDEM_JWS_ED25519 : IDEM_JWS_HS256,
                          path, kid, 1, err, sizeof(err)) != 0)
    {
        fprintf(stderr, "idempotency-approve: --key: %s\n", err);
        return -1;
    }

    return 0;
}


static size_t
collect(char *data, size_t size, size_t n, void *arg)
{
    FILE  *out = arg;

    return fwrite(data, size, n, out);
}


/* the recorded approval, POSTed to an idempotency_approve location */
static int
post_approval(const approve_opts_t *o, const cJSON *p)
{
    int                 rc;
    long                status;
    char               *body;
    CURL               *c;
    cJSON              *a;
    CURLcode            crc;
    struct curl_slist  *h;

    a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "operation_id", member(p, "operation_id"));
    cJSON_AddStringToObject(a, "fingerprint", member(p, "fingerprint"));
    cJSON_AddStringToObject(a, "approved_by", o->sub);
    if (o->decline) {
        cJSON_AddStringToObject(a, "decision", "decline");

    } else {
        cJSON_AddNumberToObject(a, "expires_in", (double) o->ttl);
    }
    body = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);

    h = curl_slist_append(o->headers, "Content-Type: application/json");
    c = curl_easy_init();

    if (body == NULL || h == NULL || c == NULL) {
        fprintf(stderr, "idempotency-approve: out of memory\n");
        return 2;
    }

    curl_easy_setopt(c, CURLOPT_URL, o->endpoint);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, stdout);

    crc = curl_easy_perform(c);
    status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    rc = (crc == CURLE_OK && status == 200) ? 0 : 2;

    if (crc != CURLE_OK) {
        fprintf(stderr, "idempotency-approve: %s: %s\n", o->endpoint,
                curl_easy_strerror(crc));

    } else if (rc) {
        fprintf(stderr, "idempotency-approve: %s answered %ld\n",
                o->endpoint, status);
    }

    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    cJSON_free(body);

    return rc;
}


static int
approve_recorded(const approve_opts_t *o)
{
    int     rc;
    cJSON  *doc, *gdoc, *p;

    p = load(o, &doc, &gdoc);

    if (p == NULL) {
        cJSON_Delete(doc);
        cJSON_Delete(gdoc);
        return 2;
    }

    show_proposal(p);

    if (!o->yes && !ask(o->decline ? "Decline" : "Approve")) {
        fprintf(stderr, "idempotency-approve: nothing recorded\n");
        cJSON_Delete(doc);
        cJSON_Delete(gdoc);
        return 1;
    }

    rc = post_approval(o, p);
    cJSON_Delete(doc);
    cJSON_Delete(gdoc);

    return rc;
}


static int
approve(const approve_opts_t *o)
{
    int              rc;
    char            *payload, *tok;
    cJSON           *doc, *gdoc, *p;
    int64_t          now, exp, until;
    idem_jws_key_t   key;

    p = load(o, &doc, &gdoc);

    if (p == NULL || load_signing_key(o->key, o->kid, &key) != 0) {
        cJSON_Delete(doc);
        cJSON_Delete(gdoc);
        return 2;
    }

    show_proposal(p);

    if (!o->yes && !ask("Approve")) {
        fprintf(stderr, "idempotency-approve: not approved\n");
        idem_jws_key_free(&key);
        cJSON_Delete(doc);
        cJSON_Delete(gdoc);
        return 1;
    }

    /* an approval outliving its proposal would approve nothing more */
    now = (int64_t) time(NULL);
    exp = now + o->ttl;
    until = (int64_t) cJSON_GetNumberValue(
                          cJSON_GetObjectItemCaseSensitive(p, "expires"));

    if (until > now && until < exp) {
        exp = until;
    }

    payload = idem_jws_approval(member(p, "idempotency_key"),
                                member(p, "fingerprint"), o->sub, now, exp,
                                NULL);
    tok = payload ? idem_jws_sign(&key, payload, strlen(payload)) : NULL;
    rc = 2;

    if (tok) {
        printf("%s\n", tok);
        rc = 0;
    }

    free(tok);
    cJSON_free(payload);
    idem_jws_key_free(&key);
    cJSON_Delete(doc);
    cJSON_Delete(gdoc);

    return rc;
}


/* DIR/ed25519.key (0600) and DIR/ed25519.pub; existing files are kept */
static int
keygen(const char *dir)
{
    int        fd, ok;
    char       priv[4096], pub[4096];
    FILE      *f;
    EVP_PKEY  *pk;

    snprintf(priv, sizeof(priv), "%s/ed25519.key", dir);
    snprintf(pub, sizeof(pub), "%s/ed25519.pub", dir);

    pk = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    fd = open(priv, O_WRONLY | O_CREAT | O_EXCL, 0600);

    if (pk == NULL || fd < 0) {
        fprintf(stderr, "idempotency-approve: %s: %s\n", priv,
                pk ? strerror(errno) : "key generation failed");
        EVP_PKEY_free(pk);
        return 2;
    }

    f = fdopen(fd, "w");
    ok = f && PEM_write_PrivateKey(f, pk, NULL, NULL, 0, NULL, NULL);
    ok = (f && fclose(f) == 0) && ok;

    fd = ok ? open(pub, O_WRONLY | O_CREAT | O_EXCL, 0644) : -1;
    f = fd >= 0 ? fdopen(fd, "w") : NULL;
    ok = f && PEM_write_PUBKEY(f, pk);
    ok = (f && fclose(f) == 0) && ok;

    EVP_PKEY_free(pk);

    if (!ok) {
        fprintf(stderr, "idempotency-approve: cannot write the key pair in "
                "%s: %s\n", dir, strerror(errno));
        return 2;
    }

    printf("%s\n%s\n", priv, pub);

    return 0;
}


/* GNU-style options, anywhere on the line; 0, or usage()'s code */
static int
parse_opts(int argc, char **argv, approve_opts_t *o)
{
    int    c;
    char  *end;

    static const struct option  opts[] = {
        { "yes", no_argument, NULL, 'y' },
        { "key", required_argument, NULL, 'k' },
        { "endpoint", required_argument, NULL, 'e' },
        { "header", required_argument, NULL, 'H' },
        { "kid", required_argument, NULL, 'i' },
        { "sub", required_argument, NULL, 's' },
        { "ttl", required_argument, NULL, 't' },
        { "status", required_argument, NULL, 'S' },
        { "op", required_argument, NULL, 'o' },
        { "trust-file", no_argument, NULL, 'T' },
        { "decline", no_argument, NULL, 'd' },
        { NULL, 0, NULL, 0 }
    };

    opterr = 1;

    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'y': o->yes = 1; break;
        case 'k': o->key = optarg; break;
        case 'e': o->endpoint = optarg; break;
        case 'i': o->kid = optarg; break;
        case 's': o->sub = optarg; break;
        case 'S': o->status = optarg; break;
        case 'o': o->op = optarg; break;
        case 'T': o->trust_file = 1; break;
        case 'd': o->decline = 1; break;
        case 'H':
            if (strchr(optarg, ':') == NULL) {
                return usage();
            }
            o->headers = curl_slist_append(o->headers, optarg);
            break;
        case 't':
            o->ttl = strtol(optarg, &end, 10);
            if (*end || o->ttl <= 0) {
                return usage();
            }
            break;
        default:
            return usage();
        }
    }

    if (optind < argc) {
        o->input = argv[optind++];
    }

    return optind < argc ? usage() : 0;
}


static int
check_opts(const approve_opts_t *o)
{
    const char  *why;

    why = ((o->key == NULL) == (o->endpoint == NULL))
          ? "--key or --endpoint is needed (one of them)"
          : (o->sub == NULL || o->sub[0] == '\0')
          ? "--sub (or $USER) names the approver"
          : (o->status == NULL && !o->trust_file)
          ? "--status URL (the gateway's idempotency_status location, "
            "where the proposal is read) is needed, or --trust-file"
          : (o->status && o->trust_file)
          ? "--status and --trust-file exclude each other"
          : (o->op && (o->input || o->status == NULL))
          ? "--op ID reads the proposal from --status, without a file"
          : (o->op && (strlen(o->op) != 32
                       || strspn(o->op, "0123456789abcdef") != 32))
          ? "--op is an operation id: 32 lowercase hex"
          : (o->decline && o->endpoint == NULL)
          ? "--decline records a decline at --endpoint"
          : NULL;

    if (why) {
        fprintf(stderr, "idempotency-approve: %s\n", why);
        return usage();
    }

    return 0;
}


int
main(int argc, char **argv)
{
    int             rc;
    approve_opts_t  o;

    if (argc >= 2 && strcmp(argv[1], "--keygen") == 0) {
        return (argc == 4 && strcmp(argv[2], "ed25519") == 0)
               ? keygen(argv[3]) : usage();
    }

    memset(&o, 0, sizeof(o));
    o.ttl = APPROVE_TTL;
    o.sub = getenv("USER");

    rc = parse_opts(argc, argv, &o);

    if (rc == 0) {
        rc = check_opts(&o);
    }

    if (rc) {
        return rc;
    }

    return o.endpoint ? approve_recorded(&o) : approve(&o);
}
