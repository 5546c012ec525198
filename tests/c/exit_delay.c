/* A library whose destructor runs after libtgs.so's (preloaded after it: ld.so runs the
 * destructors of preloaded libraries in their load order) and takes 200 ms: the process's last
 * moments, in which the shim's connection thread still runs after the shim said bye to tgsd. */
#include <unistd.h>

__attribute__((destructor)) static void exit_slowly(void) { usleep(200000); }
