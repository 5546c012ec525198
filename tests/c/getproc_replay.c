/* Replays cuGetProcAddress_v2 requests (tests/data/cudart-13.0-getprocaddress.txt) the way
 * cudart makes them: dlopen libcuda.so.1, dlsym cuGetProcAddress_v2, then ask. For each
 * answer it prints which library and symbol the pointer is (dladdr). */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static const char *base(const char *path) {
    const char *s = path ? strrchr(path, '/') : NULL;
    return s ? s + 1 : path ? path : "-";
}

int main(int argc, char **argv) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("no driver: %s\n", dlerror());
        return 1;
    }
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
        dlsym(h, "cuGetProcAddress_v2");
    Dl_info info;
    dladdr((void *)gpa, &info);
    printf("entry %s %s\n", base(info.dli_fname), info.dli_sname ? info.dli_sname : "-");
    FILE *f = fopen(argv[1], "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        char sym[128];
        int ver;
        unsigned long long flags;
        if (line[0] == '#' || sscanf(line, "%127s %d %llu", sym, &ver, &flags) != 3)
            continue;
        const char *name = strcmp(sym, "\"\"") ? sym : "";
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = 99;
        CUresult r = gpa(name, &fn, ver, flags, &st);
        const char *lib = "-", *sname = "-";
        if (fn && dladdr(fn, &info)) {
            lib = base(info.dli_fname);
            sname = info.dli_sname ? info.dli_sname : "-";
        }
        printf("%s %d %llu %d %d %s %s\n", sym, ver, flags, (int)r, (int)st, lib, sname);
    }
    return 0;
}
