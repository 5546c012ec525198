/* tgs-runtime: the OCI runtime docker or containerd calls (`docker run --runtime=tgs`).
 *
 * The runtime is invoked several times per container (create, start, state, delete, ...);
 * only `create` (or `run`) of a container that asks for TGS needs any work. This
 * launcher keeps everything else an exec: it strips `--tgs-config PATH`, picks the lower
 * runtime from the config file's [runtime] lower_runtime, and execs it with the same
 * arguments. For `create`/`run` it looks at the bundle's config.json: when it mentions
 * TGS_CLASS, the tgs.class annotation, or (with a [runtime] default_class) a GPU, it
 * execs tgs-runtime-create (the Python part, next to this binary), which decides
 * exactly, sets TGS up and execs the lower runtime itself. That look is only a filter:
 * the Python part makes the real decision.
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

#define DEFAULT_CONFIG "/etc/tgs/config.toml"
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

static char *read_file(const char *path, size_t max, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *buf = malloc(max + 1);
    size_t n = 0;
    ssize_t r;
    while (buf && n < max && (r = read(fd, buf + n, max - n)) > 0)
        n += (size_t)r;
    close(fd);
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = n;
    }
    return buf;
}

/* The first string of `key` in [runtime] (a string or a list of strings), into out. */
static int runtime_key(const char *toml, const char *key, char *out, size_t cap) {
    int in_runtime = 0;
    size_t klen = strlen(key);
    for (const char *line = toml; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        while (*line == ' ' || *line == '\t')
            line++;
        if (*line == '[') {
            in_runtime = !strncmp(line, "[runtime]", 9);
            continue;
        }
        if (!in_runtime || strncmp(line, key, klen) || (line[klen] != ' ' && line[klen] != '=' && line[klen] != '\t'))
            continue;
        const char *q = strchr(line, '=');
        const char *eol = strchr(line, '\n');
        if (!q || (eol && q > eol))
            return 0;
        const char *s = strchr(q, '"');
        if (!s || (eol && s > eol))
            return 0;
        const char *e = strchr(s + 1, '"');
        if (!e || (eol && e > eol) || (size_t)(e - s - 1) >= cap)
            return 0;
        memcpy(out, s + 1, (size_t)(e - s - 1));
        out[e - s - 1] = 0;
        return 1;
    }
    return 0;
}

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
        snprintf(out, cap, "%s/%s", dir, name);
        if (access(out, X_OK) == 0)
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
    char line[2048], t[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(t, sizeof t, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int n;
    if (!strcmp(g_log_format, "json")) {
        char esc[1024];
        size_t j = 0;
        for (const char *p = msg; *p && j < sizeof esc - 2; p++) {
            if (*p == '"' || *p == '\\')
                esc[j++] = '\\';
            esc[j++] = *p;
        }
        esc[j] = 0;
        n = snprintf(line, sizeof line, "{\"level\":\"error\",\"msg\":\"tgs-runtime: %s\",\"time\":\"%s\"}\n", esc, t);
    } else {
        n = snprintf(line, sizeof line, "time=\"%s\" level=error msg=\"tgs-runtime: %s\"\n", t, msg);
    }
    if (write(fd, line, (size_t)n) < 0) {
    }
    close(fd);
}

static int takes_value(const char *opt) {
    static const char *with_value[] = {"--root", "--log", "--log-format", "--criu", "--rootless", "--tgs-config", NULL};
    for (int i = 0; with_value[i]; i++)
        if (!strcmp(opt, with_value[i]))
            return 1;
    return 0;
}

int main(int argc, char **argv) {
    const char *tgs_config = NULL, *bundle = NULL;
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
        else if ((!strcmp(a, "--bundle") || !strcmp(a, "-b")) && i + 1 < argc)
            bundle = argv[i + 1];
        else if (!strncmp(a, "--bundle=", 9))
            bundle = a + 9;
        out[n++] = argv[i];
    }
    if (!tgs_config)
        tgs_config = getenv("TGS_CONFIG");
    if (!tgs_config || !*tgs_config)
        tgs_config = DEFAULT_CONFIG;
    char *toml = read_file(tgs_config, 1 << 20, NULL);
    char lower_name[PATH_MAX] = "runc", default_class[32] = "", lower[PATH_MAX];
    if (toml) {
        runtime_key(toml, "lower_runtime", lower_name, sizeof lower_name);
        runtime_key(toml, "default_class", default_class, sizeof default_class);
    }
    if (sub > 0 && (!strcmp(argv[sub], "create") || !strcmp(argv[sub], "run"))) {
        char spec_path[PATH_MAX];
        snprintf(spec_path, sizeof spec_path, "%s/config.json", bundle ? bundle : ".");
        char *spec = read_file(spec_path, 16 << 20, NULL);
        int wanted = spec && (strstr(spec, "TGS_CLASS=") || strstr(spec, "\"tgs.class\"") ||
                              (default_class[0] && strstr(spec, "NVIDIA_VISIBLE_DEVICES=")));
        free(spec);
        if (wanted || !spec) { /* no readable config.json: let the Python part say so clearly */
            char self[PATH_MAX], create[PATH_MAX];
            ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
            if (len > 0) {
                self[len] = 0;
                snprintf(create, sizeof create, "%s/tgs-runtime-create", dirname(self));
                if (!spec && access(create, X_OK) != 0)
                    goto lower_runtime;
                argv[0] = create;
                execv(create, argv);
                char msg[PATH_MAX + 128];
                snprintf(msg, sizeof msg, "cannot run %s: %s (reinstall with `tgs setup docker`)", create, strerror(errno));
                report(msg);
                return 127;
            }
        }
    }
lower_runtime:
    if (!find_in_path(lower_name, lower, sizeof lower)) {
        char msg[PATH_MAX + 256];
        snprintf(msg, sizeof msg, "the lower runtime %s was not found (config %s, [runtime] lower_runtime)", lower_name,
                 tgs_config);
        report(msg);
        return 127;
    }
    out[0] = lower;
    execv(lower, out);
    char msg[PATH_MAX + 128];
    snprintf(msg, sizeof msg, "cannot run %s: %s", lower, strerror(errno));
    report(msg);
    return 127;
}
