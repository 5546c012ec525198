/* simgpu: the accounting as JSON, for `tgs sim status` and the tests.
 * The schema is documented in docs/simgpu.md ("Accounting"). */
#define _GNU_SOURCE
#include "sim.h"

#include <stdio.h>
#include <string.h>

struct out {
    char *buf;
    size_t len, used;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->used < o->len ? o->len - o->used : 0;
    int n = vsnprintf(room ? o->buf + o->used : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->used += (size_t)n;
}

static void put_str(struct out *o, const char *s) {
    put(o, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            put(o, "\\%c", c);
        else if (c < 0x20)
            put(o, "\\u%04x", c);
        else
            put(o, "%c", c);
    }
    put(o, "\"");
}

static const char *ctx_state(uint32_t s) { return s == CTX_LIVE ? "live" : s == CTX_ENDED ? "ended" : "free"; }

/* Writes the status of the state at `state_path` (NULL: SIMGPU_STATE or the default) into
 * buf. Returns the length the whole document needs (call again with a larger buffer if
 * it is >= len), or -1 if the state cannot be read (the reason goes to stderr). */
int simgpu_status_json(const char *state_path, char *buf, size_t len) {
    if (sim_open_state_at(state_path, 0) < 0)
        return -1;
    struct sim_state *st = g_sim.st;
    struct out o = {buf, len, 0};
    uint64_t now = sim_now();
    put(&o, "{\"version\":%u,\"time_ns\":%llu,\"settings\":{\"devices\":%u,\"memory\":%llu,\"sm_count\":%u,"
            "\"timeslice_us\":%llu,\"time_scale\":%g},",
        st->version, (unsigned long long)now, st->set.devices, (unsigned long long)st->set.memory,
        st->set.sm_count, (unsigned long long)(st->set.timeslice_ns / 1000), st->set.time_scale);
    put(&o, "\"state\":");
    put_str(&o, g_sim.path);
    put(&o, ",\"processes\":[");
    int firstp = 1;
    for (uint32_t i = 0; i < SIM_MAX_PROCS; i++) {
        struct sim_proc *p = &st->procs[i];
        if (p->state != PROC_LIVE || !sim_proc_alive(i, p->gen))
            continue;
        put(&o, "%s{\"slot\":%u,\"pid\":%d,\"label\":", firstp ? "" : ",", i, p->pid);
        put_str(&o, p->label);
        put(&o, "}");
        firstp = 0;
    }
    put(&o, "],\"devices\":[");
    for (uint32_t i = 0; i < st->set.devices; i++) {
        struct sim_device *d = &st->dev[i];
        sim_lock_device(d);
        eng_advance(d, now);
        sim_reclaim_dead(d, now);
        uint64_t dt, busy = sim_busy_since(d->util, d->util_head, d->busy_ns, now, 1000000000ull, &dt);
        put(&o, "%s{\"index\":%u,\"uuid\":", i ? "," : "", i);
        put_str(&o, d->uuid);
        put(&o, ",\"name\":");
        put_str(&o, d->name);
        put(&o,
            ",\"sm_count\":%u,\"memory_total\":%llu,\"memory_used\":%llu,\"device_bytes\":%llu,"
            "\"resident_bytes\":%llu,\"busy_ns\":%llu,\"utilization\":%.3f,\"context_switches\":%llu,"
            "\"contexts\":[",
            d->sm_count, (unsigned long long)d->total_mem,
            (unsigned long long)(d->device_bytes + d->resident_pages * SIM_PAGE),
            (unsigned long long)d->device_bytes, (unsigned long long)(d->resident_pages * SIM_PAGE),
            (unsigned long long)d->busy_ns, dt ? (double)busy / (double)dt : 0.0,
            (unsigned long long)d->switches);
        int first = 1;
        for (uint32_t k = 0; k < d->ctx_hi; k++) {
            struct sim_ctx *c = &d->ctx[k];
            if (c->state == CTX_FREE)
                continue;
            put(&o, "%s{\"slot\":%u,\"state\":\"%s\",\"pid\":%d,\"label\":", first ? "" : ",", k, ctx_state(c->state),
                c->pid);
            first = 0;
            put_str(&o, c->label);
            uint64_t end = c->state == CTX_ENDED ? c->ended_ns : now;
            put(&o,
                ",\"age_s\":%.3f,\"busy_ns\":%llu,\"kernels\":%llu,\"blocks\":%llu,\"queued\":%llu,"
                "\"device_bytes\":%llu,\"resident_bytes\":%llu,\"pages_in\":%llu,\"pages_out\":%llu,"
                "\"remote_bytes\":%llu,\"migrate_ns\":%llu,\"waited_ns\":%llu}",
                (double)(end - c->created_ns) / 1e9, (unsigned long long)c->busy_ns, (unsigned long long)c->kernels,
                (unsigned long long)c->blocks, (unsigned long long)(c->tail - c->head),
                (unsigned long long)c->device_bytes, (unsigned long long)(c->resident_pages * SIM_PAGE),
                (unsigned long long)c->pages_in, (unsigned long long)c->pages_out,
                (unsigned long long)c->remote_bytes, (unsigned long long)c->migrate_ns,
                (unsigned long long)c->waited_ns);
        }
        sim_unlock_device(d);
        put(&o, "]}");
    }
    put(&o, "]}");
    if (o.used < len)
        buf[o.used] = 0;
    return (int)o.used;
}
