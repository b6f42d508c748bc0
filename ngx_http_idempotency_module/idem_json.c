/*
 * A parsed JSON body (cJSON's tree): pointers and exact text (idem_json.h).
 */

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "idem_json.h"


/* one step of a pointer: a member of an object, an element of an array */
static const cJSON *
idem_json_step(const cJSON *node, const idem_ptr_token_t *t)
{
    const cJSON  *c;

    if (cJSON_IsObject(node)) {
        for (c = node->child; c; c = c->next) {
            if (c->string && strlen(c->string) == t->len
                && memcmp(c->string, t->data, t->len) == 0)
            {
                return c;
            }
        }

        return NULL;
    }

    if (!cJSON_IsArray(node) || t->index < 0
        || t->index >= cJSON_GetArraySize(node))
    {
        return NULL;
    }

    return cJSON_GetArrayItem(node, (int) t->index);
}


const cJSON *
idem_json_pointer_walk(const cJSON *root, const idem_ptr_t *p)
{
    size_t        i;
    const cJSON  *node;

    node = root;

    for (i = 0; node && i < p->ntokens; i++) {
        node = idem_json_step(node, &p->tokens[i]);
    }

    return node;
}


/* the pointer's syntax is idem_pointer.c's, the one place for it */
const cJSON *
idem_json_pointer(const cJSON *root, const char *ptr, size_t len)
{
    idem_ptr_t    p;
    const cJSON  *node;

    if (len == 0) {
        return root;
    }

    if (idem_ptr_parse(ptr, len, &p) != IDEM_PTR_OK) {
        return NULL;
    }

    node = idem_json_pointer_walk(root, &p);
    idem_ptr_free(&p);

    return node;
}


/*
 * node as JSON text, each number exactly (idem_jcs_format_number), members
 * in the tree's order; idem_json_canonical() sorts them after.
 */
static int
idem_json_write(idem_sink_t *sink, const cJSON *node)
{
    char          num[IDEM_JCS_NUMBER_MAX];
    size_t        n;
    const cJSON  *c;

    if (cJSON_IsNumber(node)) {
        n = idem_jcs_format_number(node->valuedouble, num);
        return n ? sink->write(sink, num, n) : -1;
    }

    if (cJSON_IsString(node)) {
        return idem_jcs_write_string(sink, node->valuestring,
                                     strlen(node->valuestring));
    }

    if (!cJSON_IsArray(node) && !cJSON_IsObject(node)) {
        return cJSON_IsTrue(node) ? sink->write(sink, "true", 4)
               : cJSON_IsFalse(node) ? sink->write(sink, "false", 5)
               : sink->write(sink, "null", 4);
    }

    if (sink->write(sink, cJSON_IsArray(node) ? "[" : "{", 1) != 0) {
        return -1;
    }

    for (c = node->child; c; c = c->next) {
        if ((c != node->child && sink->write(sink, ",", 1) != 0)
            || (cJSON_IsObject(node)
                && (idem_jcs_write_string(sink, c->string,
                                          strlen(c->string)) != 0
                    || sink->write(sink, ":", 1) != 0))
            || idem_json_write(sink, c) != 0)
        {
            return -1;
        }
    }

    return sink->write(sink, cJSON_IsArray(node) ? "]" : "}", 1);
}


int
idem_json_canonical(const cJSON *node, idem_sink_t *out)
{
    int              rc;
    idem_sink_t      sink;
    idem_sink_buf_t  text;

    text.data = NULL;
    text.len = 0;
    text.size = 0;
    sink.write = idem_sink_buf_write;
    sink.data = &text;

    rc = idem_json_write(&sink, node) == 0
         && idem_jcs_canonicalize(text.data, text.len, out) == IDEM_JCS_OK
         ? 0 : -1;

    free(text.data);

    return rc;
}
