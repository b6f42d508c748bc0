/*
 * The durable state of idempotency-call and idempotency-mcp: one JSON file
 * per intended action (DIR/OP.json) holding its key, written and fsync'ed
 * before the first byte is sent, under an flock on DIR/OP.lock.  Both
 * programs read and write the same files, so an operation begun by one can
 * be finished by the other.  Errors are left in st->err, never printed:
 * one program writes them to stderr, the other into a tool result.
 */

#ifndef CALL_STATE_H
#define CALL_STATE_H

#include <stddef.h>

#include <cjson/cJSON.h>

#define CALL_KEY_BYTES  16
#define CALL_OP_MAX     128


/* what makes two runs the same action: compared with the state file */
typedef struct {
    const char  *op;
    const char  *method;
    const char  *url;
    const char  *body_sha;      /* 64 hex */
} call_action_t;


typedef struct {
    char    dir[4096];
    char    file[4200];
    char    key[CALL_KEY_BYTES * 2 + 1];
    int     lock_fd;
    int     fresh;
    cJSON  *doc;
    char    err[640];
} call_state_t;


/* state_prepare's answers besides 0 */
#define CALL_STATE_CONFLICT  1     /* err says which of method, URL, body */
#define CALL_STATE_UNUSABLE  -1    /* err says why; nothing may be sent */

void call_state_init(call_state_t *st);
void call_state_free(call_state_t *st);

/* dir: the chosen one, or NULL for the environment's default */
int call_state_dir(call_state_t *st, const char *dir, const char *op);

/*
 * replaces: NULL resumes the recorded action; "" starts a new one (--new);
 * a key starts a new one only while the state still holds that key, so the
 * retry of a call that already replaced it resumes the replacement
 */
int call_state_prepare(call_state_t *st, const call_action_t *a,
    const char *replaces);
void call_state_record(call_state_t *st, const char *op, const char *outcome,
    long status);

int call_state_write(call_state_t *st, const char *path, const char *data,
    size_t n);

int call_op_name_valid(const char *op);
int call_key_valid(const char *k);     /* the shape of the keys minted here */
void call_body_sha(const char *body, size_t len, char out[65]);
char *call_read_file(const char *path, size_t *len, char *err, size_t errlen);
const char *call_json_str(cJSON *obj, const char *name);
void call_utc_now(char *buf, size_t n);

#endif /* CALL_STATE_H */
