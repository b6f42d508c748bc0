/*
 * idempotency-approve: a person's yes to one proposal of idempotency_confirm.
 *
 *   idempotency-approve --key FILE [--kid ID] [--sub NAME] [--ttl SECONDS]
 *                       [--yes] [ANSWER.json | -]
 *   idempotency-approve --endpoint URL [--header 'Name: value']...
 *                       [--sub NAME] [--ttl SECONDS] [--yes] [ANSWER.json | -]
 *   idempotency-approve --keygen ed25519 DIR
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

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <openssl/pem.h>

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
    long         ttl;
    int          yes;
} approve_opts_t;


static int
usage(void)
{
    fprintf(stderr,
        "usage: idempotency-approve --key FILE [--kid ID] [--sub NAME] "
        "[--ttl SECONDS] [--yes] [ANSWER.json | -]\n"
        "       idempotency-approve --endpoint URL [--header 'Name: value']... "
        "[--sub NAME] [--ttl SECONDS] [--yes] [ANSWER.json | -]\n"
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


/* the answer's proposal, validated enough to sign what it names */
static cJSON *
read_proposal(const char *path, cJSON **doc)
{
    FILE         *f;
    char         *text;
    size_t        len;
    cJSON        *p;
    const char   *fp, *idk;

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

    *doc = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);

    p = cJSON_GetObjectItemCaseSensitive(*doc, "proposal");
    fp = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p,
                                                               "fingerprint"));
    idk = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p,
                                                        "idempotency_key"));

    if (fp == NULL || strlen(fp) != 64 || strspn(fp, "0123456789abcdef") != 64
        || idk == NULL || idk[0] == '\0')
    {
        fprintf(stderr, "idempotency-approve: the input is not a 428 "
                "confirmation-required answer with a proposal\n");
        return NULL;
    }

    return p;
}


static const char *
member(const cJSON *o, const char *name)
{
    const char  *s;

    s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, name));

    return s ? s : "";
}


static int
stderr_write(idem_sink_t *sink, const char *p, size_t n)
{
    return fwrite(p, 1, n, stderr) == n ? 0 : -1;
}


/*
 * What the person approves, on stderr: stdout carries only the token.
 * Values are printed as RFC 8785 JSON, as the fingerprint reads them:
 * strings quoted, so that control bytes in a shown value cannot rewrite
 * the terminal's lines, and numbers exactly (cJSON's printer would show
 * 0.30000000000000004 as 0.3).
 */
static void
show_proposal(const cJSON *p)
{
    idem_sink_t   err;
    const cJSON  *show, *m;

    fprintf(stderr, "Operation to approve\n");
    fprintf(stderr, "  operation id:    %s\n", member(p, "operation_id"));
    fprintf(stderr, "  idempotency key: %s\n", member(p, "idempotency_key"));
    fprintf(stderr, "  request:         %s %s%s%s\n", member(p, "method"),
            member(p, "route"), member(p, "query")[0] ? "?" : "",
            member(p, "query"));
    fprintf(stderr, "  fingerprint:     %s\n", member(p, "fingerprint"));

    show = cJSON_GetObjectItemCaseSensitive(p, "show");

    if (cJSON_IsObject(show) && show->child) {
        fprintf(stderr, "  values:\n");

        err.write = stderr_write;
        err.data = NULL;

        cJSON_ArrayForEach(m, show) {
            fprintf(stderr, "    %s = ", m->string);

            if (idem_json_canonical(m, &err) != 0) {
                fprintf(stderr, "?");
            }

            fprintf(stderr, "\n");
        }
    }

    fprintf(stderr, "  proposal expires: %s\n", member(p, "expires_at"));
}


/* 1 on yes; the question goes to the terminal, never to stdin */
static int
ask(void)
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

    fprintf(tty, "Approve this operation? [y/N] ");
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
    cJSON_AddNumberToObject(a, "expires_in", (double) o->ttl);
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
    cJSON  *doc, *p;

    doc = NULL;
    p = read_proposal(o->input, &doc);

    if (p == NULL) {
        cJSON_Delete(doc);
        return 2;
    }

    show_proposal(p);

    if (!o->yes && !ask()) {
        fprintf(stderr, "idempotency-approve: not approved\n");
        cJSON_Delete(doc);
        return 1;
    }

    rc = post_approval(o, p);
    cJSON_Delete(doc);

    return rc;
}


static int
approve(const approve_opts_t *o)
{
    int              rc;
    char            *payload, *tok;
    cJSON           *doc, *p;
    int64_t          now, exp, until;
    idem_jws_key_t   key;

    doc = NULL;
    p = read_proposal(o->input, &doc);

    if (p == NULL || load_signing_key(o->key, o->kid, &key) != 0) {
        cJSON_Delete(doc);
        return 2;
    }

    show_proposal(p);

    if (!o->yes && !ask()) {
        fprintf(stderr, "idempotency-approve: not approved\n");
        idem_jws_key_free(&key);
        cJSON_Delete(doc);
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


int
main(int argc, char **argv)
{
    int             i;
    char           *end;
    approve_opts_t  o;

    memset(&o, 0, sizeof(o));
    o.ttl = APPROVE_TTL;
    o.sub = getenv("USER");

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--keygen") == 0) {
            if (i == 1 && argc == 4) {
                break;
            }

            return usage();
        }

        if (strcmp(argv[i], "--yes") == 0) {
            o.yes = 1;

        } else if (i + 1 < argc && strcmp(argv[i], "--key") == 0) {
            o.key = argv[++i];

        } else if (i + 1 < argc && strcmp(argv[i], "--endpoint") == 0) {
            o.endpoint = argv[++i];

        } else if (i + 1 < argc && strcmp(argv[i], "--header") == 0) {
            if (strchr(argv[i + 1], ':') == NULL) {
                return usage();
            }
            o.headers = curl_slist_append(o.headers, argv[++i]);

        } else if (i + 1 < argc && strcmp(argv[i], "--kid") == 0) {
            o.kid = argv[++i];

        } else if (i + 1 < argc && strcmp(argv[i], "--sub") == 0) {
            o.sub = argv[++i];

        } else if (i + 1 < argc && strcmp(argv[i], "--ttl") == 0) {
            o.ttl = strtol(argv[++i], &end, 10);
            if (*end || o.ttl <= 0) {
                return usage();
            }

        } else if (argv[i][0] != '-' || strcmp(argv[i], "-") == 0) {
            if (o.input) {
                return usage();
            }
            o.input = argv[i];

        } else {
            return usage();
        }
    }

    if (i < argc) {
        return strcmp(argv[i + 1], "ed25519") == 0 ? keygen(argv[i + 2])
                                                   : usage();
    }

    if ((o.key == NULL) == (o.endpoint == NULL)
        || o.sub == NULL || o.sub[0] == '\0')
    {
        fprintf(stderr, "idempotency-approve: --key or --endpoint is needed "
                "(one of them), and --sub (or $USER) names the approver\n");
        return usage();
    }

    return o.endpoint ? approve_recorded(&o) : approve(&o);
}
