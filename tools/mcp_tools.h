/*
 * The three tools of idempotency-mcp: idempotent_request (mcp_request.c),
 * operation_status and list_operations (mcp_tools.c).  Each call returns
 * a CallToolResult: structuredContent, the same JSON as text content, and
 * isError.
 */

#ifndef MCP_TOOLS_H
#define MCP_TOOLS_H

#include <cjson/cJSON.h>

#include "call_state.h"
#include "mcp_config.h"

#define MCP_BODY_MAX  65536
/* what of an upstream answer is kept in memory; the rest is only counted */
#define MCP_STORE_MAX  (1024 * 1024)


const char *mcp_tools_instructions(void);
cJSON *mcp_tools_list(void);
int mcp_tools_known(const char *name);
cJSON *mcp_tools_call(const mcp_config_t *cf, const char *name, cJSON *args,
    volatile int *cancel);

/* shared by the tools */
cJSON *mcp_tool_result(cJSON *structured, int is_error);
cJSON *mcp_refused(const char *operation, const char *why);
int mcp_state_dir(const mcp_config_t *cf, call_state_t *st, const char *op);

cJSON *mcp_idempotent_request(const mcp_config_t *cf, cJSON *args,
    volatile int *cancel);

#endif /* MCP_TOOLS_H */
