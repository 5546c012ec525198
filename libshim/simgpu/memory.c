/* simgpu: device memory, managed (unified) memory and the VMM calls.
 *
 * Device memory is real bytes in the process (a device pointer is the address of its
 * bytes), charged against the device's capacity in the shared state; beyond capacity
 * an allocation fails with CUDA_ERROR_OUT_OF_MEMORY, as on a real card.
 *
 * Managed memory lives in 2 MiB pages, each with a host copy (at the pointer the
 * application holds) and a device copy (a shadow mapping). A page is resident on the
 * device when it holds one of the device's frames in the shared frame table; data
 * really moves between the two copies on migration, and the copy left behind is
 * dropped. When the device is full, the frame of any context whose page became resident
 * first is taken (evicted; evict_one); its owner notices at its next access (the frame's
 * generation changed) and writes the device copy back to the host copy before using the
 * page.
 * Until then the device copy is still the page's only valid data, so nothing is lost
 * and no process ever touches another's memory.
 */
#define _GNU_SOURCE
#include "driver.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4 /* Linux 5.7; older headers lack it */
#endif

enum { AK_DEVICE = 1, AK_MANAGED, AK_RESERVE, AK_HOST };
enum { LOC_NONE = 0, LOC_HOST, LOC_DEV };
enum { PREF_NONE = 0, PREF_CPU, PREF_DEV };
#define ACCESS_CPU (1u << 31)

struct mpage {
    uint8_t loc, dev, pref, pref_dev;
    uint8_t read_mostly, pad[3];
    uint32_t accessed_by; /* bit per state device; ACCESS_CPU */
    uint32_t frame, frame_gen;
};

struct phys {
    uint32_t magic;
    int dev;
    struct sim_context *ctx;
    uint32_t ctx_slot, ctx_gen;
    size_t size;
    int memfd;
    int maps;
    int released;
};
#define OBJ_PHYS 0x50485931u

struct vmap {
    uintptr_t ptr;
    size_t size;
    struct phys *ph;
    struct vmap *next;
};

struct alloc {
    uintptr_t base;
    size_t size;
    void *map_base;
    size_t map_size;
    int kind;
    int dev;
    struct sim_context *ctx;
    uint32_t ctx_slot, ctx_gen;
    uint64_t id;
    size_t charged;
    unsigned char *shadow;
    uint32_t npages;
    struct mpage *pages;
    struct vmap *maps;
};

static pthread_mutex_t g_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc **g_allocs;
static size_t g_nallocs, g_cap;
static uint64_t g_next_id = 1;

void mem_init(void) {}

/* ---------- registry (g_mem_lock held) ---------- */

static size_t reg_lower(uintptr_t p) { /* first index with base > p */
    size_t lo = 0, hi = g_nallocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_allocs[mid]->base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct alloc *reg_find(uintptr_t p) {
    size_t i = reg_lower(p);
    if (i == 0)
        return NULL;
    struct alloc *a = g_allocs[i - 1];
    return p < a->base + a->size ? a : NULL;
}

static int reg_add(struct alloc *a) {
    if (g_nallocs == g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 64;
        struct alloc **n = realloc(g_allocs, cap * sizeof *n);
        if (!n)
            return -1;
        g_allocs = n;
        g_cap = cap;
    }
    size_t i = reg_lower(a->base);
    memmove(&g_allocs[i + 1], &g_allocs[i], (g_nallocs - i) * sizeof *g_allocs);
    g_allocs[i] = a;
    g_nallocs++;
    a->id = g_next_id++;
    return 0;
}

static void reg_remove(struct alloc *a) {
    for (size_t i = 0; i < g_nallocs; i++) {
        if (g_allocs[i] == a) {
            memmove(&g_allocs[i], &g_allocs[i + 1], (g_nallocs - i - 1) * sizeof *g_allocs);
            g_nallocs--;
            return;
        }
    }
}

static void *map_aligned(size_t size, size_t align, int prot, int extra_flags) {
    size_t len = size + align;
    unsigned char *p = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | extra_flags, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    uintptr_t a = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    if (a > (uintptr_t)p)
        munmap(p, a - (uintptr_t)p);
    size_t tail = (uintptr_t)p + len - (a + size);
    if (tail)
        munmap((void *)(a + size), tail);
    return (void *)a;
}

/* ---------- frames (device lock held) ---------- */

uint64_t mem_new_stamp(struct sim_device *d) {
    sim_lock_device(d);
    uint64_t s = ++d->op_clock;
    sim_unlock_device(d);
    return s;
}

static struct sim_ctx *frame_ctx(struct sim_device *d, struct sim_frame *f) { return &d->ctx[f->ctx]; }

static void frame_release(struct sim_device *d, struct sim_frame *f) {
    f->state = FRAME_FREE;
    f->gen++;
    d->resident_pages--;
    struct sim_ctx *c = frame_ctx(d, f);
    if (c->resident_pages)
        c->resident_pages--;
}

/* Takes the frame whose page became resident first, of those the current operation has
 * not touched. The order is the UVM driver's: its eviction list is kept in the order
 * chunks were made resident, not used (uvm_pmm_gpu.c, pick_root_chunk_to_evict: "TODO: Bug
 * 1765193: Move the chunks to the tail of the used list whenever they get mapped"), so a
 * page a job uses all the time is evicted in its turn; nor does it look at where a page's
 * owner prefers it. Returns 0 or -1 when nothing can be evicted. */
static int evict_one(struct sim_device *d, uint64_t stamp) {
    struct sim_frame *fr = sim_frames(d);
    int64_t best = -1;
    for (uint32_t i = 0; i < d->nframes; i++) {
        struct sim_frame *f = &fr[i];
        if (f->state != FRAME_USED || f->touched == stamp)
            continue;
        if (best < 0 || f->resident < fr[best].resident)
            best = i;
    }
    if (best < 0)
        return -1;
    struct sim_frame *f = &fr[best];
    frame_ctx(d, f)->pages_out++;
    frame_release(d, f);
    return 0;
}

static uint64_t frames_free(struct sim_device *d) {
    uint64_t usable = d->device_bytes >= d->total_mem ? 0 : (d->total_mem - d->device_bytes) / SIM_PAGE;
    return usable > d->resident_pages ? usable - d->resident_pages : 0;
}

/* A frame for a page of context slot `ctx`; may evict (each eviction costs *cost). */
static int frame_get(struct sim_device *d, uint32_t ctx, uint64_t stamp, int64_t *cost) {
    while (frames_free(d) == 0) {
        if (evict_one(d, stamp) < 0)
            return -1;
        *cost += sim_bytes_ns(SIM_PAGE, SIM_FAULT_GBPS);
    }
    struct sim_frame *fr = sim_frames(d);
    for (uint32_t k = 0; k < d->nframes; k++) {
        uint32_t i = (d->frame_hint + k) % d->nframes;
        if (fr[i].state == FRAME_FREE) {
            fr[i].state = FRAME_USED;
            fr[i].proc = (uint32_t)g_sim.my_slot;
            fr[i].proc_gen = g_sim.my_gen;
            fr[i].ctx = ctx;
            fr[i].resident = fr[i].touched = stamp;
            d->frame_hint = i + 1;
            d->resident_pages++;
            d->ctx[ctx].resident_pages++;
            return (int)i;
        }
    }
    return -1;
}

/* Makes more room for `bytes` of device memory by evicting managed pages. */
static int make_room(struct sim_device *d, uint64_t bytes) {
    if (d->device_bytes + bytes > d->total_mem)
        return -1;
    while (d->device_bytes + bytes + d->resident_pages * SIM_PAGE > d->total_mem)
        if (evict_one(d, 0) < 0)
            return -1;
    return 0;
}

/* ---------- managed pages (g_mem_lock held) ---------- */

static unsigned char *page_host(struct alloc *a, uint32_t i) { return (unsigned char *)a->base + (size_t)i * SIM_PAGE; }
static unsigned char *page_shadow(struct alloc *a, uint32_t i) { return a->shadow + (size_t)i * SIM_PAGE; }

/* Moves a page's bytes from one copy to the other; the copy left behind reads as zero. The
 * pages themselves are moved (their page tables, in a few microseconds): a copy of 2 MiB
 * took 0.4-0.6 ms of the host's CPU on a 2-core VM, longer than the move's modelled time
 * (SIM_FAULT_GBPS), so a thrashing job ran at the host's speed, not the model's. Where the
 * kernel cannot move them (MREMAP_DONTUNMAP came with Linux 5.7), or SIMGPU_FAULT says
 * copy-pages, they are copied. */
static void move_page(unsigned char *to, unsigned char *from) {
    if (!g_sim.fault_copy_pages) {
        if (mremap(from, SIM_PAGE, SIM_PAGE, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to) == (void *)to)
            return;
        if (errno == EINVAL)
            g_sim.fault_copy_pages = 1; /* not on this kernel: from now on, copies */
    }
    memcpy(to, from, SIM_PAGE);
    madvise(from, SIM_PAGE, MADV_DONTNEED); /* the copy left behind is gone */
}

static int page_valid_on_device(struct mpage *pg) {
    struct sim_device *d = &g_sim.st->dev[pg->dev];
    struct sim_frame *f = &sim_frames(d)[pg->frame];
    return f->state == FRAME_USED && f->gen == pg->frame_gen && f->proc == (uint32_t)g_sim.my_slot &&
           f->proc_gen == g_sim.my_gen;
}

/* Device lock of pg->dev held when pg->loc == LOC_DEV. If another process took the
 * page's frame, write the device copy back first. */
static void page_sync(struct alloc *a, uint32_t i) {
    struct mpage *pg = &a->pages[i];
    if (pg->loc != LOC_DEV || page_valid_on_device(pg))
        return;
    if (g_sim.fault_drop_writeback)
        madvise(page_shadow(a, i), SIM_PAGE, MADV_DONTNEED); /* injected fault: the write-back is lost */
    else
        move_page(page_host(a, i), page_shadow(a, i));
    pg->loc = LOC_HOST;
}

/* Moves a resident page to the host and frees its frame (device lock held). */
static void page_to_host(struct alloc *a, uint32_t i) {
    struct mpage *pg = &a->pages[i];
    page_sync(a, i);
    if (pg->loc != LOC_DEV)
        return;
    struct sim_device *d = &g_sim.st->dev[pg->dev];
    struct sim_frame *f = &sim_frames(d)[pg->frame];
    frame_ctx(d, f)->pages_out++;
    frame_release(d, f);
    if (g_sim.fault_drop_writeback)
        madvise(page_shadow(a, i), SIM_PAGE, MADV_DONTNEED);
    else
        move_page(page_host(a, i), page_shadow(a, i));
    pg->loc = LOC_HOST;
}

/* Brings a page onto device `dev` (device lock held). Returns 0, or -1 if no frame. */
static int page_to_device(struct alloc *a, uint32_t i, int dev, uint32_t ctx, uint64_t stamp, int64_t *cost,
                          double gbps) {
    struct mpage *pg = &a->pages[i];
    struct sim_device *d = &g_sim.st->dev[dev];
    if (pg->loc == LOC_DEV && pg->dev == dev) {
        sim_frames(d)[pg->frame].touched = stamp;
        return 0;
    }
    int fr = frame_get(d, ctx, stamp, cost);
    if (fr < 0)
        return -1;
    struct sim_frame *f = &sim_frames(d)[fr];
    if (pg->loc == LOC_HOST) {
        move_page(page_shadow(a, i), page_host(a, i));
        *cost += sim_bytes_ns(SIM_PAGE, gbps);
        d->ctx[ctx].pages_in++;
    }
    pg->loc = LOC_DEV;
    pg->dev = (uint8_t)dev;
    pg->frame = (uint32_t)fr;
    pg->frame_gen = f->gen;
    return 0;
}

/* ---------- allocation ---------- */

static struct alloc *new_alloc(int kind, struct sim_context *c) {
    struct alloc *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->kind = kind;
    a->ctx = c;
    if (c) {
        a->dev = c->dev;
        a->ctx_slot = c->slot;
        a->ctx_gen = c->gen;
    }
    return a;
}

static void uncharge(int dev, uint32_t slot, uint32_t gen, size_t bytes) {
    if (!bytes)
        return;
    struct sim_device *d = &g_sim.st->dev[dev];
    sim_lock_device(d);
    struct sim_ctx *c = &d->ctx[slot];
    if (c->state == CTX_LIVE && c->gen == gen) {
        c->device_bytes -= bytes <= c->device_bytes ? bytes : c->device_bytes;
        d->device_bytes -= bytes <= d->device_bytes ? bytes : d->device_bytes;
    }
    sim_unlock_device(d);
}

static CUresult charge(struct sim_context *c, size_t bytes) {
    struct sim_device *d = drv_device(c);
    sim_lock_device(d);
    eng_advance(d, sim_now());
    int r = make_room(d, bytes);
    if (r < 0) { /* maybe a dead process still holds memory */
        sim_reclaim_dead(d, sim_now());
        r = make_room(d, bytes);
    }
    if (r == 0) {
        d->device_bytes += bytes;
        d->ctx[c->slot].device_bytes += bytes;
    }
    sim_unlock_device(d);
    return r == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

CUresult mem_alloc_device(struct sim_context *c, size_t size, CUdeviceptr *out) {
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t charged = round_up(size, 4096);
    CUresult r = charge(c, charged);
    if (r != CUDA_SUCCESS)
        return r;
    struct alloc *a = new_alloc(AK_DEVICE, c);
    void *p = a ? map_aligned(charged, 4096, PROT_READ | PROT_WRITE, 0) : NULL;
    if (!p) {
        free(a);
        uncharge(c->dev, c->slot, c->gen, charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->base = (uintptr_t)p;
    a->size = size;
    a->map_base = p;
    a->map_size = charged;
    a->charged = charged;
    pthread_mutex_lock(&g_mem_lock);
    int rr = reg_add(a);
    pthread_mutex_unlock(&g_mem_lock);
    if (rr) {
        munmap(p, charged);
        free(a);
        uncharge(c->dev, c->slot, c->gen, charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = (CUdeviceptr)a->base;
    return CUDA_SUCCESS;
}

CUresult mem_alloc_managed(struct sim_context *c, size_t size, CUdeviceptr *out) {
    if (!out || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t mapped = round_up(size, SIM_PAGE);
    struct alloc *a = new_alloc(AK_MANAGED, c);
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->npages = (uint32_t)(mapped / SIM_PAGE);
    a->pages = calloc(a->npages, sizeof *a->pages);
    void *host = map_aligned(mapped, SIM_PAGE, PROT_READ | PROT_WRITE, 0);
    void *shadow = map_aligned(mapped, SIM_PAGE, PROT_READ | PROT_WRITE, 0);
    if (host && shadow) { /* 2 MiB pages: a page move is one fault and one copy, not 512 */
        madvise(host, mapped, MADV_HUGEPAGE);
        madvise(shadow, mapped, MADV_HUGEPAGE);
    }
    if (!a->pages || !host || !shadow) {
        if (host)
            munmap(host, mapped);
        if (shadow)
            munmap(shadow, mapped);
        free(a->pages);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->base = (uintptr_t)host;
    a->size = size;
    a->map_base = host;
    a->map_size = mapped;
    a->shadow = shadow;
    pthread_mutex_lock(&g_mem_lock);
    int rr = reg_add(a);
    pthread_mutex_unlock(&g_mem_lock);
    if (rr) {
        munmap(host, mapped);
        munmap(shadow, mapped);
        free(a->pages);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = (CUdeviceptr)a->base;
    return CUDA_SUCCESS;
}

static void release_pages(struct alloc *a) {
    for (uint32_t i = 0; i < a->npages; i++) {
        struct mpage *pg = &a->pages[i];
        if (pg->loc != LOC_DEV)
            continue;
        struct sim_device *d = &g_sim.st->dev[pg->dev];
        sim_lock_device(d);
        if (page_valid_on_device(pg))
            frame_release(d, &sim_frames(d)[pg->frame]);
        sim_unlock_device(d);
    }
}

static void destroy_alloc(struct alloc *a) { /* g_mem_lock held, already unregistered */
    if (a->kind == AK_MANAGED) {
        release_pages(a);
        munmap(a->shadow, a->map_size);
        free(a->pages);
    }
    if (a->kind == AK_RESERVE) {
        for (struct vmap *m = a->maps, *n; m; m = n) {
            n = m->next;
            m->ph->maps--;
            if (m->ph->released && m->ph->maps == 0) {
                uncharge(m->ph->dev, m->ph->ctx_slot, m->ph->ctx_gen, m->ph->size);
                close(m->ph->memfd);
                m->ph->magic = OBJ_DEAD;
                free(m->ph);
            }
            free(m);
        }
    }
    if (a->map_base)
        munmap(a->map_base, a->map_size);
    if (a->charged)
        uncharge(a->dev, a->ctx_slot, a->ctx_gen, a->charged);
    free(a);
}

CUresult mem_free(CUdeviceptr p) {
    if (!p)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_mem_lock);
    struct alloc *a = reg_find((uintptr_t)p);
    if (!a || a->base != (uintptr_t)p || a->kind == AK_RESERVE || a->kind == AK_HOST) {
        pthread_mutex_unlock(&g_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    reg_remove(a);
    destroy_alloc(a);
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_SUCCESS;
}

/* Pinned host memory (cuMemAllocHost / cuMemHostAlloc): registered so that pointer queries
 * and copies know it; not charged to the device. */
SIM_HIDDEN CUresult mem_alloc_host(struct sim_context *c, size_t size, void **out) {
    if (!out || !size)
        return CUDA_ERROR_INVALID_VALUE;
    size_t mapped = round_up(size, 4096);
    struct alloc *a = new_alloc(AK_HOST, c);
    void *p = a ? map_aligned(mapped, 4096, PROT_READ | PROT_WRITE, 0) : NULL;
    if (!p) {
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->base = (uintptr_t)p;
    a->size = size;
    a->map_base = p;
    a->map_size = mapped;
    pthread_mutex_lock(&g_mem_lock);
    reg_add(a);
    pthread_mutex_unlock(&g_mem_lock);
    *out = p;
    return CUDA_SUCCESS;
}

SIM_HIDDEN CUresult mem_free_host(void *p) {
    pthread_mutex_lock(&g_mem_lock);
    struct alloc *a = reg_find((uintptr_t)p);
    if (!a || a->kind != AK_HOST || a->base != (uintptr_t)p) {
        pthread_mutex_unlock(&g_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    reg_remove(a);
    destroy_alloc(a);
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_SUCCESS;
}

void mem_release_context(struct sim_context *c) {
    pthread_mutex_lock(&g_mem_lock);
    for (size_t i = 0; i < g_nallocs;) {
        struct alloc *a = g_allocs[i];
        if (a->ctx == c && a->kind != AK_HOST) {
            reg_remove(a);
            destroy_alloc(a);
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&g_mem_lock);
}

/* ---------- access ---------- */

static int vmap_covers(struct alloc *a, uintptr_t p, size_t n) {
    for (struct vmap *m = a->maps; m; m = m->next)
        if (p >= m->ptr && p + n <= m->ptr + m->size)
            return 1;
    return 0;
}

static void add_words(unsigned char *data, uintptr_t addr, size_t n, uint32_t stride, uint32_t delta) {
    /* words at addresses that are multiples of the stride */
    uintptr_t first = (addr + stride - 1) / stride * stride;
    for (uintptr_t w = first; w + 4 <= addr + n; w += stride) {
        uint32_t *word = (uint32_t *)(data + (w - addr));
        *word += delta;
    }
}

CUresult mem_kernel_touch(struct sim_context *c, CUdeviceptr p, uint64_t bytes, uint32_t stride, uint32_t delta,
                          uint64_t stamp, int64_t *extra_ns) {
    if (!bytes)
        return CUDA_SUCCESS;
    if (stride < 4)
        stride = 4;
    pthread_mutex_lock(&g_mem_lock);
    struct alloc *a = reg_find((uintptr_t)p);
    if (!a || (uintptr_t)p + bytes > a->base + a->size || a->kind == AK_HOST ||
        (a->kind == AK_RESERVE && !vmap_covers(a, (uintptr_t)p, bytes))) {
        pthread_mutex_unlock(&g_mem_lock);
        sim_log(SIM_LOG_WARN, "kernel touched %#llx+%llu outside any device allocation (an illegal address)",
                (unsigned long long)p, (unsigned long long)bytes);
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    if (a->kind != AK_MANAGED) {
        add_words((unsigned char *)p, (uintptr_t)p, bytes, stride, delta);
        pthread_mutex_unlock(&g_mem_lock);
        return CUDA_SUCCESS;
    }
    int dev = c->dev;
    struct sim_device *d = &g_sim.st->dev[dev];
    sim_lock_device(d);
    int64_t cost = 0;
    uintptr_t end = (uintptr_t)p + bytes;
    for (uintptr_t at = (uintptr_t)p; at < end;) {
        uint32_t i = (uint32_t)((at - a->base) / SIM_PAGE);
        uintptr_t pend = a->base + (uintptr_t)(i + 1) * SIM_PAGE;
        size_t n = (end < pend ? end : pend) - at;
        struct mpage *pg = &a->pages[i];
        if (pg->loc == LOC_DEV && pg->dev != dev) { /* resident on a peer: read over the link */
            cost += sim_bytes_ns(n, SIM_REMOTE_GBPS);
        } else {
            page_sync(a, i);
            int mapped_remote = pg->pref == PREF_CPU || (pg->accessed_by & (1u << dev));
            int want_device = pg->loc == LOC_NONE || (pg->loc == LOC_HOST && !mapped_remote) || pg->loc == LOC_DEV;
            if (!want_device || page_to_device(a, i, dev, c->slot, stamp, &cost, SIM_FAULT_GBPS) < 0) {
                if (pg->loc == LOC_NONE)
                    pg->loc = LOC_HOST;
                cost += sim_bytes_ns(n, SIM_REMOTE_GBPS);
                d->ctx[c->slot].remote_bytes += n;
            }
        }
        unsigned char *data = pg->loc == LOC_DEV && pg->dev == dev ? page_shadow(a, i) : page_host(a, i);
        if (pg->loc == LOC_DEV && pg->dev != dev)
            data = page_shadow(a, i);
        add_words(data + (at - (a->base + (uintptr_t)i * SIM_PAGE)), at, n, stride, delta);
        at += n;
    }
    sim_unlock_device(d);
    pthread_mutex_unlock(&g_mem_lock);
    *extra_ns += cost;
    return CUDA_SUCCESS;
}

/* A copy into a never-touched managed page: the copy engine is the device, so the page is
 * populated there if a frame is free (no eviction for it), else on the host. */
static void populate_for_copy(struct alloc *a, uint32_t i) {
    struct mpage *pg = &a->pages[i];
    struct sim_device *d = &g_sim.st->dev[a->dev];
    sim_lock_device(d);
    struct sim_ctx *c = &d->ctx[a->ctx_slot];
    int64_t cost = 0;
    if (!(c->state == CTX_LIVE && c->gen == a->ctx_gen && frames_free(d) > 0 &&
          page_to_device(a, i, a->dev, a->ctx_slot, ++d->op_clock, &cost, SIM_PREFETCH_GBPS) == 0))
        pg->loc = LOC_HOST;
    sim_unlock_device(d);
}

/* The bytes behind [p, p+n) for a host-side read or write, a piece at a time
 * (g_mem_lock held). Returns the length of the piece, 0 if p is not device memory, or
 * (size_t)-1 for an invalid range. *bus tells whether the piece lives on the device. */
static size_t translate(uintptr_t p, size_t n, unsigned char **data, int *on_device) {
    struct alloc *a = reg_find(p);
    if (!a)
        return 0;
    size_t avail = a->base + a->size - p;
    if (n > avail)
        return (size_t)-1;
    if (a->kind == AK_HOST) {
        *data = (unsigned char *)p;
        *on_device = 0;
        return n;
    }
    if (a->kind == AK_RESERVE && !vmap_covers(a, p, 1))
        return (size_t)-1;
    if (a->kind != AK_MANAGED) {
        *data = (unsigned char *)p;
        *on_device = 1;
        return n;
    }
    uint32_t i = (uint32_t)((p - a->base) / SIM_PAGE);
    uintptr_t pend = a->base + (uintptr_t)(i + 1) * SIM_PAGE;
    size_t len = n < pend - p ? n : pend - p;
    struct mpage *pg = &a->pages[i];
    if (pg->loc == LOC_DEV) {
        struct sim_device *d = &g_sim.st->dev[pg->dev];
        sim_lock_device(d);
        page_sync(a, i);
        sim_unlock_device(d);
    }
    if (pg->loc == LOC_NONE)
        populate_for_copy(a, i);
    *on_device = pg->loc == LOC_DEV;
    *data = (*on_device ? page_shadow(a, i) : page_host(a, i)) + (p - (a->base + (uintptr_t)i * SIM_PAGE));
    return len;
}

CUresult mem_copy(void *dst_host, CUdeviceptr dst_dev, const void *src_host, CUdeviceptr src_dev, size_t n,
                  uint64_t *bytes_bus) {
    uint64_t bus = 0;
    pthread_mutex_lock(&g_mem_lock);
    size_t done = 0;
    while (done < n) {
        unsigned char *dp = dst_host ? (unsigned char *)dst_host + done : NULL;
        const unsigned char *sp = src_host ? (const unsigned char *)src_host + done : NULL;
        size_t len = n - done;
        int dd = 0, sd = 0;
        if (!dp) {
            size_t l = translate((uintptr_t)dst_dev + done, len, &dp, &dd);
            if (l == 0 || l == (size_t)-1)
                goto invalid;
            len = l;
        }
        if (!sp) {
            unsigned char *s;
            size_t l = translate((uintptr_t)src_dev + done, len, &s, &sd);
            if (l == 0 || l == (size_t)-1)
                goto invalid;
            sp = s;
            len = l;
        }
        memmove(dp, sp, len);
        if (dd != sd)
            bus += len;
        done += len;
    }
    pthread_mutex_unlock(&g_mem_lock);
    if (bytes_bus)
        *bytes_bus = bus;
    return CUDA_SUCCESS;
invalid:
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_ERROR_INVALID_VALUE;
}

/* Is p device, managed or pinned memory simgpu knows? (for cuMemcpy's unified addressing) */
SIM_HIDDEN int mem_known(CUdeviceptr p) {
    pthread_mutex_lock(&g_mem_lock);
    struct alloc *a = reg_find((uintptr_t)p);
    int k = a && a->kind != AK_HOST;
    pthread_mutex_unlock(&g_mem_lock);
    return k;
}

CUresult mem_set(CUdeviceptr p, unsigned value, size_t elem, size_t count) {
    pthread_mutex_lock(&g_mem_lock);
    size_t n = elem * count, done = 0;
    while (done < n) {
        unsigned char *data;
        int on;
        size_t l = translate((uintptr_t)p + done, n - done, &data, &on);
        if (l == 0 || l == (size_t)-1) {
            pthread_mutex_unlock(&g_mem_lock);
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (elem == 1) {
            memset(data, (int)value, l);
        } else {
            for (size_t k = 0; k + elem <= l; k += elem) {
                if (elem == 2) {
                    uint16_t v = (uint16_t)value;
                    memcpy(data + k, &v, 2);
                } else {
                    uint32_t v = value;
                    memcpy(data + k, &v, 4);
                }
            }
        }
        done += l;
    }
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_SUCCESS;
}

/* ---------- advice and prefetch ---------- */

static int loc_device(CUmemLocation loc, int *dev) { /* -1 for host */
    if (loc.type == CU_MEM_LOCATION_TYPE_HOST || loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
        loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
        *dev = -1;
        return 0;
    }
    if (loc.type != CU_MEM_LOCATION_TYPE_DEVICE || loc.id < 0 || loc.id >= g_sim.nvisible)
        return -1;
    *dev = g_sim.visible[loc.id];
    return 0;
}

static struct alloc *managed_range(uintptr_t p, size_t n, uint32_t *first, uint32_t *last) {
    struct alloc *a = reg_find(p);
    if (!a || a->kind != AK_MANAGED || n == 0 || p + n > a->base + a->size)
        return NULL;
    *first = (uint32_t)((p - a->base) / SIM_PAGE);
    *last = (uint32_t)((p + n - 1 - a->base) / SIM_PAGE);
    return a;
}

CUresult mem_advise(CUdeviceptr p, size_t n, CUmem_advise advice, CUmemLocation loc) {
    int dev = 0;
    int needs_loc = advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION || advice == CU_MEM_ADVISE_SET_ACCESSED_BY ||
                    advice == CU_MEM_ADVISE_UNSET_ACCESSED_BY;
    if (needs_loc && loc_device(loc, &dev) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mem_lock);
    uint32_t first, last;
    struct alloc *a = managed_range((uintptr_t)p, n, &first, &last);
    if (!a) {
        pthread_mutex_unlock(&g_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (uint32_t i = first; i <= last; i++) {
        struct mpage *pg = &a->pages[i];
        switch (advice) {
        case CU_MEM_ADVISE_SET_READ_MOSTLY: pg->read_mostly = 1; break;
        case CU_MEM_ADVISE_UNSET_READ_MOSTLY: pg->read_mostly = 0; break;
        case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
            pg->pref = dev < 0 ? PREF_CPU : PREF_DEV;
            pg->pref_dev = (uint8_t)(dev < 0 ? 0 : dev);
            break;
        case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION: pg->pref = PREF_NONE; break;
        case CU_MEM_ADVISE_SET_ACCESSED_BY: pg->accessed_by |= dev < 0 ? ACCESS_CPU : 1u << dev; break;
        case CU_MEM_ADVISE_UNSET_ACCESSED_BY: pg->accessed_by &= ~(dev < 0 ? ACCESS_CPU : 1u << dev); break;
        default:
            pthread_mutex_unlock(&g_mem_lock);
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_SUCCESS;
}

CUresult mem_prefetch(struct sim_context *c, CUdeviceptr p, size_t n, CUmemLocation loc, int64_t *cost_ns) {
    int dev;
    if (loc_device(loc, &dev) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mem_lock);
    uint32_t first, last;
    struct alloc *a = managed_range((uintptr_t)p, n, &first, &last);
    if (!a) {
        pthread_mutex_unlock(&g_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    int64_t cost = 0;
    if (dev < 0) {
        for (uint32_t i = first; i <= last; i++) {
            struct mpage *pg = &a->pages[i];
            if (pg->loc == LOC_DEV) {
                struct sim_device *d = &g_sim.st->dev[pg->dev];
                sim_lock_device(d);
                int was_valid = page_valid_on_device(pg);
                page_to_host(a, i);
                sim_unlock_device(d);
                if (was_valid)
                    cost += sim_bytes_ns(SIM_PAGE, SIM_PREFETCH_GBPS);
            } else if (pg->loc == LOC_NONE) {
                pg->loc = LOC_HOST;
            }
        }
    } else {
        struct sim_device *d = &g_sim.st->dev[dev];
        uint32_t ctx_slot = c && c->dev == dev ? c->slot : a->ctx_slot;
        uint64_t stamp = mem_new_stamp(d);
        sim_lock_device(d);
        for (uint32_t i = first; i <= last; i++) {
            struct mpage *pg = &a->pages[i];
            if (pg->loc == LOC_DEV && pg->dev != dev)
                continue; /* on a peer: left where it is */
            page_sync(a, i);
            if (page_to_device(a, i, dev, ctx_slot, stamp, &cost, SIM_PREFETCH_GBPS) < 0)
                break; /* the device is full of memory that cannot move: prefetch is only a hint */
        }
        sim_unlock_device(d);
    }
    pthread_mutex_unlock(&g_mem_lock);
    *cost_ns += cost;
    return CUDA_SUCCESS;
}

/* ---------- queries ---------- */

CUresult mem_get_info(struct sim_context *c, size_t *free_b, size_t *total_b) {
    struct sim_device *d = drv_device(c);
    sim_lock_device(d);
    eng_advance(d, sim_now());
    uint64_t used = d->device_bytes + d->resident_pages * SIM_PAGE;
    uint64_t total = d->total_mem;
    sim_unlock_device(d);
    if (free_b)
        *free_b = used < total ? total - used : 0;
    if (total_b)
        *total_b = total;
    return CUDA_SUCCESS;
}

static int ordinal_of(int dev) {
    for (int i = 0; i < g_sim.nvisible; i++)
        if (g_sim.visible[i] == dev)
            return i;
    return -1;
}

CUresult mem_pointer_attr(void *data, CUpointer_attribute attr, CUdeviceptr p) {
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mem_lock);
    struct alloc *a = reg_find((uintptr_t)p);
    if (!a) {
        pthread_mutex_unlock(&g_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult r = CUDA_SUCCESS;
    int managed = a->kind == AK_MANAGED, host = a->kind == AK_HOST;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = (CUcontext)a->ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = p; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (managed || host)
            *(void **)data = (void *)p;
        else
            r = CUDA_ERROR_INVALID_VALUE;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned *)data = (unsigned)managed; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = ordinal_of(a->dev); break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = a->id; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = (CUdeviceptr)a->base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = a->size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(unsigned *)data = 1; break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *(unsigned *)data = 1; break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(unsigned *)data = a->kind == AK_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: *(unsigned long long *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: *(unsigned *)data = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE; break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(void **)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: *(unsigned *)data = 0; break;
    default: r = CUDA_ERROR_NOT_SUPPORTED; break;
    }
    pthread_mutex_unlock(&g_mem_lock);
    return r;
}

CUresult mem_range_attr(CUdeviceptr p, size_t n, CUmem_range_attribute attr, void *data, size_t size) {
    pthread_mutex_lock(&g_mem_lock);
    uint32_t first, last;
    struct alloc *a = managed_range((uintptr_t)p, n, &first, &last);
    if (!a || !data || size < 4) {
        pthread_mutex_unlock(&g_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult r = CUDA_SUCCESS;
    struct mpage *pg = &a->pages[first];
    int all_same = 1;
    for (uint32_t i = first + 1; i <= last; i++)
        all_same &= a->pages[i].pref == pg->pref && a->pages[i].pref_dev == pg->pref_dev;
    switch (attr) {
    case CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY: {
        int rm = 1;
        for (uint32_t i = first; i <= last; i++)
            rm &= a->pages[i].read_mostly;
        *(int *)data = rm;
        break;
    }
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION:
        *(int *)data = !all_same || pg->pref == PREF_NONE ? CU_DEVICE_INVALID
                       : pg->pref == PREF_CPU             ? CU_DEVICE_CPU
                                                          : ordinal_of(pg->pref_dev);
        break;
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION:
        *(int *)data = pg->loc == LOC_DEV ? ordinal_of(pg->dev) : pg->loc == LOC_HOST ? CU_DEVICE_CPU : CU_DEVICE_INVALID;
        break;
    default: r = CUDA_ERROR_NOT_SUPPORTED; break;
    }
    pthread_mutex_unlock(&g_mem_lock);
    return r;
}

/* ---------- virtual memory management ---------- */

CUresult mem_vmm_create(struct sim_context *c, size_t size, const CUmemAllocationProp *prop,
                        CUmemGenericAllocationHandle *h) {
    if (!h || !prop || size == 0 || size % SIM_PAGE)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_NOT_SUPPORTED;
    int dev;
    if (loc_device(prop->location, &dev) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (dev != c->dev)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = charge(c, size);
    if (r != CUDA_SUCCESS)
        return r;
    struct phys *ph = calloc(1, sizeof *ph);
    int fd = ph ? memfd_create("simgpu-vmm", MFD_CLOEXEC) : -1;
    if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
        if (fd >= 0)
            close(fd);
        free(ph);
        uncharge(c->dev, c->slot, c->gen, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ph->magic = OBJ_PHYS;
    ph->dev = dev;
    ph->ctx = c;
    ph->ctx_slot = c->slot;
    ph->ctx_gen = c->gen;
    ph->size = size;
    ph->memfd = fd;
    *h = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}

static struct phys *phys_of(CUmemGenericAllocationHandle h) {
    struct phys *ph = (struct phys *)(uintptr_t)h;
    return ph && ph->magic == OBJ_PHYS && !ph->released ? ph : NULL;
}

CUresult mem_vmm_release(CUmemGenericAllocationHandle h) {
    pthread_mutex_lock(&g_mem_lock);
    struct phys *ph = phys_of(h);
    if (!ph) {
        pthread_mutex_unlock(&g_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    ph->released = 1;
    if (ph->maps == 0) { /* freed once nothing maps it any more */
        uncharge(ph->dev, ph->ctx_slot, ph->ctx_gen, ph->size);
        close(ph->memfd);
        ph->magic = OBJ_DEAD;
        free(ph);
    }
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_SUCCESS;
}

CUresult mem_vmm_reserve(size_t size, size_t align, CUdeviceptr addr, CUdeviceptr *out) {
    (void)addr; /* a hint only */
    if (!out || size == 0 || size % SIM_PAGE)
        return CUDA_ERROR_INVALID_VALUE;
    if (align < SIM_PAGE)
        align = SIM_PAGE;
    void *p = map_aligned(size, align, PROT_NONE, 0);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct alloc *a = new_alloc(AK_RESERVE, NULL);
    if (!a) {
        munmap(p, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->base = (uintptr_t)p;
    a->size = size;
    a->map_base = p;
    a->map_size = size;
    a->dev = -1;
    pthread_mutex_lock(&g_mem_lock);
    reg_add(a);
    pthread_mutex_unlock(&g_mem_lock);
    *out = (CUdeviceptr)a->base;
    return CUDA_SUCCESS;
}

CUresult mem_vmm_free(CUdeviceptr p, size_t size) {
    pthread_mutex_lock(&g_mem_lock);
    struct alloc *a = reg_find((uintptr_t)p);
    if (!a || a->kind != AK_RESERVE || a->base != (uintptr_t)p || a->size != size || a->maps) {
        pthread_mutex_unlock(&g_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    reg_remove(a);
    destroy_alloc(a);
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_SUCCESS;
}

CUresult mem_vmm_map(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h) {
    pthread_mutex_lock(&g_mem_lock);
    struct phys *ph = phys_of(h);
    struct alloc *a = reg_find((uintptr_t)p);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (!ph || !a || a->kind != AK_RESERVE || (uintptr_t)p + size > a->base + a->size || offset + size > ph->size ||
        size == 0 || size % SIM_PAGE || offset % SIM_PAGE)
        goto out;
    for (struct vmap *m = a->maps; m; m = m->next)
        if ((uintptr_t)p < m->ptr + m->size && m->ptr < (uintptr_t)p + size)
            goto out; /* already mapped */
    struct vmap *m = calloc(1, sizeof *m);
    if (!m || mmap((void *)p, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, ph->memfd, (off_t)offset) ==
                  MAP_FAILED) {
        free(m);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    m->ptr = (uintptr_t)p;
    m->size = size;
    m->ph = ph;
    m->next = a->maps;
    a->maps = m;
    ph->maps++;
    if (a->dev < 0) {
        a->dev = ph->dev;
        a->ctx = ph->ctx;
    }
    r = CUDA_SUCCESS;
out:
    pthread_mutex_unlock(&g_mem_lock);
    return r;
}

CUresult mem_vmm_unmap(CUdeviceptr p, size_t size) {
    pthread_mutex_lock(&g_mem_lock);
    struct alloc *a = reg_find((uintptr_t)p);
    if (!a || a->kind != AK_RESERVE) {
        pthread_mutex_unlock(&g_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (struct vmap **pm = &a->maps; *pm;) {
        struct vmap *m = *pm;
        if (m->ptr >= (uintptr_t)p && m->ptr + m->size <= (uintptr_t)p + size) {
            mmap((void *)m->ptr, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
            *pm = m->next;
            struct phys *ph = m->ph;
            ph->maps--;
            if (ph->released && ph->maps == 0) {
                uncharge(ph->dev, ph->ctx_slot, ph->ctx_gen, ph->size);
                close(ph->memfd);
                ph->magic = OBJ_DEAD;
                free(ph);
            }
            free(m);
        } else {
            pm = &m->next;
        }
    }
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_SUCCESS;
}

CUresult mem_vmm_set_access(CUdeviceptr p, size_t size) {
    pthread_mutex_lock(&g_mem_lock);
    struct alloc *a = reg_find((uintptr_t)p);
    int ok = a && a->kind == AK_RESERVE && vmap_covers(a, (uintptr_t)p, size);
    pthread_mutex_unlock(&g_mem_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
