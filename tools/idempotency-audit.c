/*
 * idempotency-audit: reads the audit stream of idempotency_audit
 * (docs/audit.md) with the same code that wrote it (idem_audit.c).
 *
 *   idempotency-audit COMMAND [ARGS] [--redis ADDR] [--db N] [--user U]
 *       [--password P] [--stream NAME] [--key-file FILE] [--file F]...
 *
 *   verify [--anchor SEQ:HASH]... [--allow-empty] [--partial] [FILE...]
 *       the whole chain; exit 0 printing the head "SEQ HASH", exit 1
 *       naming the first bad entry (or line) and what is wrong with it,
 *       or when there is no entry at all (unless --allow-empty)
 *   show OPERATION-ID | KEY
 *       one operation's entries in order, one line each (a key is looked
 *       up in every scope: the stream does not know scopes)
 *   export [--from SEQ]
 *       every entry (from SEQ on) as a JSON line, with its exact bytes
 *
 * Options go anywhere (GNU style).  With --file (repeatable; verify and
 * export also take the files after the command) the entries are read
 * from files instead of Redis: the audit file device's (idempotency_audit
 * file=), a series of rotated files given oldest first, or an export.
 *
 * ADDR is host:port, host (port 6379), a unix socket path, or
 * unix:PATH, as in idempotency_redis.  The password may also come from
 * the environment, IDEM_REDIS_PASSWORD, to keep it off the command line.
 *
 * Exit: 0 done (verify: intact), 1 verify found a fault or show found
 * nothing, 2 usage, connection or Redis error.
 */

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <hiredis/hiredis.h>

#include "idem_audit.h"
#include "idem_audit_file.h"
#include "idem_jws.h"
#include "idem_record.h"
#include "idem_text.h"


#define AUDIT_BATCH    1000
#define AUDIT_BATCH_TEXT  "1000"
#define AUDIT_ANCHORS  16
#define AUDIT_LINE     (4 * 1024 * 1024)
#define AUDIT_FILES    256


typedef struct {
    uint64_t         seq;
    char             hash[IDEM_AUDIT_HASH_LEN + 1];
} audit_anchor_t;


typedef struct {
    const char      *addr;
    const char      *user;
    const char      *password;
    int              db;
    const char      *stream;
    idem_jws_key_t   key;
    int              has_key;
    redisContext    *rc;

    /* verify */
    audit_anchor_t   anchors[AUDIT_ANCHORS];
    int              nanchors;
    const char      *file;
    const char      *files[AUDIT_FILES];
    int              nfiles;
    int              allow_empty;
    int              partial;

    /* show, export */
    const char      *what;
    uint64_t         from;
} audit_t;


/* one entry as read: its ID and its "h" and "e" (NULL when absent) */
typedef struct {
    const char      *id;
    size_t           id_len;
    const char      *h;
    size_t           h_len;
    const char      *e;
    size_t           e_len;
    const char      *extra;    /* a field other than h and e, or NULL */
} audit_read_t;


typedef int (*audit_each_pt)(audit_t *a, audit_read_t *entry, void *data);


static int
usage(void)
{
    fputs("usage: idempotency-audit COMMAND [ARGS] [OPTIONS]\n"
          "\n"
          "  verify [--anchor SEQ:HASH]... [--allow-empty] [--partial] "
          "[FILE...]\n"
          "                 check the chain; prints the head \"SEQ HASH\"\n"
          "                 (exit 0), or the first bad entry (exit 1); no\n"
          "                 entry at all fails unless --allow-empty\n"
          "  show OP|KEY    one operation's history, in order\n"
          "  export [--from SEQ] [FILE...]\n"
          "                 the entries as JSON lines (from SEQ on)\n"
          "\n"
          "  --redis ADDR   host:port, host, /path/to.sock or unix:/path\n"
          "                 (default 127.0.0.1:6379)\n"
          "  --stream NAME  idempotency_audit_stream (default idem:audit)\n"
          "  --file F       read F instead of Redis (repeatable, oldest\n"
          "                 first): an audit file (idempotency_audit file=)\n"
          "                 or an export\n"
          "  --partial      the files may start after entry 1 (older ones\n"
          "                 archived): the first entry is taken on trust\n"
          "  --key-file F   idempotency_audit_key: the chain is HMAC-SHA256\n"
          "  IDEM_REDIS_PASSWORD in the environment: the password\n"
          "options may come anywhere on the command line\n",
          stderr);

    return 2;
}


/* ------------------------------------------------------------ Redis */

static int
audit_connect(audit_t *a)
{
    char         host[256];
    const char  *colon;
    int          port;

    if (a->addr[0] == '/' || strncmp(a->addr, "unix:", 5) == 0) {
        a->rc = redisConnectUnix(a->addr[0] == '/' ? a->addr : a->addr + 5);

    } else {
        colon = strrchr(a->addr, ':');
        port = colon ? atoi(colon + 1) : 6379;
        snprintf(host, sizeof(host), "%.*s",
                 (int) (colon ? (size_t) (colon - a->addr) : strlen(a->addr)),
                 a->addr);
        a->rc = redisConnect(host, port);
    }

    if (a->rc == NULL || a->rc->err) {
        fprintf(stderr, "idempotency-audit: cannot connect to %s: %s\n",
                a->addr, a->rc ? a->rc->errstr : "out of memory");
        return -1;
    }

    return 0;
}


/* a command that must not fail: its reply, or NULL with a message */
static redisReply *
audit_command(audit_t *a, int argc, const char **argv)
{
    redisReply  *r;

    r = redisCommandArgv(a->rc, argc, argv, NULL);

    if (r == NULL) {
        fprintf(stderr, "idempotency-audit: %s: %s\n", argv[0],
                a->rc->errstr);
        return NULL;
    }

    if (r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "idempotency-audit: %s: %s\n", argv[0], r->str);
        freeReplyObject(r);
        return NULL;
    }

    return r;
}


static int
audit_login(audit_t *a)
{
    char         db[24];
    const char  *argv[3];
    redisReply  *r;

    if (audit_connect(a) != 0) {
        return -1;
    }

    if (a->password) {
        argv[0] = "AUTH";
        argv[1] = a->user ? a->user : a->password;
        argv[2] = a->password;

        if ((r = audit_command(a, a->user ? 3 : 2, argv)) == NULL) {
            return -1;
        }

        freeReplyObject(r);
    }

    if (a->db) {
        snprintf(db, sizeof(db), "%d", a->db);
        argv[0] = "SELECT";
        argv[1] = db;

        if ((r = audit_command(a, 2, argv)) == NULL) {
            return -1;
        }

        freeReplyObject(r);
    }

    return 0;
}


/* the value of field name of an entry's field list, or NULL */
static redisReply *
audit_field(redisReply *fields, const char *name)
{
    size_t  i;

    for (i = 0; fields->type == REDIS_REPLY_ARRAY && i + 1 < fields->elements;
         i += 2)
    {
        if (fields->element[i]->type == REDIS_REPLY_STRING
            && strcmp(fields->element[i]->str, name) == 0
            && fields->element[i + 1]->type == REDIS_REPLY_STRING)
        {
            return fields->element[i + 1];
        }
    }

    return NULL;
}


/* the name of a field other than "h" and "e", or NULL */
static const char *
audit_extra(redisReply *fields)
{
    size_t  i;

    for (i = 0; fields->type == REDIS_REPLY_ARRAY && i < fields->elements;
         i += 2)
    {
        if (fields->element[i]->type != REDIS_REPLY_STRING) {
            return "?";
        }

        if (strcmp(fields->element[i]->str, "h") != 0
            && strcmp(fields->element[i]->str, "e") != 0)
        {
            return fields->element[i]->str;
        }
    }

    return NULL;
}


/* one XRANGE batch; the ID the next one starts after; -1 on errors */
static int
audit_batch(audit_t *a, char *start, audit_each_pt each, void *data,
    size_t *got)
{
    size_t        i;
    int           rc;
    redisReply   *r, *en, *h, *e;
    audit_read_t  entry;
    const char   *argv[] = { "XRANGE", a->stream, start, "+", "COUNT",
                             AUDIT_BATCH_TEXT };

    if ((r = audit_command(a, 6, argv)) == NULL) {
        return -1;
    }

    rc = 0;
    *got = r->type == REDIS_REPLY_ARRAY ? r->elements : 0;

    for (i = 0; rc == 0 && i < *got; i++) {
        en = r->element[i];

        if (en->type != REDIS_REPLY_ARRAY || en->elements != 2) {
            rc = -1;
            break;
        }

        h = audit_field(en->element[1], "h");
        e = audit_field(en->element[1], "e");
        entry.extra = audit_extra(en->element[1]);

        entry.id = en->element[0]->str;
        entry.id_len = en->element[0]->len;
        entry.h = h ? h->str : NULL;
        entry.h_len = h ? h->len : 0;
        entry.e = e ? e->str : NULL;
        entry.e_len = e ? e->len : 0;

        snprintf(start, 64, "(%.*s", (int) entry.id_len, entry.id);
        rc = each(a, &entry, data);
    }

    freeReplyObject(r);

    return rc;
}


/* every entry from ID "from" on, in order, until each() is not 0 */
static int
audit_scan(audit_t *a, uint64_t from, audit_each_pt each, void *data)
{
    int     rc;
    char    start[64];
    size_t  got;

    snprintf(start, sizeof(start), "%llu-0", (unsigned long long) from);

    do {
        rc = audit_batch(a, start, each, data, &got);
    } while (rc == 0 && got == AUDIT_BATCH);

    return rc;
}


/* ------------------------------------------------------------ verify */

static int
audit_verify_each(audit_t *a, audit_read_t *en, void *data)
{
    idem_audit_verify_t  *v = data;

    return idem_audit_verify_next(v, en->id, en->id_len, en->h, en->h_len,
                                  en->e, en->e_len) == 0 ? 0 : 1;
}


/* the anchors: each entry they name must be there, with that hash */
static int
audit_verify_anchors(audit_t *a, idem_audit_verify_t *v, uint64_t *seqs,
    char (*hashes)[2 * IDEM_AUDIT_PREV_MAX + 1])
{
    int  i;

    for (i = 0; i < a->nanchors; i++) {
        if (a->anchors[i].seq > v->seq) {
            printf("entry %llu: missing: the stream ends at entry %llu, "
                   "the anchor says entry %llu had hash %s\n",
                   (unsigned long long) v->seq + 1,
                   (unsigned long long) v->seq,
                   (unsigned long long) a->anchors[i].seq,
                   a->anchors[i].hash);
            return 1;
        }

        if (seqs[i] == 0 || strcmp(hashes[i], a->anchors[i].hash) != 0) {
            printf("entry %llu: modified: its hash is not the anchored %s: "
                   "the chain was rewritten from there on or before\n",
                   (unsigned long long) a->anchors[i].seq,
                   a->anchors[i].hash);
            return 1;
        }
    }

    return 0;
}


/* what verify keeps of the entries the anchors name, while it reads */
typedef struct {
    idem_audit_verify_t   v;
    uint64_t              seqs[AUDIT_ANCHORS];
    char                  hashes[AUDIT_ANCHORS][2 * IDEM_AUDIT_PREV_MAX + 1];

    /* an export: the entry of the line before (its events follow it) */
    char                  id[48];
    char                  hash[2 * IDEM_AUDIT_PREV_MAX + 1];
    long                  index, events;
} audit_verify_t;


static int
audit_verify_next(audit_t *a, audit_verify_t *vf, audit_read_t *en)
{
    int  i;

    if (en->extra) {
        printf("entry %llu: inserted: a field the encoding does not define: "
               "\"%.64s\"\n", (unsigned long long) (idem_audit_id_seq(
                   en->id, en->id_len) ? idem_audit_id_seq(en->id, en->id_len)
                                       : vf->v.seq + 1), en->extra);
        return 1;
    }

    if (audit_verify_each(a, en, &vf->v) != 0) {
        printf("entry %llu: %s: %s\n", (unsigned long long) vf->v.fault_seq,
               idem_audit_fault_name(vf->v.fault), vf->v.why);
        return 1;
    }

    for (i = 0; i < a->nanchors; i++) {
        if (a->anchors[i].seq == vf->v.seq) {
            vf->seqs[i] = vf->v.seq;
            snprintf(vf->hashes[i], sizeof(vf->hashes[i]), "%s",
                     vf->v.hex);
        }
    }

    return 0;
}


static int
audit_verify_stream_each(audit_t *a, audit_read_t *en, void *data)
{
    return audit_verify_next(a, data, en);
}


/*
 * An export line after the first event of its entry: the same entry (ID,
 * hash), the next event of it; 0 when it is one, 1 after saying why not,
 * -1 when the line begins another entry.
 */
static int
audit_verify_event_line(audit_verify_t *vf, cJSON *o, const char *id,
    const char *h)
{
    long  index;

    index = (long) cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o,
                                                                 "index"));

    if (index <= 1 || strcmp(id, vf->id) != 0) {
        if (vf->index < vf->events) {
            printf("entry %llu: modified: its event %ld is not in the "
                   "export\n", (unsigned long long) vf->v.seq,
                   vf->index + 1);
            return 1;
        }

        return -1;
    }

    if (index != vf->index + 1 || index > vf->events || h == NULL
        || strcmp(h, vf->hash) != 0)
    {
        printf("entry %llu: modified: its event %ld is not the one after "
               "event %ld of this entry\n", (unsigned long long) vf->v.seq,
               index, vf->index);
        return 1;
    }

    vf->index = index;

    return 0;
}


/* a hash as the export writes it: the raw digest of a version-2 entry */
static size_t
audit_export_hash(const char *h, const char *e, long e_len, char *raw)
{
    size_t  i, len;

    len = h ? strlen(h) : 0;

    if (e_len > 0 && e[0] == IDEM_AUDIT_V2 && len == IDEM_AUDIT_HASH_LEN
        && idem_is_hex(h, len))
    {
        for (i = 0; i < IDEM_AUDIT_DIGEST_LEN; i++) {
            raw[i] = (char) ((h[2 * i] <= '9' ? h[2 * i] - '0'
                                              : h[2 * i] - 'a' + 10) << 4
                             | (h[2 * i + 1] <= '9' ? h[2 * i + 1] - '0'
                                                    : h[2 * i + 1] - 'a' + 10));
        }

        return IDEM_AUDIT_DIGEST_LEN;
    }

    memcpy(raw, h ? h : "", len < IDEM_AUDIT_PREV_MAX ? len : 0);

    return len < IDEM_AUDIT_PREV_MAX ? len : IDEM_AUDIT_PREV_MAX + 1;
}


/* an export file: its lines' "id", "hash" and "e" (base64url) */
static int
audit_verify_line(audit_t *a, audit_verify_t *vf, char *line)
{
    int                   rc;
    long                  n;
    cJSON                *o;
    const char           *id, *h, *e64;
    audit_read_t          en;
    unsigned char        *e;
    char                  raw[IDEM_AUDIT_PREV_MAX + 1];
    idem_audit_events_t   ev;

    o = cJSON_Parse(line);
    id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "id"));
    h = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "hash"));
    e64 = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "e"));

    if (id == NULL) {
        cJSON_Delete(o);
        printf("entry %llu: inserted: a line that is not an exported "
               "entry\n", (unsigned long long) vf->v.seq + 1);
        return 1;
    }

    rc = vf->v.count ? audit_verify_event_line(vf, o, id, h) : -1;

    if (rc >= 0) {
        cJSON_Delete(o);
        return rc;
    }

    e = e64 ? malloc(strlen(e64) * 3 / 4 + 1) : NULL;
    n = e ? idem_b64url_decode(e64, strlen(e64), e) : -1;

    en.id = id;
    en.id_len = strlen(id);
    en.h = raw;
    en.h_len = audit_export_hash(h, (char *) e, n, raw);
    en.e = n >= 0 ? (char *) e : NULL;
    en.e_len = n >= 0 ? (size_t) n : 0;
    en.extra = NULL;

    rc = audit_verify_next(a, vf, &en);

    if (rc == 0) {
        snprintf(vf->id, sizeof(vf->id), "%s", id);
        snprintf(vf->hash, sizeof(vf->hash), "%s", h ? h : "");
        vf->index = 1;
        vf->events = idem_audit_events_decode(en.e, en.e_len, &ev) == 0
                     ? (long) ev.n : 1;
    }

    free(e);
    cJSON_Delete(o);

    return rc;
}


/* the lines of the files, in order, until each() is not 0 */
typedef int (*audit_line_pt)(audit_t *a, const char *file,
    unsigned long lineno, char *line, size_t len, void *data);

static int
audit_lines(audit_t *a, audit_line_pt each, void *data)
{
    int            i, rc;
    FILE          *f;
    char          *line;
    size_t         size;
    ssize_t        n;
    unsigned long  lineno;

    line = NULL;
    size = 0;
    rc = 0;

    for (i = 0; rc == 0 && i < a->nfiles; i++) {
        f = strcmp(a->files[i], "-") == 0 ? stdin : fopen(a->files[i], "r");

        if (f == NULL) {
            fprintf(stderr, "idempotency-audit: %s: %s\n", a->files[i],
                    strerror(errno));
            rc = -1;
            break;
        }

        lineno = 0;

        while (rc == 0 && (n = getline(&line, &size, f)) != -1) {
            lineno++;

            if (n > 0 && line[n - 1] == '\n') {
                line[--n] = '\0';
            }

            rc = each(a, a->files[i], lineno, line, (size_t) n, data);
        }

        if (f != stdin) {
            fclose(f);
        }
    }

    free(line);

    return rc;
}


/* an export's lines have "e", the encoding; the device's do not */
static int
audit_is_export(const char *path)
{
    int      yes;
    FILE    *f;
    char    *line;
    size_t   size;
    cJSON   *o;

    if (strcmp(path, "-") == 0 || (f = fopen(path, "r")) == NULL) {
        return 0;
    }

    line = NULL;
    size = 0;
    yes = 0;

    if (getline(&line, &size, f) != -1) {
        o = cJSON_Parse(line);
        yes = cJSON_GetObjectItemCaseSensitive(o, "e") != NULL;
        cJSON_Delete(o);
    }

    free(line);
    fclose(f);

    return yes;
}


/* what verify of audit files keeps while it reads */
typedef struct {
    idem_audit_file_verify_t  v;
    uint64_t                  seqs[AUDIT_ANCHORS];
    char                      hashes[AUDIT_ANCHORS][IDEM_AUDIT_HASH_LEN + 1];
} audit_series_t;


static int
audit_series_line(audit_t *a, const char *file, unsigned long lineno,
    char *line, size_t len, void *data)
{
    int              i;
    audit_series_t  *sv = data;

    if (idem_audit_file_verify_next(&sv->v, line, len) != 0) {
        printf("%s:%lu: %s: %s\n", file, lineno,
               idem_audit_fault_name(sv->v.fault), sv->v.why);
        return 1;
    }

    for (i = 0; i < a->nanchors; i++) {
        if (a->anchors[i].seq == sv->v.seq) {
            sv->seqs[i] = sv->v.seq;
            memcpy(sv->hashes[i], sv->v.hash, IDEM_AUDIT_HASH_LEN + 1);
        }
    }

    return 0;
}


static int
audit_series_anchors(audit_t *a, audit_series_t *sv)
{
    int  i;

    for (i = 0; i < a->nanchors; i++) {
        if (sv->seqs[i] == 0 || strcmp(sv->hashes[i], a->anchors[i].hash)) {
            printf("entry %llu: %s: the files %s\n",
                   (unsigned long long) a->anchors[i].seq,
                   sv->seqs[i] ? "modified" : "missing",
                   sv->seqs[i] ? "have another hash than the anchored one: "
                                 "the chain was rewritten"
                               : "do not hold the anchored entry");
            return 1;
        }
    }

    return 0;
}


/* a series of audit files (idempotency_audit file=), oldest first */
static int
audit_verify_series(audit_t *a)
{
    int              rc;
    audit_series_t  *sv;

    sv = calloc(1, sizeof(audit_series_t));
    if (sv == NULL) {
        return 2;
    }

    idem_audit_file_verify_init(&sv->v, a->has_key ? a->key.secret : NULL,
                                a->has_key ? a->key.secret_len : 0,
                                a->partial);

    rc = audit_lines(a, audit_series_line, sv);

    if (rc == 0 && sv->v.count == 0 && !a->allow_empty) {
        printf("no entries: the files are empty (--allow-empty for a new "
               "deployment)\n");
        rc = 1;
    }

    if (rc == 0) {
        rc = audit_series_anchors(a, sv);
    }

    if (rc == 0) {
        printf("%llu %s\n", (unsigned long long) sv->v.seq, sv->v.hash);
        fprintf(stderr, "%llu entries (%llu to %llu, %llu events) in %d "
                "file%s, the chain is intact\n",
                (unsigned long long) sv->v.count,
                (unsigned long long) sv->v.first,
                (unsigned long long) sv->v.seq,
                (unsigned long long) sv->v.events, a->nfiles,
                a->nfiles == 1 ? "" : "s");
    }

    free(sv);

    return rc < 0 ? 2 : rc;
}


static int
audit_verify_file(audit_t *a, audit_verify_t *vf)
{
    int    rc;
    FILE  *f;
    char  *line;

    f = strcmp(a->file, "-") == 0 ? stdin : fopen(a->file, "r");
    line = malloc(AUDIT_LINE);

    if (f == NULL || line == NULL) {
        fprintf(stderr, "idempotency-audit: %s: %s\n", a->file,
                strerror(errno));
        free(line);
        return -1;
    }

    rc = 0;

    while (rc == 0 && fgets(line, AUDIT_LINE, f)) {
        rc = audit_verify_line(a, vf, line);
    }

    if (f != stdin) {
        fclose(f);
    }

    free(line);

    return rc;
}


static int
audit_verify(audit_t *a)
{
    int              i, rc;
    audit_verify_t  *vf;

    if (a->nfiles && !audit_is_export(a->files[0])) {
        return audit_verify_series(a);
    }

    vf = calloc(1, sizeof(audit_verify_t));
    if (vf == NULL) {
        return 2;
    }

    idem_audit_verify_init(&vf->v, a->has_key ? a->key.secret : NULL,
                           a->has_key ? a->key.secret_len : 0);

    rc = 0;

    if (a->nfiles == 0) {
        rc = audit_scan(a, 0, audit_verify_stream_each, vf);
    }

    for (i = 0; rc == 0 && i < a->nfiles; i++) {
        a->file = a->files[i];
        rc = audit_verify_file(a, vf);
    }

    if (rc == 0 && a->nfiles && vf->index < vf->events) {
        printf("entry %llu: modified: its event %ld is not in the export\n",
               (unsigned long long) vf->v.seq, vf->index + 1);
        rc = 1;
    }

    /* a stream that is not there verifies nothing: a typo, or deleted */
    if (rc == 0 && vf->v.count == 0 && !a->allow_empty) {
        printf("no entries: %s%s%s is empty or does not exist "
               "(--allow-empty for a new deployment)\n",
               a->nfiles ? "the export" : "stream \"",
               a->nfiles ? "" : a->stream, a->nfiles ? "" : "\"");
        rc = 1;
    }

    if (rc == 0) {
        rc = audit_verify_anchors(a, &vf->v, vf->seqs, vf->hashes);
    }

    if (rc == 0) {
        printf("%llu %s\n", (unsigned long long) vf->v.seq, vf->v.hex);
        fprintf(stderr, "%llu entries (%llu events), the chain is intact\n",
                (unsigned long long) vf->v.count,
                (unsigned long long) vf->v.events);
    }

    free(vf);

    return rc < 0 ? 2 : rc;
}


/* ------------------------------------------------------------ show */

/* bytes as they can be read on a terminal: \xNN for the others */
static void
audit_print(const char *name, idem_str_t *s)
{
    size_t  i;

    if (s->len == 0) {
        return;
    }

    printf(" %s=", name);

    for (i = 0; i < s->len; i++) {
        unsigned char  c = (unsigned char) s->data[i];

        if (c > 0x20 && c < 0x7f && c != '\\') {
            putchar(c);
        } else {
            printf("\\x%02x", c);
        }
    }
}


static void
audit_time(int64_t ms, char out[48])
{
    time_t      t;
    struct tm   tm;

    t = (time_t) (ms / 1000);
    gmtime_r(&t, &tm);
    snprintf(out, 48, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, (int) (ms % 1000));
}


/* one line of show when the entry names a->what; 1 if it did */
static int
audit_show_entry(audit_t *a, idem_audit_entry_t *en)
{
    char                 when[48];
    size_t               len;
    idem_audit_entry_t   e;

    e = *en;
    len = strlen(a->what);

    if (!((e.op.len == len && memcmp(e.op.data, a->what, len) == 0)
          || (e.key.len == len && memcmp(e.key.data, a->what, len) == 0)))
    {
        return 0;
    }

    audit_time(e.time, when);

    /* an event of a version-2 entry: SEQ.INDEX */
    if (e.index) {
        printf("%llu.%u %s %s", (unsigned long long) e.seq, e.index, when,
               idem_audit_event_name(e.event));

    } else {
        printf("%llu %s %s", (unsigned long long) e.seq, when,
               idem_audit_event_name(e.event));
    }

    if (e.status) {
        printf(" status=%d", e.status);
    }

    audit_print("op", &e.op);
    audit_print("key", &e.key);
    audit_print("route", &e.route);
    audit_print("identity", &e.identity);
    audit_print("approver", &e.approver);
    audit_print("response", &e.response);
    audit_print("ref", &e.ref);
    audit_print("fp", &e.fp);
    audit_print("request", &e.request);
    putchar('\n');

    return 1;
}


static int
audit_show_each(audit_t *a, audit_read_t *en, void *data)
{
    size_t               i;
    idem_audit_events_t  ev;

    if (en->e && idem_audit_events_decode(en->e, en->e_len, &ev) == 0) {
        for (i = 0; i < ev.n; i++) {
            if (ev.version == 1) {
                ev.e[i].index = 0;
            }

            (*(uint64_t *) data) += audit_show_entry(a, &ev.e[i]);
        }
    }

    return 0;
}


/*
 * A line of an audit file as its events: 0, or -1 after saying on stderr
 * why it is none.  *tree is the caller's to free either way.
 */
static int
audit_file_entry(const char *file, unsigned long lineno, char *line,
    size_t len, idem_audit_events_t *ev, void **tree)
{
    char  hash[IDEM_AUDIT_HASH_LEN + 1], why[200];

    if (idem_audit_file_parse(line, len, ev, hash, tree, why, sizeof(why))
        != 0)
    {
        fprintf(stderr, "idempotency-audit: %s:%lu: not an entry (%s)\n",
                file, lineno, why);
        return -1;
    }

    return 0;
}


/*
 * A line of an audit file: its events that name a->what, each shown as
 * LINE.INDEX (LINE for a version-1 line)
 */
static int
audit_show_line(audit_t *a, const char *file, unsigned long lineno,
    char *line, size_t len, void *data)
{
    void                *tree;
    size_t               i;
    idem_audit_events_t  ev;

    if (audit_file_entry(file, lineno, line, len, &ev, &tree) == 0) {
        for (i = 0; i < ev.n; i++) {
            (*(uint64_t *) data) += audit_show_entry(a, &ev.e[i]);
        }
    }

    idem_audit_file_free(tree);

    return 0;
}


static int
audit_show(audit_t *a)
{
    uint64_t  found;

    found = 0;

    if ((a->nfiles ? audit_lines(a, audit_show_line, &found)
                   : audit_scan(a, 0, audit_show_each, &found)) != 0)
    {
        return 2;
    }

    if (found == 0) {
        fprintf(stderr, "idempotency-audit: no entry names \"%s\"\n",
                a->what);
        return 1;
    }

    return 0;
}


/* ------------------------------------------------------------ export */

/*
 * A JSON string: UTF-8 as it is, the escapes of RFC 8785 for control
 * characters, '"' and '\', and \u00XX for each byte that is not UTF-8
 * (the exact bytes are in "e").
 */
static void
audit_json_str(const char *name, const char *p, size_t len)
{
    char      esc[6];
    size_t    i, n;
    uint32_t  cp;

    printf(",\"%s\":\"", name);

    for (i = 0; i < len; i += n) {
        n = idem_utf8_decode((const unsigned char *) p + i, len - i, &cp);

        if (n == 0) {
            printf("\\u%04x", (unsigned char) p[i]);
            n = 1;

        } else if (cp < 0x20 || cp == '"' || cp == '\\') {
            fwrite(esc, 1, idem_json_escape(cp, esc), stdout);

        } else {
            fwrite(p + i, 1, n, stdout);
        }
    }

    putchar('"');
}


static void
audit_json_field(const char *name, idem_str_t *s)
{
    audit_json_str(name, s->data, s->len);
}


/* one line of export: event e of the entry en (NULL: none decodes) */
static int
audit_export_event(audit_read_t *en, idem_audit_entry_t *e, size_t n,
    const char *e64)
{
    char  when[48], text[2 * IDEM_AUDIT_PREV_MAX + 1];

    printf("{\"seq\":%llu", (unsigned long long) idem_audit_id_seq(en->id,
                                                               en->id_len));
    audit_json_str("id", en->id, en->id_len);
    idem_audit_hash_text(en->h ? en->h : "",
                         en->h_len > IDEM_AUDIT_PREV_MAX ? 0 : en->h_len,
                         text);
    audit_json_str("hash", text, strlen(text));

    if (e) {
        printf(",\"index\":%u,\"events\":%zu", e->index ? e->index : 1, n);
        audit_time(e->time, when);
        idem_audit_hash_text(e->prev.data, e->prev.len, text);
        audit_json_str("prev", text, strlen(text));
        printf(",\"time\":%lld,\"time_utc\":\"%s\"", (long long) e->time,
               when);
        audit_json_str("event", idem_audit_event_name(e->event),
                       strlen(idem_audit_event_name(e->event)));
        audit_json_field("operation_id", &e->op);
        audit_json_field("key", &e->key);
        audit_json_field("fingerprint", &e->fp);
        audit_json_field("route", &e->route);
        printf(e->status ? ",\"status\":%d" : ",\"status\":null", e->status);
        audit_json_field("identity", &e->identity);
        audit_json_field("approver", &e->approver);
        audit_json_field("response_sha256", &e->response);
        audit_json_field("ref", &e->ref);
        audit_json_field("request_id", &e->request);

    } else {
        printf(",\"error\":\"not an entry the module writes\"");
    }

    printf(",\"e\":\"%s\"}\n", e64);

    return ferror(stdout) ? -1 : 0;
}


/* one line per event of the entry (one line when it is not an entry) */
static int
audit_export_each(audit_t *a, audit_read_t *en, void *data)
{
    int                  rc;
    char                *e64;
    size_t               i;
    idem_audit_events_t  ev;

    e64 = malloc(idem_b64url_len(en->e_len) + 1);
    if (e64 == NULL) {
        return -1;
    }

    e64[idem_b64url_encode((const unsigned char *) (en->e ? en->e : ""),
                           en->e_len, e64)] = '\0';

    if (en->e == NULL || idem_audit_events_decode(en->e, en->e_len, &ev) != 0)
    {
        rc = audit_export_event(en, NULL, 0, e64);

    } else {
        for (rc = 0, i = 0; rc == 0 && i < ev.n; i++) {
            rc = audit_export_event(en, &ev.e[i], ev.n, e64);
        }
    }

    free(e64);

    return rc;
}


/* a line of an audit file, as it is, from entry a->from on */
static int
audit_export_line(audit_t *a, const char *file, unsigned long lineno,
    char *line, size_t len, void *data)
{
    void                *tree;
    idem_audit_events_t  ev;

    if (audit_file_entry(file, lineno, line, len, &ev, &tree) == 0
        && ev.e[0].seq >= a->from)
    {
        fwrite(line, 1, len, stdout);
        putchar('\n');
    }

    idem_audit_file_free(tree);

    return ferror(stdout) ? -1 : 0;
}


static int
audit_export(audit_t *a)
{
    if (a->nfiles) {
        return audit_lines(a, audit_export_line, NULL) == 0
               && fflush(stdout) == 0 ? 0 : 2;
    }

    return audit_scan(a, a->from, audit_export_each, NULL) == 0
           && fflush(stdout) == 0 ? 0 : 2;
}


/* ------------------------------------------------------------ main */

static int
audit_anchor(audit_t *a, const char *arg)
{
    char                *end;
    unsigned long long   seq;

    seq = strtoull(arg, &end, 10);

    if (a->nanchors == AUDIT_ANCHORS || end == arg || *end != ':'
        || strlen(end + 1) != IDEM_AUDIT_HASH_LEN
        || !idem_is_hex(end + 1, IDEM_AUDIT_HASH_LEN) || seq == 0)
    {
        fprintf(stderr, "idempotency-audit: --anchor SEQ:HASH (a 64-hex "
                "hash, at most %d anchors), not \"%s\"\n", AUDIT_ANCHORS,
                arg);
        return -1;
    }

    a->anchors[a->nanchors].seq = seq;
    memcpy(a->anchors[a->nanchors].hash, end + 1, IDEM_AUDIT_HASH_LEN + 1);
    a->nanchors++;

    return 0;
}


static int
audit_options(audit_t *a, int argc, char **argv)
{
    int          c;
    char         err[512];
    const char  *key_file;

    static struct option  opts[] = {
        { "redis", required_argument, NULL, 'r' },
        { "db", required_argument, NULL, 'd' },
        { "user", required_argument, NULL, 'u' },
        { "password", required_argument, NULL, 'p' },
        { "stream", required_argument, NULL, 's' },
        { "key-file", required_argument, NULL, 'k' },
        { "anchor", required_argument, NULL, 'a' },
        { "file", required_argument, NULL, 'f' },
        { "from", required_argument, NULL, 'F' },
        { "allow-empty", no_argument, NULL, 'E' },
        { "partial", no_argument, NULL, 'P' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };

    key_file = NULL;

    /* GNU style: the options anywhere, the others left in order */
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'r': a->addr = optarg; break;
        case 'd': a->db = atoi(optarg); break;
        case 'u': a->user = optarg; break;
        case 'p': a->password = optarg; break;
        case 's': a->stream = optarg; break;
        case 'k': key_file = optarg; break;
        case 'f':
            if (a->nfiles == AUDIT_FILES) {
                return -1;
            }
            a->files[a->nfiles++] = optarg;
            break;
        case 'E': a->allow_empty = 1; break;
        case 'P': a->partial = 1; break;
        case 'F': a->from = strtoull(optarg, NULL, 10); break;
        case 'a':
            if (audit_anchor(a, optarg) != 0) {
                return -1;
            }
            break;
        default:
            return -1;
        }
    }

    if (key_file) {
        if (idem_jws_key_load(&a->key, IDEM_JWS_HS256, key_file, NULL, 0,
                              err, sizeof(err)) != 0)
        {
            fprintf(stderr, "idempotency-audit: --key-file: %s\n", err);
            return -1;
        }

        a->has_key = 1;
    }

    return 0;
}


int
main(int argc, char **argv)
{
    int          rc;
    audit_t      a;
    const char  *cmd;

    memset(&a, 0, sizeof(a));
    a.addr = "127.0.0.1:6379";
    a.stream = "idem:audit";
    a.password = getenv("IDEM_REDIS_PASSWORD");

    if (audit_options(&a, argc, argv) != 0 || optind >= argc) {
        return usage();
    }

    cmd = argv[optind++];

    if (strcmp(cmd, "show") == 0) {
        if (optind + 1 != argc) {
            return usage();
        }

        a.what = argv[optind];

    } else {
        /* verify and export: the files after the command */
        while (optind < argc && a.nfiles < AUDIT_FILES) {
            a.files[a.nfiles++] = argv[optind++];
        }

        if (optind != argc) {
            return usage();
        }
    }

    if (a.nfiles == 0 && audit_login(&a) != 0) {
        return 2;
    }

    if (strcmp(cmd, "verify") == 0) {
        rc = audit_verify(&a);
    } else if (strcmp(cmd, "show") == 0) {
        rc = audit_show(&a);
    } else if (strcmp(cmd, "export") == 0) {
        rc = audit_export(&a);
    } else {
        rc = usage();
    }

    if (a.rc) {
        redisFree(a.rc);
    }

    idem_jws_key_free(&a.key);

    return rc;
}
