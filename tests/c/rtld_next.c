/* A second preloaded library, as other tools preload their own: it wraps getpid() and
 * finds the real one with dlsym(RTLD_NEXT). If dlsym answered as if called from libtgs.so,
 * RTLD_NEXT would find this very wrapper and recurse until the stack runs out. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/types.h>
#include <unistd.h>

pid_t getpid(void) {
    static pid_t (*real)(void);
    if (!real)
        real = (pid_t(*)(void))dlsym(RTLD_NEXT, "getpid");
    return real();
}
