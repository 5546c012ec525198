/* tgs-runtime: the OCI runtime docker or containerd calls (`docker run --runtime=tgs`).
 *
 * The runtime is invoked several times per container (create, start, state, delete, ...);
 * only `create` (or `run`) of a container that asks for TGS needs any work. This
 * launcher keeps everything else an exec: it strips `--tgs-config PATH`, picks the lower
 * runtime from the config file's [runtime] lower_runtime, and execs it with the same
 * arguments. For `create`/`run` it looks at the bundle's config.json: when it mentions
 * TGS_CLASS, the tgs.class annotation, or (with a [runtime] default_class) a GPU (in
 * NVIDIA_VISIBLE_DEVICES, which CDI sets to void beside the nodes it adds, or as a CDI
 * device in an annotation), it asks tgsd (admin operation `create`) to decide exactly
 * and, for a container that asks for TGS, to reserve it and edit its spec; then it
 * execs the lower runtime, or reports tgsd's refusal. That look is only a filter: tgsd
 * makes the real decision. When tgsd cannot be asked, it execs tgs-runtime-create (the
 * Python part, next to this binary), which decides the same way and says clearly why a
 * TGS container cannot start, while anything else still starts.
 *
 * It never writes to stdout, and a failure to exec is reported on stderr and, as runc
 * does, as a JSON line in the --log file the containerd shim reads. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rt.h"

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

static int find_in_path(const char *name, char *out, size_t cap) {
    if (strchr(name, '/')) {
        snprintf(out, cap, "%s", name);
        return access(out, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path && *path ? path : DEFAULT_PATH);
    char *save = NULL;
    for (char *dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        if ((size_t)snprintf(out, cap, "%s/%s", dir, name) < cap && access(out, X_OK) == 0)
            return 1;
    }
    return 0;
}

static const char *g_log, *g_log_format = "text";

/* Reported where docker shows it: the containerd shim returns the last error line of
 * the --log file. Never fails because the log cannot be written. */
static void report(const char *msg) {
    fprintf(stderr, "tgs-runtime: %s\n", msg);
    if (!g_log)
        return;
    int fd = open(g_log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    char line[16384], t[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(t, sizeof t, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int n;
    if (!strcmp(g_log_format, "json")) {
        char esc[8192];
        if (!rt_json_escape(msg, esc, sizeof esc))
            snprintf(esc, sizeof esc, "(a message too long to log; see stderr)");
        n = snprintf(line, sizeof line, "{\"level\":\"error\",\"msg\":\"tgs-runtime: %s\",\"time\":\"%s\"}\n", esc, t);
    } else {
        n = snprintf(line, sizeof line, "time=\"%s\" level=error msg=\"tgs-runtime: %s\"\n", t, msg);
    }
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof line) { /* cut, but still one line */
        n = (int)sizeof line - 1;
        line[n - 1] = '\n';
    }
    if (write(fd, line, (size_t)n) < 0) {
    }
    close(fd);
}

/* Execs `path`; where that fails, says why (then `hint`) and returns 127. */
static int exec_or_say(const char *path, char **argv, const char *hint) {
    execv(path, argv);
    char msg[PATH_MAX + 160];
    snprintf(msg, sizeof msg, "cannot run %s: %s%s", path, strerror(errno), hint);
    report(msg);
    return 127;
}

static int create_takes_value(const char *opt) {
    static const char *with_value[] = {"--console-socket", "--pid-file", "--preserve-fds", NULL};
    for (int i = 0; with_value[i]; i++)
        if (!strcmp(opt, with_value[i]))
            return 1;
    return 0;
}

/* Has tgsd set the container up: 1 done (or nothing to do), 0 tgsd cannot be asked
 * (the Python part decides then); on a refusal, reports it and exits 1. */
static int tgsd_create(const char *state_dir, const char *id, const char *bundle, const char *config, int named) {
    char cwd[PATH_MAX], path[2][2 * PATH_MAX + 2], esc[3][2 * PATH_MAX], request[8 * PATH_MAX], msg[4096];
    if (!getcwd(cwd, sizeof cwd))
        return 0;
    const char *given[2] = {bundle ? bundle : ".", config};
    for (int i = 0; i < 2; i++) {
        if (!realpath(given[i], path[i]))
            snprintf(path[i], sizeof path[i], "%s%s%s", given[i][0] == '/' ? "" : cwd, given[i][0] == '/' ? "" : "/",
                     given[i]);
        if (!rt_json_escape(path[i], esc[i], sizeof esc[i]))
            return 0;
    }
    if (!rt_json_escape(id ? id : "", esc[2], sizeof esc[2]))
        return 0;
    snprintf(request, sizeof request,
             "{\"op\": \"create\", \"id\": %s%s%s, \"bundle\": \"%s\", \"config\": \"%s\", \"named\": %s}",
             id ? "\"" : "", id ? esc[2] : "null", id ? "\"" : "", esc[0], esc[1], named ? "true" : "false");
    switch (rt_admin_call(state_dir, request, 60, msg, sizeof msg)) {
    case RT_ADMIN_OK:
        return 1;
    case RT_ADMIN_REFUSED:
        report(msg);
        exit(1);
    default:
        return 0;
    }
}

/* [runtime] lower_runtime's default (tgs_runtime/config.py): the NVIDIA runtime where the
 * NVIDIA Container Toolkit is installed (its packages put it on PATH, the GPU Operator under
 * /usr/local/nvidia/toolkit), else runc. */
static const char *const DEFAULT_LOWER[] = {
    "nvidia-container-runtime", "/usr/local/nvidia/toolkit/nvidia-container-runtime", "runc", NULL};

/* Name number i of those to try: the config's list when it has one, else DEFAULT_LOWER. */
static int lower_candidate(const char *toml, int configured, int i, char *name, size_t cap) {
    if (configured)
        return rt_config_key(toml, "runtime", "lower_runtime", i, name, cap);
    return DEFAULT_LOWER[i] && (size_t)snprintf(name, cap, "%s", DEFAULT_LOWER[i]) < cap;
}

/* The lower runtime into out: the first of [runtime] lower_runtime that exists, as
 * tgs_runtime/runtime/main.py picks it. Reports and returns 0 when there is none. */
static int find_lower(const char *toml, char *out, size_t cap, const char *config) {
    char name[PATH_MAX], tried[1024] = "";
    int configured = toml && rt_config_key(toml, "runtime", "lower_runtime", 0, name, sizeof name);
    for (int i = 0; lower_candidate(toml, configured, i, name, sizeof name); i++) {
        if (find_in_path(name, out, cap))
            return 1;
        size_t n = strlen(tried);
        if (n + 1 < sizeof tried && (size_t)snprintf(tried + n, sizeof tried - n, "%s%s", n ? ", " : "", name) >=
                                        sizeof tried - n)
            tried[n] = 0; /* the message names those that fit whole */
    }
    char msg[sizeof tried + PATH_MAX + 128];
    snprintf(msg, sizeof msg, "no lower runtime found (tried %s; config %s, [runtime] lower_runtime)", tried, config);
    report(msg);
    return 0;
}

static int takes_value(const char *opt) {
    static const char *with_value[] = {"--root", "--log", "--log-format", "--criu", "--rootless", "--tgs-config", NULL};
    for (int i = 0; with_value[i]; i++)
        if (!strcmp(opt, with_value[i]))
            return 1;
    return 0;
}

int main(int argc, char **argv) {
    const char *tgs_config = NULL, *bundle = NULL, *container_id = NULL;
    char **out = calloc((size_t)argc + 1, sizeof *out);
    int n = 1, sub = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (sub < 0 && a[0] == '-') {
            const char *eq = strchr(a, '=');
            char name[64];
            snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
            const char *value = eq ? eq + 1 : (takes_value(name) && i + 1 < argc ? argv[i + 1] : NULL);
            if (!strcmp(name, "--log"))
                g_log = value;
            else if (!strcmp(name, "--log-format") && value)
                g_log_format = value;
            if (!strcmp(name, "--tgs-config")) {
                tgs_config = value;
                if (!eq)
                    i++;
                continue; /* stripped: the lower runtime does not know it */
            }
            out[n++] = argv[i];
            if (!eq && takes_value(name) && i + 1 < argc)
                out[n++] = argv[++i];
            continue;
        }
        if (sub < 0)
            sub = i;
        else if ((!strcmp(a, "--bundle") || !strcmp(a, "-b")) && i + 1 < argc) {
            bundle = argv[i + 1];
            out[n++] = argv[i++];
        } else if (!strncmp(a, "--bundle=", 9) || !strncmp(a, "-b=", 3))
            bundle = strchr(a, '=') + 1;
        else if (create_takes_value(a) && i + 1 < argc)
            out[n++] = argv[i++];
        else if (a[0] != '-')
            container_id = a;
        out[n++] = argv[i];
    }
    int named;
    tgs_config = rt_config_path(tgs_config, &named);
    char *toml = rt_read_file(tgs_config, 1 << 20, NULL);
    char default_class[32] = "", lower[PATH_MAX], state_dir[PATH_MAX] = RT_DEFAULT_STATE_DIR;
    if (toml) {
        rt_config_key(toml, "runtime", "default_class", 0, default_class, sizeof default_class);
        rt_config_key(toml, "daemon", "state_dir", 0, state_dir, sizeof state_dir);
    }
    if (sub > 0 && (!strcmp(argv[sub], "create") || !strcmp(argv[sub], "run"))) {
        char spec_path[PATH_MAX];
        snprintf(spec_path, sizeof spec_path, "%s/config.json", bundle ? bundle : ".");
        char *spec = rt_read_file(spec_path, 16 << 20, NULL);
        int readable = spec != NULL;
        int wanted = readable && (strstr(spec, "TGS_CLASS=") || strstr(spec, "\"tgs.class\"") ||
                                  (default_class[0] && (strstr(spec, "NVIDIA_VISIBLE_DEVICES=") ||
                                                        strstr(spec, "nvidia.com/gpu="))));
        free(spec);
        if ((wanted || !readable) && tgsd_create(state_dir, container_id, bundle, tgs_config, named))
            goto lower_runtime;
        if (wanted || !readable) { /* no readable config.json: let the Python part say so clearly */
            char self[PATH_MAX], create[PATH_MAX];
            ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
            if (len > 0) {
                self[len] = 0;
                snprintf(create, sizeof create, "%s/tgs-runtime-create", dirname(self));
                if (!readable && access(create, X_OK) != 0)
                    goto lower_runtime;
                argv[0] = create;
                return exec_or_say(create, argv, " (reinstall with `tgs setup docker`)");
            }
        }
    }
lower_runtime:
    if (!find_lower(toml, lower, sizeof lower, tgs_config))
        return 127;
    out[0] = lower;
    return exec_or_say(lower, out, "");
}
