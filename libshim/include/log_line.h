/* log_line.h: how libtgs.so and simgpu log, one way for both: a level named by an
 * environment variable (TGS_LOG_LEVEL, SIMGPU_LOG), and each line on stderr as
 * "WHO[pid] level: message", written with one write(2) so that the lines of processes
 * sharing a terminal or a log file do not interleave. */
#ifndef LOG_LINE_H
#define LOG_LINE_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

enum { LOG_LINE_ERROR = 0, LOG_LINE_WARN = 1, LOG_LINE_INFO = 2, LOG_LINE_DEBUG = 3 };

/* The level the environment variable `var` names (error, warn or warning, info, debug; in
 * any case), else `otherwise` (unset, empty, or naming none of them). */
static inline int log_line_level(const char *var, int otherwise) {
    const char *v = getenv(var);
    if (!v)
        return otherwise;
    if (!strcasecmp(v, "error"))
        return LOG_LINE_ERROR;
    if (!strcasecmp(v, "warn") || !strcasecmp(v, "warning"))
        return LOG_LINE_WARN;
    if (!strcasecmp(v, "info"))
        return LOG_LINE_INFO;
    if (!strcasecmp(v, "debug"))
        return LOG_LINE_DEBUG;
    return otherwise;
}

/* Writes one line, "who[pid] level: " and the message, cut to 1 KiB. */
static inline void log_line(const char *who, int level, const char *fmt, va_list ap) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "%s[%d] %s: ", who, (int)getpid(), names[level]);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}

#endif
