/* See rt.h. */
#define _GNU_SOURCE
#include "rt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_FRAME (64u << 10)

char *rt_read_fd(int fd, size_t max, size_t *len) {
    char *buf = malloc(max + 1);
    size_t n = 0;
    ssize_t r;
    while (buf && n < max && ((r = read(fd, buf + n, max - n)) > 0 || (r < 0 && errno == EINTR)))
        if (r > 0)
            n += (size_t)r;
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = n;
    }
    return buf;
}

char *rt_read_file(const char *path, size_t max, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *buf = rt_read_fd(fd, max, len);
    close(fd);
    return buf;
}

/* ---------- config.toml: only the keys the launcher and the hook need ---------- */

const char *rt_config_path(const char *given, int *named) {
    if (!given || !*given)
        given = getenv("TGS_CONFIG");
    *named = given && *given;
    return *named ? given : RT_DEFAULT_CONFIG;
}

int rt_config_key(const char *toml, const char *section, const char *key, int index, char *out, size_t cap) {
    int inside = 0;
    size_t klen = strlen(key), slen = strlen(section);
    for (const char *line = toml; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        while (*line == ' ' || *line == '\t')
            line++;
        if (*line == '[') { /* [section], or [ section ] */
            const char *name = line + 1 + strspn(line + 1, " \t");
            inside = !strncmp(name, section, slen) && name[slen + strspn(name + slen, " \t")] == ']';
            continue;
        }
        if (!inside || strncmp(line, key, klen) || (line[klen] != ' ' && line[klen] != '=' && line[klen] != '\t'))
            continue;
        const char *p = line + klen + strspn(line + klen, " \t");
        if (*p != '=')
            return 0;
        p += 1 + strspn(p + 1, " \t");
        int list = *p == '[';
        p += list;
        for (int i = 0;; i++) {
            while (list && *p && strchr(" \t\r\n,#", *p)) /* to the next string, past commas, line ends, comments */
                p = *p == '#' ? p + strcspn(p, "\n") : p + 1;
            if (*p != '"' && *p != '\'') /* a basic or a literal string (no escapes in ours) */
                return 0;
            const char *e = strchr(p + 1, *p);
            if (!e || memchr(p, '\n', (size_t)(e - p)))
                return 0;
            if (i == index) {
                if ((size_t)(e - p - 1) >= cap)
                    return 0;
                memcpy(out, p + 1, (size_t)(e - p - 1));
                out[e - p - 1] = 0;
                return 1;
            }
            if (!list)
                return 0;
            p = e + 1;
        }
    }
    return 0;
}

/* ---------- JSON: escape a string; find a top-level member; decode a string ---------- */

int rt_json_escape(const char *in, char *out, size_t cap) {
    size_t j = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
        char tmp[8];
        int n;
        if (*p == '"' || *p == '\\')
            n = snprintf(tmp, sizeof tmp, "\\%c", *p);
        else if (*p < 0x20)
            n = snprintf(tmp, sizeof tmp, "\\u%04x", *p);
        else
            n = snprintf(tmp, sizeof tmp, "%c", *p);
        if (j + (size_t)n >= cap)
            return 0;
        memcpy(out + j, tmp, (size_t)n);
        j += (size_t)n;
    }
    out[j] = 0;
    return 1;
}

static const char *ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

static int hex4(const char *p, unsigned *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0') : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                   : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16u;
        if (d > 15)
            return 0;
        *v = *v * 16 + d;
    }
    return 1;
}

static int put(char *out, size_t cap, size_t *j, unsigned cp) {
    char b[4];
    size_t n;
    if (cp < 0x80) { b[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { b[0] = (char)(0xc0 | cp >> 6); b[1] = (char)(0x80 | (cp & 0x3f)); n = 2; }
    else if (cp < 0x10000) { b[0] = (char)(0xe0 | cp >> 12); b[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); b[2] = (char)(0x80 | (cp & 0x3f)); n = 3; }
    else { b[0] = (char)(0xf0 | cp >> 18); b[1] = (char)(0x80 | ((cp >> 12) & 0x3f)); b[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); b[3] = (char)(0x80 | (cp & 0x3f)); n = 4; }
    if (out) {
        if (*j + n >= cap)
            return 0;
        memcpy(out + *j, b, n);
    }
    *j += n;
    return 1;
}

/* Past the string at p (at its '"'), decoding into out when out is not NULL; NULL if malformed. */
static const char *string_at(const char *p, char *out, size_t cap) {
    size_t j = 0;
    if (*p++ != '"')
        return NULL;
    for (;;) {
        unsigned char c = (unsigned char)*p++;
        if (!c || c < 0x20)
            return NULL;
        if (c == '"')
            break;
        if (c != '\\') {
            if (out) {
                if (j + 1 >= cap)
                    return NULL;
                out[j] = (char)c;
            }
            j++;
            continue;
        }
        unsigned cp;
        switch (*p++) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (!hex4(p, &cp))
                return NULL;
            p += 4;
            if (cp >= 0xd800 && cp < 0xdc00 && p[0] == '\\' && p[1] == 'u') {
                unsigned lo;
                if (hex4(p + 2, &lo) && lo >= 0xdc00 && lo < 0xe000) {
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    p += 6;
                }
            }
            break;
        default:
            return NULL;
        }
        if (!put(out, cap, &j, cp))
            return NULL;
    }
    if (out)
        out[j] = 0;
    return p;
}

/* Past the value at p; NULL if malformed. */
static const char *skip(const char *p, int depth) {
    p = ws(p);
    if (depth > 64)
        return NULL;
    if (*p == '"')
        return string_at(p, NULL, 0);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = ws(p + 1);
        if (*p == close)
            return p + 1;
        for (;;) {
            if (close == '}') {
                if (!(p = string_at(ws(p), NULL, 0)) || *(p = ws(p)) != ':')
                    return NULL;
                p++;
            }
            if (!(p = skip(p, depth + 1)))
                return NULL;
            p = ws(p);
            if (*p == close)
                return p + 1;
            if (*p++ != ',')
                return NULL;
        }
    }
    const char *start = p;
    while (*p && !strchr(",}] \t\r\n", *p))
        p++;
    return p > start ? p : NULL;
}

const char *rt_json_member(const char *json, const char *key) {
    const char *p = ws(json);
    if (*p++ != '{')
        return NULL;
    p = ws(p);
    if (*p == '}')
        return NULL;
    for (;;) {
        char name[256];
        const char *after = string_at(ws(p), name, sizeof name);
        if (!after) { /* a name too long to be ours: skip it */
            if (!(after = string_at(ws(p), NULL, 0)))
                return NULL;
            name[0] = 0;
        }
        p = ws(after);
        if (*p++ != ':')
            return NULL;
        p = ws(p);
        if (!strcmp(name, key))
            return p;
        if (!(p = skip(p, 1)))
            return NULL;
        p = ws(p);
        if (*p++ != ',')
            return NULL;
    }
}

int rt_json_string(const char *value, char *out, size_t cap) {
    return value && *value == '"' && string_at(value, out, cap) != NULL;
}

/* ---------- the admin socket ---------- */

static int send_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int recv_all(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            errno = ECONNRESET;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

enum rt_admin rt_admin_call(const char *state_dir, const char *request, int timeout_s, char *msg, size_t cap) {
    char path[sizeof(((struct sockaddr_un *)0)->sun_path) + 64];
    snprintf(path, sizeof path, "%s/%s", state_dir, RT_ADMIN_SOCKET);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) {
        snprintf(msg, cap, "the admin socket path %s is too long (use a shorter [daemon] state_dir)", path);
        return RT_ADMIN_BROKEN;
    }
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(msg, cap, "cannot make a socket: %s", strerror(errno));
        return RT_ADMIN_BROKEN;
    }
    struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    enum rt_admin rc = RT_ADMIN_BROKEN;
    char *body = NULL;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR) {
            snprintf(msg, cap, "tgsd is not running (no %s): start it with `systemctl start tgsd`", path);
            rc = RT_ADMIN_ABSENT;
        } else if (e == ECONNREFUSED) {
            snprintf(msg, cap, "tgsd is not running (%s refuses connections): start it with `systemctl start tgsd`",
                     path);
            rc = RT_ADMIN_ABSENT;
        } else if (e == EACCES || e == EPERM) {
            snprintf(msg, cap, "%s: permission denied (the admin socket is root's)", path);
        } else {
            snprintf(msg, cap, "tgsd at %s did not answer properly: %s", path, strerror(e));
        }
        goto out;
    }
    uint32_t n = (uint32_t)strlen(request); /* little-endian hosts only, as the shim */
    if (n > MAX_FRAME || send_all(fd, &n, 4) || send_all(fd, request, n) || recv_all(fd, &n, 4)) {
        snprintf(msg, cap, "tgsd at %s did not answer properly: %s", path,
                 errno == EAGAIN ? "no answer in time" : strerror(errno));
        goto out;
    }
    if (n > MAX_FRAME || !(body = malloc(n + 1)) || recv_all(fd, body, n)) {
        snprintf(msg, cap, "tgsd at %s did not answer properly: a reply of %u bytes", path, n);
        goto out;
    }
    body[n] = 0;
    const char *ok = rt_json_member(body, "ok");
    if (ok && !strncmp(ok, "true", 4)) {
        msg[0] = 0;
        rc = RT_ADMIN_OK;
    } else if (ok && !strncmp(ok, "false", 5)) {
        if (!rt_json_string(rt_json_member(body, "error"), msg, cap))
            snprintf(msg, cap, "refused without a reason");
        rc = RT_ADMIN_REFUSED;
    } else {
        snprintf(msg, cap, "tgsd at %s did not answer properly: a reply without \"ok\"", path);
    }
out:
    free(body);
    close(fd);
    return rc;
}
