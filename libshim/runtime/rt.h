/* What tgs-runtime's launcher and tgs-hook share: the config file's keys, a little JSON,
 * and one framed request to tgsd's admin socket (ARCHITECTURE.md, "Framing"). */
#pragma once
#include <stddef.h>

#define RT_DEFAULT_CONFIG "/etc/tgs/config.toml"
#define RT_DEFAULT_STATE_DIR "/run/tgs"
#define RT_ADMIN_SOCKET "tgsd.sock"

/* At most `max` bytes, NUL-terminated (NULL if the file cannot be opened). */
char *rt_read_fd(int fd, size_t max, size_t *len);
char *rt_read_file(const char *path, size_t max, size_t *len);

/* The config file: `given` (--tgs-config), else $TGS_CONFIG, else the default; *named says
 * whether one was named (a named file must exist; a missing default means defaults), as
 * tgs_runtime.config.load decides. */
const char *rt_config_path(const char *given, int *named);

/* String number `index` (from 0) of `key` in [section], whose value is a string (index 0) or a
 * list of strings, on one line or several; into out, 1 if there is one. */
int rt_config_key(const char *toml, const char *section, const char *key, int index, char *out, size_t cap);

/* `in` as the inside of a JSON string; 0 when it does not fit. */
int rt_json_escape(const char *in, char *out, size_t cap);
/* The value of the top-level member `key` of a JSON object (nested members are skipped), or NULL. */
const char *rt_json_member(const char *json, const char *key);
/* A JSON string value, decoded (UTF-8) into out; 0 when `value` is not a string or does not fit. */
int rt_json_string(const char *value, char *out, size_t cap);

enum rt_admin {
    RT_ADMIN_OK,      /* tgsd answered ok */
    RT_ADMIN_REFUSED, /* tgsd answered no: msg is its reason */
    RT_ADMIN_ABSENT,  /* no tgsd listens there: msg says so and what to do */
    RT_ADMIN_BROKEN,  /* anything else: msg says what */
};
/* One JSON request (an object) to <state_dir>/tgsd.sock and its answer; msg gets the words. */
enum rt_admin rt_admin_call(const char *state_dir, const char *request, int timeout_s, char *msg, size_t cap);
