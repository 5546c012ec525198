/* Feeds readings (ns, one per argument) through libtgs.so's kernel-length rule
 * (libshim/src/kernel_length.h) and prints the length after each, space-separated, with
 * a '*' after one whose reading is to be confirmed (the kernel timed again at once). */
#include <stdio.h>
#include <stdlib.h>

#include "../../libshim/src/kernel_length.h"

int main(int argc, char **argv) {
    uint64_t len = 0, last = 0;
    for (int i = 1; i < argc; i++) {
        uint64_t t = strtoull(argv[i], NULL, 10);
        struct tgs_kernel_reading r = tgs_kernel_length_next(len, last, (uint64_t)(i - 1), t);
        len = r.len;
        last = t;
        printf("%s%llu%s", i > 1 ? " " : "", (unsigned long long)len, r.recheck ? "*" : "");
    }
    printf("\n");
    return 0;
}
