/* simgpu: the shared state file, settings, process slots, liveness and reclaim. */
#define _GNU_SOURCE
#include "sim.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct sim_global g_sim = {.fd = -1, .my_slot = -1, .log_level = SIM_LOG_WARN};

void sim_log(int level, const char *fmt, ...) {
    if (level > g_sim.log_level)
        return;
    va_list ap;
    va_start(ap, fmt);
    log_line("simgpu", level, fmt, ap);
    va_end(ap);
}

uint64_t sim_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void sim_sleep_until(uint64_t t_ns) {
    struct timespec ts = {.tv_sec = (time_t)(t_ns / 1000000000ull), .tv_nsec = (long)(t_ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* "16G", "512M", "64K", "16GiB", "16GB" (binary units) or a byte count. */
int sim_parse_size(const char *s, uint64_t *out) {
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    uint64_t mult = 1;
    switch (toupper((unsigned char)*end)) {
    case '\0': break;
    case 'K': mult = 1ull << 10; end++; break;
    case 'M': mult = 1ull << 20; end++; break;
    case 'G': mult = 1ull << 30; end++; break;
    case 'T': mult = 1ull << 40; end++; break;
    default: return -1;
    }
    if (mult > 1) {
        if (*end == 'i' || *end == 'I')
            end++;
        if (*end == 'b' || *end == 'B')
            end++;
    }
    if (*end)
        return -1;
    double bytes = v * (double)mult;
    if (bytes > 9.0e18)
        return -1;
    *out = (uint64_t)bytes;
    return 0;
}

static int parse_uint(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Reads the SIMGPU_* settings. Every error names the variable, the value and what is allowed. */
static int read_settings(struct sim_settings *set) {
    const char *v;
    long n;
    set->devices = 1;
    set->sm_count = 108;
    set->memory = 16ull << 30;
    set->timeslice_ns = 2000000;
    set->time_scale = 1.0;
    if ((v = getenv("SIMGPU_DEVICES")) && *v) {
        if (parse_uint(v, 1, SIM_MAX_DEVICES, &n)) {
            sim_log(SIM_LOG_ERROR, "SIMGPU_DEVICES=%s is not a device count from 1 to %d", v, SIM_MAX_DEVICES);
            return -1;
        }
        set->devices = (uint32_t)n;
    }
    if ((v = getenv("SIMGPU_MEMORY")) && *v) {
        uint64_t b;
        if (sim_parse_size(v, &b) || b < SIM_PAGE || b > (4ull << 40)) {
            sim_log(SIM_LOG_ERROR,
                    "SIMGPU_MEMORY=%s is not a memory size between 2M and 4T per device (use e.g. 16G, 512M or a byte count)",
                    v);
            return -1;
        }
        set->memory = b / SIM_PAGE * SIM_PAGE;
    }
    if ((v = getenv("SIMGPU_SM_COUNT")) && *v) {
        if (parse_uint(v, 1, 1024, &n)) {
            sim_log(SIM_LOG_ERROR, "SIMGPU_SM_COUNT=%s is not an SM count from 1 to 1024", v);
            return -1;
        }
        set->sm_count = (uint32_t)n;
    }
    if ((v = getenv("SIMGPU_TIMESLICE_US")) && *v) {
        if (parse_uint(v, 50, 1000000, &n)) {
            sim_log(SIM_LOG_ERROR, "SIMGPU_TIMESLICE_US=%s is not a time slice from 50 to 1000000 microseconds", v);
            return -1;
        }
        set->timeslice_ns = (uint64_t)n * 1000;
    }
    if ((v = getenv("SIMGPU_TIME_SCALE")) && *v) {
        char *end;
        errno = 0;
        double d = strtod(v, &end);
        if (errno || end == v || *end || !(d >= 0.001 && d <= 1000.0)) {
            sim_log(SIM_LOG_ERROR, "SIMGPU_TIME_SCALE=%s is not a factor from 0.001 to 1000", v);
            return -1;
        }
        set->time_scale = d;
    }
    return 0;
}

static void read_log_level(void) { g_sim.log_level = log_line_level("SIMGPU_LOG", g_sim.log_level); }

static void init_mutex(pthread_mutex_t *m) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    /* The normal kind on purpose: thread ids collide across pid namespaces, and the
     * error-checking or recursive kinds would mistake another container's thread for
     * the owner. */
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_NORMAL);
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
}

static void make_uuid(struct sim_device *d, uint32_t index) {
    uint8_t *u = d->uuid_bytes;
    if (getrandom(u, 16, 0) != 16) {
        uint64_t t = sim_now() ^ ((uint64_t)getpid() << 32) ^ index;
        for (int i = 0; i < 16; i++)
            u[i] = (uint8_t)(t >> ((i % 8) * 8)) ^ (uint8_t)(i * 37);
    }
    u[6] = (uint8_t)((u[6] & 0x0f) | 0x40);
    u[8] = (uint8_t)((u[8] & 0x3f) | 0x80);
    snprintf(d->uuid, sizeof d->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

static uint64_t layout_size(const struct sim_settings *set, uint64_t *frames_off, uint32_t *nframes) {
    uint64_t off = (sizeof(struct sim_state) + 4095) & ~4095ull;
    *frames_off = off;
    *nframes = (uint32_t)(set->memory / SIM_PAGE);
    uint64_t per = ((uint64_t)*nframes * sizeof(struct sim_frame) + 4095) & ~4095ull;
    return off + per * set->devices;
}

static void init_state(struct sim_state *st, const struct sim_settings *set, uint64_t size) {
    uint64_t frames_off;
    uint32_t nframes;
    layout_size(set, &frames_off, &nframes);
    uint64_t per = ((uint64_t)nframes * sizeof(struct sim_frame) + 4095) & ~4095ull;
    st->version = SIM_STATE_VERSION;
    st->header_size = sizeof(struct sim_state);
    st->file_size = size;
    st->created_ns = sim_now();
    st->set = *set;
    init_mutex(&st->proc_lock);
    for (uint32_t i = 0; i < set->devices; i++) {
        struct sim_device *d = &st->dev[i];
        init_mutex(&d->lock);
        snprintf(d->name, sizeof d->name, "simgpu A100 (simulated)");
        make_uuid(d, i);
        d->sm_count = set->sm_count;
        d->cc_major = 8;
        d->cc_minor = 0;
        d->total_mem = set->memory;
        d->nframes = nframes;
        d->frames_off = frames_off + per * i;
        d->cur = -1;
        d->last = -1;
        d->sim_ns = sim_now();
    }
    __atomic_store_n(&st->magic, SIM_MAGIC, __ATOMIC_RELEASE);
}

struct sim_frame *sim_frames(struct sim_device *d) {
    return (struct sim_frame *)((char *)g_sim.st + d->frames_off);
}

/* Device lists like NVIDIA_VISIBLE_DEVICES: "all", "none", "0,1", "GPU-uuid[,...]" (prefixes
 * allowed). Entries index into base[0..nbase). Stops at the first entry that names no device,
 * as CUDA_VISIBLE_DEVICES does. */
static int parse_device_list(const char *spec, const int *base, int nbase, int *out) {
    if (!spec || !strcmp(spec, "all")) {
        for (int i = 0; i < nbase; i++)
            out[i] = base[i];
        return nbase;
    }
    int n = 0;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok && n < SIM_MAX_DEVICES; tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok))
            tok++;
        int found = -1;
        long idx;
        if (parse_uint(tok, 0, 1000, &idx) == 0) {
            if (idx < nbase)
                found = base[idx];
        } else if (!strncmp(tok, "GPU-", 4) && strlen(tok) > 4) {
            for (int i = 0; i < nbase; i++)
                if (!strncmp(g_sim.st->dev[base[i]].uuid, tok, strlen(tok)))
                    found = base[i];
        }
        if (found < 0)
            break;
        int dup = 0;
        for (int i = 0; i < n; i++)
            dup |= out[i] == found;
        if (dup)
            break;
        out[n++] = found;
    }
    return n;
}

static void parse_visible(void) {
    int all[SIM_MAX_DEVICES];
    int ndev = (int)g_sim.st->set.devices;
    for (int i = 0; i < ndev; i++)
        all[i] = i;
    const char *nv = getenv("SIMGPU_VISIBLE_DEVICES");
    if (nv && (!strcmp(nv, "none") || !strcmp(nv, "void") || !*nv))
        g_sim.nml_visible = 0;
    else
        g_sim.nml_visible = parse_device_list(nv, all, ndev, g_sim.nml_map);
    g_sim.nvisible = parse_device_list(getenv("CUDA_VISIBLE_DEVICES"), g_sim.nml_map, g_sim.nml_visible,
                                       g_sim.visible);
}

int sim_open_state(void) { return sim_open_state_at(NULL, 1); }

/* Maps the state file (path NULL: SIMGPU_STATE, else the default), creating it from the
 * SIMGPU_* settings when `create` is set. Returns 0, -1 for a bad setting, -2 otherwise. */
int sim_open_state_at(const char *path, int create) {
    if (g_sim.initialised && path && strcmp(path, g_sim.path) && g_sim.my_slot < 0) {
        /* a reader (tgs sim status) moving to another state file */
        munmap(g_sim.st, (size_t)g_sim.st->file_size);
        close(g_sim.fd);
        g_sim.st = NULL;
        g_sim.fd = -1;
        g_sim.initialised = 0;
    }
    if (g_sim.initialised)
        return 0;
    read_log_level();
    const char *fault = getenv("SIMGPU_FAULT");
    g_sim.fault_drop_writeback = fault && strstr(fault, "drop-writeback");
    g_sim.fault_slow_launch = fault && strstr(fault, "slow-launch");
    g_sim.fault_copy_pages = fault && strstr(fault, "copy-pages");
    g_sim.fault_long_timings = fault && strstr(fault, "long-timings");
    struct sim_settings set;
    if (read_settings(&set))
        return -1;
    if (!path)
        path = getenv("SIMGPU_STATE");
    if (!path || !*path)
        path = SIM_DEFAULT_STATE;
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0666);
    if (fd < 0) {
        sim_log(SIM_LOG_ERROR, "cannot open the state file %s (SIMGPU_STATE): %s", path, strerror(errno));
        return -2;
    }
    if (flock(fd, LOCK_EX) < 0) {
        sim_log(SIM_LOG_ERROR, "cannot lock the state file %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    struct stat sb;
    fstat(fd, &sb);
    struct sim_state *st = NULL;
    int fresh = 0;
    if ((uint64_t)sb.st_size >= sizeof(struct sim_state)) {
        st = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (st == MAP_FAILED) {
            sim_log(SIM_LOG_ERROR, "cannot map the state file %s: %s", path, strerror(errno));
            goto fail;
        }
        if (st->magic != SIM_MAGIC) {
            munmap(st, (size_t)sb.st_size);
            st = NULL;
            fresh = 1;
        } else if (st->version != SIM_STATE_VERSION || st->header_size != sizeof(struct sim_state) ||
                   st->file_size != (uint64_t)sb.st_size) {
            sim_log(SIM_LOG_ERROR,
                    "the state file %s was made by another simgpu version (%u, this one is %u): "
                    "remove it once no process uses it",
                    path, st->version, SIM_STATE_VERSION);
            munmap(st, (size_t)sb.st_size);
            goto fail;
        }
    } else {
        fresh = 1;
    }
    if (fresh && !create) {
        sim_log(SIM_LOG_ERROR, "%s is not a simgpu state file (no simulated GPU has been used with it yet)", path);
        goto fail;
    }
    if (fresh) {
        uint64_t frames_off;
        uint32_t nframes;
        uint64_t size = layout_size(&set, &frames_off, &nframes);
        if (ftruncate(fd, 0) < 0 || ftruncate(fd, (off_t)size) < 0) {
            sim_log(SIM_LOG_ERROR, "cannot size the state file %s: %s", path, strerror(errno));
            goto fail;
        }
        fchmod(fd, 0666);
        st = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (st == MAP_FAILED) {
            sim_log(SIM_LOG_ERROR, "cannot map the state file %s: %s", path, strerror(errno));
            goto fail;
        }
        init_state(st, &set, size);
        sim_log(SIM_LOG_INFO, "created %s: %u device(s) of %llu MiB", path, set.devices,
                (unsigned long long)(set.memory >> 20));
    }
    flock(fd, LOCK_UN);
    g_sim.st = st;
    g_sim.fd = fd;
    snprintf(g_sim.path, sizeof g_sim.path, "%s", path);
    parse_visible();
    __atomic_store_n(&g_sim.initialised, 1, __ATOMIC_RELEASE);
    return 0;
fail:
    flock(fd, LOCK_UN);
    close(fd);
    return -2;
}

static void lock_robust(pthread_mutex_t *m, struct sim_device *d) {
    int r = pthread_mutex_lock(m);
    if (r == EOWNERDEAD) {
        /* A process died holding the lock, maybe mid-update: put the invariants back. */
        if (d) {
            for (uint32_t i = 0; i < SIM_MAX_CTX; i++) {
                struct sim_ctx *c = &d->ctx[i];
                if (c->head > c->tail || c->tail - c->head > SIM_QCAP)
                    c->head = c->tail;
            }
            d->live_mask = 0;
            for (uint32_t i = 0; i < SIM_MAX_CTX; i++)
                if (d->ctx[i].state == CTX_LIVE)
                    d->live_mask |= 1ull << i;
            if (d->cur >= SIM_MAX_CTX)
                d->cur = -1;
            if (d->last >= SIM_MAX_CTX)
                d->last = -1;
            d->live_check_ns = 0; /* look for the dead soon */
        }
        sim_log(SIM_LOG_WARN, "a process died holding a simgpu lock; state repaired");
        pthread_mutex_consistent(m);
    } else if (r != 0) {
        sim_log(SIM_LOG_ERROR, "simgpu lock failed: %s", strerror(r));
    }
}

void sim_lock_device(struct sim_device *d) { lock_robust(&d->lock, d); }
void sim_unlock_device(struct sim_device *d) { pthread_mutex_unlock(&d->lock); }

/* Liveness by lock, never by pid: each registered process holds an open-file-description
 * lock on one byte of the state file; the kernel drops it when the process dies. */
int sim_proc_alive(uint32_t slot, uint32_t gen) {
    struct sim_state *st = g_sim.st;
    if (slot >= SIM_MAX_PROCS)
        return 0;
    if ((int)slot == g_sim.my_slot && gen == g_sim.my_gen && !g_sim.forked)
        return 1;
    if (__atomic_load_n(&st->procs[slot].gen, __ATOMIC_ACQUIRE) != gen ||
        __atomic_load_n(&st->procs[slot].state, __ATOMIC_ACQUIRE) != PROC_LIVE)
        return 0;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = SIM_LOCK_BASE + slot, .l_len = 1};
    if (fcntl(g_sim.fd, F_OFD_GETLK, &fl) < 0)
        return 1;
    return fl.l_type != F_UNLCK;
}

void sim_end_ctx(struct sim_device *d, uint32_t slot, uint64_t now) {
    struct sim_ctx *c = &d->ctx[slot];
    if (c->state != CTX_LIVE)
        return;
    c->head = c->tail;
    c->state = CTX_ENDED;
    d->live_mask &= ~(1ull << slot);
    c->ended_ns = now;
    if (d->cur == (int32_t)slot)
        d->cur = -1;
    d->device_bytes -= c->device_bytes < d->device_bytes ? c->device_bytes : d->device_bytes;
    c->device_bytes = 0;
    struct sim_frame *f = sim_frames(d);
    for (uint32_t i = 0; i < d->nframes; i++) {
        if (f[i].state == FRAME_USED && f[i].ctx == slot) {
            f[i].state = FRAME_FREE;
            f[i].gen++;
            d->resident_pages--;
        }
    }
    c->resident_pages = 0;
}

void sim_reclaim_dead(struct sim_device *d, uint64_t now) {
    for (uint32_t i = 0; i < d->ctx_hi; i++) {
        struct sim_ctx *c = &d->ctx[i];
        if (c->state == CTX_LIVE && !sim_proc_alive(c->proc, c->proc_gen)) {
            sim_log(SIM_LOG_INFO, "reclaiming context %u of dead process %d (%s) on %s", i, c->pid, c->label,
                    d->uuid);
            sim_end_ctx(d, i, now);
        }
    }
    d->live_check_ns = now;
}

const char *sim_label(void) {
    static char label[64];
    if (!label[0]) {
        const char *v = getenv("SIMGPU_LABEL");
        if (v && *v) {
            snprintf(label, sizeof label, "%s", v);
        } else {
            char comm[32] = "?";
            int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                ssize_t n = read(fd, comm, sizeof comm - 1);
                close(fd);
                if (n > 0) {
                    comm[n] = 0;
                    comm[strcspn(comm, "\n")] = 0;
                }
            }
            snprintf(label, sizeof label, "%s", comm);
        }
    }
    return label;
}

static void child_after_fork(void) {
    /* The real driver refuses a fork() child of an initialised process. Drop the child's
     * reference to the liveness lock so the parent's death is still seen. */
    if (g_sim.my_slot >= 0) {
        g_sim.forked = 1;
        if (g_sim.fd >= 0)
            close(g_sim.fd);
        g_sim.fd = -1;
    }
}

int sim_register_process(void) {
    struct sim_state *st = g_sim.st;
    lock_robust(&st->proc_lock, NULL);
    int slot = -1;
    for (int i = 0; i < SIM_MAX_PROCS && slot < 0; i++) {
        struct sim_proc *p = &st->procs[i];
        if (p->state == PROC_LIVE && sim_proc_alive((uint32_t)i, p->gen))
            continue;
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = SIM_LOCK_BASE + i, .l_len = 1};
        if (fcntl(g_sim.fd, F_OFD_SETLK, &fl) < 0)
            continue; /* just being claimed by someone else */
        slot = i;
    }
    if (slot < 0) {
        pthread_mutex_unlock(&st->proc_lock);
        sim_log(SIM_LOG_ERROR, "all %d simgpu process slots are in use", SIM_MAX_PROCS);
        return -1;
    }
    struct sim_proc *p = &st->procs[slot];
    p->pid = (int32_t)getpid();
    snprintf(p->label, sizeof p->label, "%s", sim_label());
    __atomic_store_n(&p->gen, p->gen + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&p->state, PROC_LIVE, __ATOMIC_RELEASE);
    g_sim.my_slot = slot;
    g_sim.my_gen = p->gen;
    pthread_mutex_unlock(&st->proc_lock);
    /* Whatever a dead process left on the devices goes back now. */
    uint64_t now = sim_now();
    for (uint32_t i = 0; i < st->set.devices; i++) {
        sim_lock_device(&st->dev[i]);
        sim_reclaim_dead(&st->dev[i], now);
        sim_unlock_device(&st->dev[i]);
    }
    static int atfork_done;
    if (!atfork_done) {
        atfork_done = 1;
        pthread_atfork(NULL, NULL, child_after_fork);
    }
    return 0;
}

/* Utilisation history: a sample every 100 ms, for NVML's utilisation queries. */
void sim_sample_util(struct sim_device *d, uint64_t now) {
    const uint64_t period = 100000000ull;
    if (now < d->util[d->util_head % SIM_UTIL_SAMPLES].t_ns + period)
        return;
    d->util_head++;
    d->util[d->util_head % SIM_UTIL_SAMPLES] = (struct sim_sample){now, d->busy_ns};
    for (uint32_t i = 0; i < d->ctx_hi; i++) {
        struct sim_ctx *c = &d->ctx[i];
        if (c->state != CTX_LIVE)
            continue;
        c->util_head++;
        c->util[c->util_head % SIM_UTIL_SAMPLES] = (struct sim_sample){now, c->busy_ns};
    }
}

/* Busy time over (about) the last window_ns, from a sample ring; *dt_out gets the span. */
uint64_t sim_busy_since(const struct sim_sample *ring, uint32_t head, uint64_t busy_now, uint64_t now,
                        uint64_t window_ns, uint64_t *dt_out) {
    struct sim_sample best = {0, 0};
    int have = 0;
    for (uint32_t k = 0; k < SIM_UTIL_SAMPLES; k++) {
        const struct sim_sample *s = &ring[(head - k) % SIM_UTIL_SAMPLES];
        if (!s->t_ns || s->t_ns > now)
            break;
        best = *s;
        have = 1;
        if (now - s->t_ns >= window_ns)
            break;
    }
    if (!have || now <= best.t_ns) {
        *dt_out = 0;
        return 0;
    }
    *dt_out = now - best.t_ns;
    return busy_now >= best.busy_ns ? busy_now - best.busy_ns : 0;
}
