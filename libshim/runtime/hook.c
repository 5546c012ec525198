/* tgs-hook: the OCI hook of TGS containers (tgs-runtime adds it to their spec).
 *
 *   tgs-hook [--tgs-config PATH] createRuntime   tell tgsd the container's init pid (attach);
 *                                                failing makes runc abort the create
 *   tgs-hook [--tgs-config PATH] poststop        tell tgsd the container is gone (deregister);
 *                                                always exits 0 (tgsd reclaims anyway)
 *
 * The OCI state (id, pid, ...) comes on stdin. C, not Python: it runs twice on every TGS
 * container's life, and an interpreter's start would be most of what TGS adds to it. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"

#define USAGE "usage: tgs-hook [--tgs-config PATH] createRuntime|poststop  (the OCI state on stdin)"
#define MAX_STATE (1 << 20)

static int g_strict = 1;

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("tgs-hook: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(g_strict ? 1 : 0);
}

int main(int argc, char **argv) {
    const char *config = NULL;
    int i = 1;
    if (argc >= 3 && !strcmp(argv[1], "--tgs-config")) {
        config = argv[2];
        i = 3;
    }
    const char *stage = argc == i + 1 ? argv[i] : NULL;
    if (!stage || (strcmp(stage, "createRuntime") && strcmp(stage, "poststop") && strcmp(stage, "createContainer") &&
                   strcmp(stage, "prestart"))) {
        fprintf(stderr, "tgs-hook: %s\n", USAGE);
        return 2;
    }
    g_strict = strcmp(stage, "poststop") != 0;

    size_t len;
    char *state = rt_read_fd(0, MAX_STATE + 1, &len), id[256], esc[512];
    const char *pid_text = NULL;
    if (!state || len > MAX_STATE)
        fail("the OCI state on stdin is not usable (larger than %d bytes): expected JSON with id and pid", MAX_STATE);
    if (!rt_json_string(rt_json_member(state, "id"), id, sizeof id) || !rt_json_escape(id, esc, sizeof esc))
        fail("the OCI state on stdin is not usable (no container id): expected JSON with id and pid");
    pid_text = rt_json_member(state, "pid");

    int named;
    config = rt_config_path(config, &named);
    char *toml = rt_read_file(config, 1 << 20, NULL), state_dir[4096] = RT_DEFAULT_STATE_DIR;
    if (!toml && (named || errno != ENOENT))
        fail("bad TGS config: %s: %s", config, errno == ENOENT ? "no such config file" : strerror(errno));
    if (toml)
        rt_config_key(toml, "daemon", "state_dir", 0, state_dir, sizeof state_dir);

    char request[1024], msg[2048];
    if (g_strict) {
        char *end = NULL;
        long pid = pid_text ? strtol(pid_text, &end, 10) : 0;
        if (!pid_text || end == pid_text || pid <= 0 || (*end && !strchr(",} \t\r\n", *end)))
            fail("the OCI state has no init pid for container %s", id);
        snprintf(request, sizeof request, "{\"op\": \"attach\", \"id\": \"%s\", \"pid\": %ld}", esc, pid);
    } else {
        snprintf(request, sizeof request, "{\"op\": \"deregister\", \"id\": \"%s\"}", esc);
    }
    if (rt_admin_call(state_dir, request, 10, msg, sizeof msg) != RT_ADMIN_OK)
        fail("%s of container %s: %s", stage, id, msg);
    return 0;
}
