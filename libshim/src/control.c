/* libtgs.so: the control block and activity files, GPUs by UUID, time, and logging. */
#define _GNU_SOURCE
#include "tgs.h"
#include "kernel_length.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---------- logging: stderr, warn and above unless TGS_LOG_LEVEL says otherwise ---------- */

int tgs_log_level = -1;

void tgs_log(int level, const char *fmt, ...) {
    if (tgs_log_level < 0)
        tgs_log_level = log_line_level("TGS_LOG_LEVEL", TGS_LOG_WARN);
    if (level > tgs_log_level)
        return;
    va_list ap;
    va_start(ap, fmt);
    log_line("tgs", level, fmt, ap);
    va_end(ap);
}

void tgs_fall_back(const char *why) {
    int was = __atomic_exchange_n(&g_tgs.mode, TGS_MODE_PASS, __ATOMIC_ACQ_REL);
    if (was == TGS_MODE_ACTIVE) {
        tgs_log(TGS_LOG_WARN, "running without TGS from now on (pass-through): %s", why);
        for (unsigned i = 0; i < TGS_MAX_GPUS; i++)
            if (g_tgs.gpu[i].budget)
                tgs_production_idle(&g_tgs.gpu[i]);
    }
}

/* ---------- time (clock.h) ---------- */

int tgs_heartbeat_age_ms(uint64_t now, uint64_t *age_ms) {
    uint64_t hb = g_tgs.daemon->heartbeat_ns;
    uint32_t stale = g_tgs.daemon->stale_ms ? g_tgs.daemon->stale_ms : 2000;
    *age_ms = !hb ? UINT64_MAX : hb >= now ? 0 : (now - hb) / 1000000ull;
    return *age_ms > stale;
}

/* ---------- the control block ---------- */

static int check_header(const volatile struct tgs_control_header *h, char *why, size_t n) {
    if (h->magic != TGS_CONTROL_MAGIC) {
        snprintf(why, n, "bad magic %#x", h->magic);
        return -1;
    }
    if (h->version != TGS_PROTO_VERSION) {
        snprintf(why, n, "protocol version %u, this libtgs.so speaks %u", h->version, TGS_PROTO_VERSION);
        return -1;
    }
    if (h->size != TGS_CONTROL_SIZE || h->header_size != sizeof(struct tgs_control_header) ||
        h->daemon_offset != TGS_DAEMON_OFFSET || h->daemon_size != sizeof(struct tgs_daemon_part) ||
        h->shim_offset != TGS_SHIM_OFFSET || h->shim_size != sizeof(struct tgs_shim_part)) {
        snprintf(why, n, "layout does not match (size %u, parts at %u+%u and %u+%u)", h->size, h->daemon_offset,
                 h->daemon_size, h->shim_offset, h->shim_size);
        return -1;
    }
    return 0;
}

int tgs_control_open(void) {
    char path[600], why[900];
    snprintf(path, sizeof path, "%s/%s", g_tgs.dir, TGS_CONTROL_NAME);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, sizeof why, "cannot open the control block %s: %s", path, strerror(errno));
        tgs_fall_back(why);
        return -1;
    }
    off_t size = lseek(fd, 0, SEEK_END);
    if (size < (off_t)TGS_CONTROL_SIZE) {
        close(fd);
        snprintf(why, sizeof why, "the control block %s is truncated (%lld bytes)", path, (long long)size);
        tgs_fall_back(why);
        return -1;
    }
    void *ro = mmap(NULL, TGS_SHIM_OFFSET, PROT_READ, MAP_SHARED, fd, 0);
    void *rw = mmap(NULL, TGS_CONTROL_SIZE - TGS_SHIM_OFFSET, PROT_READ | PROT_WRITE, MAP_SHARED, fd, TGS_SHIM_OFFSET);
    close(fd);
    if (ro == MAP_FAILED || rw == MAP_FAILED) {
        snprintf(why, sizeof why, "cannot map the control block %s", path);
        tgs_fall_back(why);
        return -1;
    }
    const volatile struct tgs_control_header *h = ro;
    const volatile struct tgs_daemon_part *d = (const volatile void *)((const char *)ro + TGS_DAEMON_OFFSET);
    char detail[160] = "";
    int bad = check_header(h, detail, sizeof detail) < 0;
    if (!bad && (d->ngpus > TGS_MAX_GPUS || (d->cls != TGS_CLASS_PRODUCTION && d->cls != TGS_CLASS_OPPORTUNISTIC))) {
        snprintf(detail, sizeof detail, "class %u, %u GPUs", d->cls, d->ngpus);
        bad = 1;
    }
    if (bad) {
        munmap(ro, TGS_SHIM_OFFSET);
        munmap(rw, TGS_CONTROL_SIZE - TGS_SHIM_OFFSET);
        snprintf(why, sizeof why, "the control block %s is corrupt or of another version: %s", path, detail);
        tgs_fall_back(why);
        return -1;
    }
    g_tgs.header = h;
    g_tgs.daemon = d;
    g_tgs.shim = rw;
    g_tgs.cls = (int)d->cls;
    for (unsigned i = 0; i < TGS_MAX_GPUS; i++) {
        struct tgs_gpu *g = &g_tgs.gpu[i];
        g->slot = (int)i;
        g->budget = &d->gpu[i];
        g->ctr = &g_tgs.shim->gpu[i];
        g->pauses = (struct tgs_gpu_pauses *)((char *)g_tgs.shim + (TGS_PAUSES_OFFSET - TGS_SHIM_OFFSET)) + i;
        g->mark_busy_ns = (uint64_t *)((char *)g_tgs.shim + (offsetof(struct tgs_control, mark_busy_ns) - TGS_SHIM_OFFSET)) + i;
        pthread_mutex_init(&g->inflight_lock, NULL);
        g->time_every = TGS_TIME_EVERY;
        if (i < d->ngpus)
            tgs_map_activity(g);
    }
    tgs_log(TGS_LOG_INFO, "TGS %s container, %u GPU(s), control block %s",
            g_tgs.cls == TGS_CLASS_PRODUCTION ? "production" : "opportunistic", d->ngpus, path);
    return 0;
}

void tgs_map_activity(struct tgs_gpu *g) {
    char uuid[TGS_UUID_LEN], path[700];
    for (unsigned k = 0; k < TGS_UUID_LEN; k++)
        uuid[k] = g->budget->uuid[k];
    uuid[TGS_UUID_LEN - 1] = 0;
    snprintf(path, sizeof path, "%s/%s/%s", g_tgs.dir, TGS_ACTIVITY_DIR, uuid);
    int prod = g_tgs.cls == TGS_CLASS_PRODUCTION;
    int fd = open(path, (prod ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) {
        tgs_log(TGS_LOG_WARN, "cannot open the production activity file %s (%s): kernels on %s are not gated", path,
                strerror(errno), uuid);
        return;
    }
    void *p = mmap(NULL, TGS_ACTIVITY_SIZE, prod ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED || ((const struct tgs_activity *)p)->magic != TGS_ACTIVITY_MAGIC) {
        tgs_log(TGS_LOG_WARN, "the activity file %s is not usable: kernels on %s are not gated", path, uuid);
        if (p != MAP_FAILED)
            munmap(p, TGS_ACTIVITY_SIZE);
        return;
    }
    struct tgs_activity *a = p;
    g->activity = a->busy;
    g->expect = a->expect;
    g->step_spell = a->step_spell_ns;
    g->expect_slots = &a->expect_slots;
    if (prod)
        g->activity_rw = a->busy;
}

/* ---------- GPUs ---------- */

void tgs_format_uuid(const unsigned char b[16], char out[TGS_UUID_LEN]) {
    snprintf(out, TGS_UUID_LEN, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

struct tgs_gpu *tgs_gpu_of_uuid(const CUuuid *uuid) {
    char want[TGS_UUID_LEN];
    tgs_format_uuid((const unsigned char *)uuid->bytes, want);
    for (unsigned i = 0; i < g_tgs.daemon->ngpus && i < TGS_MAX_GPUS; i++) {
        char have[TGS_UUID_LEN];
        for (unsigned k = 0; k < TGS_UUID_LEN; k++)
            have[k] = g_tgs.gpu[i].budget->uuid[k];
        have[TGS_UUID_LEN - 1] = 0;
        if (!strcmp(have, want))
            return &g_tgs.gpu[i];
    }
    return NULL;
}

#define TGS_MAX_ORDINALS 64
static struct tgs_gpu *g_by_ordinal[TGS_MAX_ORDINALS];
static int g_ordinal_known[TGS_MAX_ORDINALS];
unsigned tgs_ctx_generation; /* bumped when a context may have been destroyed */

/* Per-thread cache of the current context's GPU. Initial-exec TLS: an offset from the
 * thread pointer, resolved when the library is loaded, so the library needs nothing from
 * ld.so itself (no __tls_get_addr, which the general TLS model calls on every access).
 * The library is preloaded, so its few bytes come from the static TLS block. */
struct ctx_cache {
    CUcontext ctx;
    struct tgs_gpu *gpu;
    unsigned generation;
};
static __thread struct ctx_cache t_cache __attribute__((tls_model("initial-exec")));

struct tgs_gpu *tgs_gpu_of_device(CUdevice dev) {
    if (dev >= 0 && dev < TGS_MAX_ORDINALS && __atomic_load_n(&g_ordinal_known[dev], __ATOMIC_ACQUIRE))
        return g_by_ordinal[dev];
    CUuuid uuid;
    CUresult r = real_cuDeviceGetUuid_v2 ? real_cuDeviceGetUuid_v2(&uuid, dev)
                 : real_cuDeviceGetUuid  ? real_cuDeviceGetUuid(&uuid, dev)
                                         : CUDA_ERROR_NOT_SUPPORTED;
    if (r != CUDA_SUCCESS)
        return NULL;
    struct tgs_gpu *g = tgs_gpu_of_uuid(&uuid);
    if (!g) {
        char s[TGS_UUID_LEN];
        tgs_format_uuid((const unsigned char *)uuid.bytes, s);
        tgs_log(TGS_LOG_WARN, "device %d (%s) is not one of this container's TGS GPUs: its work is not shared", dev, s);
    }
    if (dev >= 0 && dev < TGS_MAX_ORDINALS) {
        g_by_ordinal[dev] = g;
        __atomic_store_n(&g_ordinal_known[dev], 1, __ATOMIC_RELEASE);
    }
    return g;
}

/* The GPU of the calling thread's current context (cached per thread). */
struct tgs_gpu *tgs_current_gpu_in(CUcontext *ctx) {
    CUcontext c = NULL;
    if (real_cuCtxGetCurrent(&c) != CUDA_SUCCESS || !c)
        return NULL;
    if (ctx)
        *ctx = c;
    unsigned gen = __atomic_load_n(&tgs_ctx_generation, __ATOMIC_RELAXED);
    struct ctx_cache *tc = &t_cache;
    if (likely(c == tc->ctx && tc->generation == gen))
        return tc->gpu;
    CUdevice dev;
    if (real_cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return NULL;
    struct tgs_gpu *g = tgs_gpu_of_device(dev);
    tc->gpu = g;
    tc->ctx = c;
    tc->generation = gen;
    return g;
}

/* A context may have been destroyed: what was cached per context is looked up again. */
void tgs_forget_contexts(void) { __atomic_add_fetch(&tgs_ctx_generation, 1, __ATOMIC_RELAXED); }

