/* An image's own preloaded library (listed in the image's /etc/ld.so.preload): it says
 * hello, so a test can see it still loads inside a TGS container. */
#include <stdio.h>

__attribute__((constructor)) static void hello(void) { fputs("image preload ok\n", stderr); }
