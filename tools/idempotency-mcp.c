/*
 * idempotency-mcp: the retry rule of docs/agents.md as an MCP server over
 * stdio, for agent hosts.
 *
 *   idempotency-mcp --config FILE
 *
 * The agent names a target and an operation; the server owns the key of
 * each intended action (persisted before the first byte, in the same state
 * files as idempotency-call), follows the retry rule, and holds the
 * targets' credentials itself: they never reach the agent.
 */

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>

#include "call_run.h"
#include "mcp_config.h"
#include "mcp_rpc.h"


static void
usage(FILE *f)
{
    fputs("usage: idempotency-mcp --config FILE\n"
          "\n"
          "An MCP server over stdio (JSON-RPC 2.0, one message a line) with\n"
          "the tools idempotent_request, operation_status and\n"
          "list_operations; see docs/agents.md, \"MCP\".\n", f);
}


int
main(int argc, char **argv)
{
    mcp_config_t  cf;
    mcp_server_t  srv;
    char          err[1024];

    if (argc == 2 && strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }

    if (argc != 3 || strcmp(argv[1], "--config") != 0) {
        usage(stderr);
        return 64;
    }

    if (mcp_config_load(argv[2], &cf, err, sizeof(err)) != 0) {
        mcp_log("%s", err);
        mcp_config_free(&cf);
        return 78;
    }

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        mcp_log("libcurl: cannot initialize");
        return 70;
    }

    /* a client that goes away must not kill a call mid-record */
    signal(SIGPIPE, SIG_IGN);
    srandom((unsigned) (call_now_ms() ^ getpid()));

    mcp_server_init(&srv, &cf);
    mcp_log("ready: %d target(s), state dir %s", cf.ntargets,
            cf.state_dir ? cf.state_dir : "(default)");
    mcp_serve(&srv, STDIN_FILENO);

    curl_global_cleanup();
    mcp_config_free(&cf);
    return 0;
}
