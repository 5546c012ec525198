/* glibc_compat.h: libtgs.so is preloaded into any glibc image, so it may require no
 * symbol version newer than GLIBC_2.17. Newer glibc moved these into libc under new
 * versions (GLIBC_2.34 and friends); pin each to the version every glibc has. Include
 * first in every file of the shim; tests/test_shim_build.py reads the dynamic symbol
 * table to keep this true. */
#ifndef TGS_GLIBC_COMPAT_H
#define TGS_GLIBC_COMPAT_H

#if defined(__x86_64__)
#define TGS_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define TGS_GLIBC_BASE "GLIBC_2.17"
#else
#error "libtgs.so supports x86_64 and aarch64"
#endif

#define TGS_PIN(sym) __asm__(".symver " #sym "," #sym "@" TGS_GLIBC_BASE)
TGS_PIN(dlopen);
TGS_PIN(dlclose);
TGS_PIN(dlerror);
TGS_PIN(dlvsym);
TGS_PIN(pthread_create);
TGS_PIN(pthread_detach);
TGS_PIN(pthread_once);
TGS_PIN(pthread_sigmask);
TGS_PIN(pthread_mutex_trylock);
TGS_PIN(pthread_attr_setdetachstate);
#undef TGS_PIN

#endif
