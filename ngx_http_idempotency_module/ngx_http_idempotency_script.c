/*
 * The scripts' texts as the build composed them, and their SHA-1 digests,
 * computed once per configuration.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <openssl/evp.h>

#include "ngx_http_idempotency_script.h"
#include "ngx_http_idempotency_script_text.h"


ngx_http_idem_script_t *
ngx_http_idem_scripts_init(ngx_pool_t *pool)
{
    u_char                   md[EVP_MAX_MD_SIZE];
    ngx_uint_t               i;
    unsigned int             n;
    ngx_http_idem_script_t  *s;

    s = ngx_pcalloc(pool, NGX_HTTP_IDEM_NSCRIPTS * sizeof(*s));
    if (s == NULL) {
        return NULL;
    }

    for (i = 0; i < NGX_HTTP_IDEM_NSCRIPTS; i++) {
        s[i].name = ngx_http_idem_script_names[i];
        s[i].text.data = (u_char *) ngx_http_idem_script_texts[i];
        s[i].text.len = ngx_strlen(s[i].text.data);
        s[i].nargs = ngx_http_idem_script_nargs[i];

        if (!EVP_Digest(s[i].text.data, s[i].text.len, md, &n, EVP_sha1(),
                        NULL))
        {
            return NULL;
        }

        ngx_hex_dump(s[i].sha1, md, n);
    }

    return s;
}
