/* cu_abi_lookup.h: which ABI a cuGetProcAddress request means, one rule for simgpu and
 * libtgs.so. Include after the generated cu_abi.h (libshim/tools/gen_cuda_abi.py).
 *
 * A request (symbol, cudaVersion, flags) names the newest default row of `symbol` whose
 * version is not above cudaVersion; with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM it
 * names that row's per-thread twin (`_ptds`/`_ptsz`) when one exists. */
#ifndef CU_ABI_LOOKUP_H
#define CU_ABI_LOOKUP_H

#include <string.h>

struct cu_abi_row {
    const char *base;
    int version;
    int variant; /* CU_ABI_DEFAULT, CU_ABI_PTDS, CU_ABI_PTSZ */
    const char *symbol;
};

#define CU_ABI_ROW_INIT(base, ver, variant, symbol, pfn) {#base, ver, variant, #symbol},
static const struct cu_abi_row cu_abi_rows[] = {CU_ABI_TABLE(CU_ABI_ROW_INIT)};
#undef CU_ABI_ROW_INIT
#define CU_ABI_NROWS ((int)(sizeof cu_abi_rows / sizeof *cu_abi_rows))

static inline int cu_abi_is_twin(const struct cu_abi_row *pt, const struct cu_abi_row *def) {
    size_t n = strlen(def->symbol);
    return !strncmp(pt->symbol, def->symbol, n) && (!strcmp(pt->symbol + n, "_ptds") || !strcmp(pt->symbol + n, "_ptsz"));
}

/* The row for a request, or NULL; *found_any tells whether `base` is known at all. */
static inline const struct cu_abi_row *cu_abi_lookup(const char *base, int version, int per_thread,
                                                     int *found_any) {
    const struct cu_abi_row *best = NULL, *pt = NULL;
    *found_any = 0;
    for (int i = 0; i < CU_ABI_NROWS; i++) {
        const struct cu_abi_row *r = &cu_abi_rows[i];
        if (r->base[0] != base[0] || strcmp(r->base, base))
            continue;
        *found_any = 1;
        if (r->version > version)
            continue;
        if (r->variant == CU_ABI_DEFAULT) {
            if (!best || r->version > best->version)
                best = r;
        } else if (!pt || r->version > pt->version) {
            pt = r;
        }
    }
    if (best && per_thread && pt && cu_abi_is_twin(pt, best))
        return pt;
    return best;
}

/* The row that exports `symbol` (e.g. "cuMemAlloc_v2"), or NULL. */
static inline const struct cu_abi_row *cu_abi_by_symbol(const char *symbol) {
    for (int i = 0; i < CU_ABI_NROWS; i++)
        if (cu_abi_rows[i].symbol[0] == symbol[0] && !strcmp(cu_abi_rows[i].symbol, symbol))
            return &cu_abi_rows[i];
    return NULL;
}

#endif
