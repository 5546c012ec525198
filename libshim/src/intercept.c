/* libtgs.so: how calls reach the shim. Loading the real driver, the dlsym hook, the
 * cuGetProcAddress hooks, and the one table of wrappers (hooks.h).
 *
 * cudart (11.3+) and the frameworks reach the driver through cuGetProcAddress, which
 * they find with dlsym; programs linked to libcuda call exported symbols. The shim
 * answers all three: dlsym and cuGetProcAddress hand out the wrapper of the right ABI
 * for hooked names (and the driver's own answer otherwise), and every wrapper is also
 * exported. */
#define _GNU_SOURCE
#include "tgs.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cu_abi.h"
#include "cu_abi_lookup.h"

struct tgs_state g_tgs = {.activity_slot = TGS_NO_SLOT};

#define TGS_REAL_DEF(sym) TGS_HIDDEN __typeof__(&sym) real_##sym;
TGS_HOOKS(TGS_REAL_DEF)
TGS_NEEDS(TGS_REAL_DEF)
#undef TGS_REAL_DEF

struct hook {
    const char *name;
    void *wrapper;
    void **real; /* NULL for NVML hooks (resolved in nvml.c) */
};

#define HOOK_ENTRY(sym) {#sym, (void *)&sym, (void **)&real_##sym},
static const struct hook g_hooks[] = {TGS_HOOKS(HOOK_ENTRY)};
#undef HOOK_ENTRY

#include <nvml.h>
#define NVML_ENTRY(sym) {#sym, (void *)&sym, NULL},
static const struct hook g_nvml_hooks[] = {TGS_NVML_HOOKS(NVML_ENTRY)};
#undef NVML_ENTRY

struct need {
    const char *name;
    void **real;
};
#define NEED_ENTRY(sym) {#sym, (void **)&real_##sym},
static const struct need g_needs[] = {TGS_NEEDS(NEED_ENTRY)};
#undef NEED_ENTRY

static const struct hook *hook_named(const char *name) {
    if (name[0] == 'c' && name[1] == 'u') {
        for (size_t i = 0; i < sizeof g_hooks / sizeof *g_hooks; i++)
            if (!strcmp(g_hooks[i].name, name))
                return &g_hooks[i];
    } else if (name[0] == 'n' && name[1] == 'v') {
        for (size_t i = 0; i < sizeof g_nvml_hooks / sizeof *g_nvml_hooks; i++)
            if (!strcmp(g_nvml_hooks[i].name, name))
                return &g_nvml_hooks[i];
    }
    return NULL;
}

/* ---------- the real dlsym, and the dlsym hook ---------- */

typedef void *(*dlsym_fn)(void *, const char *);
TGS_HIDDEN dlsym_fn tgs_real_dlsym;

static void find_real_dlsym(void) {
    if (!tgs_real_dlsym)
        tgs_real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", TGS_GLIBC_BASE);
}

/* Called by the dlsym trampoline below: our wrapper for a hooked name, or NULL to let
 * the real dlsym answer (the trampoline jumps to it without a frame of ours, so glibc
 * still sees the original caller and RTLD_NEXT keeps working for everyone). */
TGS_HIDDEN void *tgs_dlsym_hook(void *handle, const char *name) {
    find_real_dlsym();
    if (!name || tgs_probe_mode() != TGS_MODE_ACTIVE)
        return NULL;
    const struct hook *h = hook_named(name);
    if (!h)
        return NULL;
    if (handle != RTLD_NEXT && !tgs_real_dlsym(handle, name))
        return NULL; /* the library has no such symbol: say so as the real dlsym would */
    return h->wrapper;
}

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,@function\n"
        "dlsym:\n"
        "  push %rdi\n"
        "  push %rsi\n"
        "  sub $8, %rsp\n"
        "  call tgs_dlsym_hook\n"
        "  add $8, %rsp\n"
        "  pop %rsi\n"
        "  pop %rdi\n"
        "  test %rax, %rax\n"
        "  jz 1f\n"
        "  ret\n"
        "1:\n"
        "  jmp *tgs_real_dlsym(%rip)\n"
        ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,%function\n"
        "dlsym:\n"
        "  stp x29, x30, [sp, #-32]!\n"
        "  mov x29, sp\n"
        "  stp x0, x1, [sp, #16]\n"
        "  bl tgs_dlsym_hook\n"
        "  cbnz x0, 1f\n"
        "  ldp x0, x1, [sp, #16]\n"
        "  ldp x29, x30, [sp], #32\n"
        "  adrp x16, tgs_real_dlsym\n"
        "  ldr x16, [x16, :lo12:tgs_real_dlsym]\n"
        "  br x16\n"
        "1:\n"
        "  ldp x29, x30, [sp], #32\n"
        "  ret\n"
        ".size dlsym, .-dlsym\n");
#endif

/* ---------- mode and initialisation ---------- */

/* TGS_DIR, else the container's /run/tgs, holding a control block: active. Nothing
 * else is read here (it runs inside dlsym). */
int tgs_probe_mode(void) {
    int m = __atomic_load_n(&g_tgs.mode, __ATOMIC_ACQUIRE);
    if (likely(m != TGS_MODE_UNKNOWN))
        return m;
    const char *env = getenv("TGS_DIR");
    const char *dir = env && *env ? env : TGS_CONTAINER_DIR;
    char path[600];
    size_t n = strlen(dir);
    int found = n < sizeof g_tgs.dir;
    if (found) {
        memcpy(path, dir, n);
        memcpy(path + n, "/" TGS_CONTROL_NAME, sizeof("/" TGS_CONTROL_NAME));
        found = access(path, R_OK) == 0;
    }
    if (found)
        memcpy(g_tgs.dir, dir, n + 1);
    else if (env && *env)
        tgs_log(TGS_LOG_WARN, "TGS_DIR=%s holds no control block: this process runs without TGS", env);
    m = found ? TGS_MODE_ACTIVE : TGS_MODE_PASS;
    int expected = TGS_MODE_UNKNOWN;
    __atomic_compare_exchange_n(&g_tgs.mode, &expected, m, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return __atomic_load_n(&g_tgs.mode, __ATOMIC_ACQUIRE);
}

static void *g_libcuda;
static __typeof__(&cuGetProcAddress_v2) g_gpa2; /* the driver's own, NULL if it lacks one */
static __typeof__(&cuGetProcAddress) g_gpa1;
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;
int g_tgs_inited;

static CUresult tgs_not_supported(void) { return CUDA_ERROR_NOT_SUPPORTED; }

static void load_driver(void) {
    find_real_dlsym();
    const char *path = getenv("TGS_REAL_LIBCUDA");
    if (!path || !*path)
        path = "libcuda.so.1";
    g_libcuda = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!g_libcuda) {
        tgs_log(TGS_LOG_ERROR, "cannot load the CUDA driver %s: %s", path, dlerror());
        return;
    }
    if (tgs_real_dlsym(g_libcuda, "cuInit") == (void *)&cuInit) {
        tgs_log(TGS_LOG_ERROR, "%s is libtgs.so itself; set TGS_REAL_LIBCUDA to the real libcuda.so.1", path);
        g_libcuda = NULL;
        return;
    }
    __typeof__(&cuGetProcAddress_v2) gpa2 = (__typeof__(gpa2))tgs_real_dlsym(g_libcuda, "cuGetProcAddress_v2");
    g_gpa2 = gpa2;
    g_gpa1 = (__typeof__(g_gpa1))tgs_real_dlsym(g_libcuda, "cuGetProcAddress");
    /* Each entry point at exactly the ABI its wrapper has: the symbol it is exported as,
     * else the driver's answer for the row's version (and per-thread flavour). */
    size_t nh = sizeof g_hooks / sizeof *g_hooks, nn = sizeof g_needs / sizeof *g_needs;
    for (size_t i = 0; i < nh + nn; i++) {
        const char *name = i < nh ? g_hooks[i].name : g_needs[i - nh].name;
        void **slot = i < nh ? g_hooks[i].real : g_needs[i - nh].real;
        void *fn = tgs_real_dlsym(g_libcuda, name);
        const struct cu_abi_row *row = fn ? NULL : cu_abi_by_symbol(name);
        if (row && gpa2) {
            CUdriverProcAddressQueryResult st;
            cuuint64_t flags = row->variant == CU_ABI_DEFAULT ? CU_GET_PROC_ADDRESS_LEGACY_STREAM
                                                              : CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
            if (gpa2(row->base, &fn, row->version, flags, &st) != CUDA_SUCCESS)
                fn = NULL;
        }
        *slot = fn;
    }
}

static void child_after_fork(void) {
    /* a child re-initialises its connection; never touches the parent's activity byte */
    __atomic_store_n(&g_tgs.activity_slot, TGS_NO_SLOT, __ATOMIC_RELAXED);
    tgs_agent_after_fork();
    tgs_compute_after_fork();
    tgs_forget_contexts();
}

static void init_once(void) {
    load_driver();
    /* a wrapper whose entry point the driver lacks answers CUDA_ERROR_NOT_SUPPORTED */
    for (size_t i = 0; i < sizeof g_hooks / sizeof *g_hooks; i++)
        if (!*g_hooks[i].real)
            *g_hooks[i].real = (void *)&tgs_not_supported;
    if (tgs_probe_mode() == TGS_MODE_ACTIVE) {
        if (!g_libcuda)
            tgs_fall_back("the CUDA driver could not be loaded");
        else
            tgs_control_open(); /* on failure it falls back, saying why */
        tgs_clock_setup(NULL); /* reads /sys here rather than in a launch */
        tgs_log(TGS_LOG_DEBUG, "its clock: %s", tgs_clock_source());
    }
    pthread_atfork(NULL, NULL, child_after_fork);
    __atomic_store_n(&g_tgs_inited, 1, __ATOMIC_RELEASE);
}

void tgs_init_slow(void) { pthread_once(&g_init_once, init_once); }

int tgs_ready(void) {
    tgs_load();
    if (likely(__atomic_load_n(&g_tgs.mode, __ATOMIC_RELAXED) == TGS_MODE_ACTIVE)) {
        tgs_agent_start(); /* a no-op once running */
        return 1;
    }
    return 0;
}

void *tgs_real_nvml(const char *name) {
    static void *handle;
    find_real_dlsym();
    void *h = __atomic_load_n(&handle, __ATOMIC_ACQUIRE);
    if (!h) {
        h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!h)
            h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        if (!h)
            return NULL;
        __atomic_store_n(&handle, h, __ATOMIC_RELEASE);
    }
    void *fn = tgs_real_dlsym(h, name);
    const struct hook *mine = hook_named(name);
    return mine && fn == mine->wrapper ? NULL : fn;
}

/* ---------- wrappers: initialisation and entry points ---------- */

TGS_API CUresult CUDAAPI cuInit(unsigned int Flags) {
    tgs_ready();
    return real_cuInit(Flags);
}


static CUresult get_proc(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *symbolStatus) {
    int active = tgs_ready();
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r;
    if (g_gpa2) {
        r = g_gpa2(symbol, pfn, cudaVersion, flags, &st);
    } else if (g_gpa1) {
        r = g_gpa1(symbol, pfn, cudaVersion, flags);
        st = r == CUDA_SUCCESS ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    } else {
        r = CUDA_ERROR_NOT_INITIALIZED;
    }
    if (symbolStatus)
        *symbolStatus = st;
    if (r != CUDA_SUCCESS || !active || !symbol || !pfn || !*pfn)
        return r;
    uint32_t v = (uint32_t)cudaVersion, seen = __atomic_load_n(&g_tgs.cuda_version, __ATOMIC_RELAXED);
    while (v > seen && !__atomic_compare_exchange_n(&g_tgs.cuda_version, &seen, v, 1, __ATOMIC_RELAXED,
                                                    __ATOMIC_RELAXED)) {
    }
    int any;
    const struct cu_abi_row *row =
        cu_abi_lookup(symbol, cudaVersion, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, &any);
    const struct hook *h = row ? hook_named(row->symbol) : NULL;
    /* Only where the driver's answer is the very function the wrapper wraps: a newer
     * driver may answer a newer ABI than these headers know, and then it is left alone. */
    if (h && h->real && *h->real == *pfn)
        *pfn = h->wrapper;
    return r;
}

TGS_API CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult *symbolStatus) {
    return get_proc(symbol, pfn, cudaVersion, flags, symbolStatus);
}

TGS_API CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return get_proc(symbol, pfn, cudaVersion, flags, NULL);
}
