/* Feeds readings (ns, one per argument) through libtgs.so's kernel-length rule
 * (libshim/src/kernel_length.h) and prints the length after each, space-separated, with
 * a '*' after one whose reading is to be confirmed (the kernel timed again at once), and
 * after a '/' the launches per timed one the shim would sample next (all the readings
 * taken as of one kernel). */
#include <stdio.h>
#include <stdlib.h>

#include "../../libshim/src/kernel_length.h"

int main(int argc, char **argv) {
    uint64_t len = 0, last = 0;
    unsigned every = TGS_TIME_EVERY;
    for (int i = 1; i < argc; i++) {
        uint64_t t = strtoull(argv[i], NULL, 10);
        struct tgs_kernel_reading r = tgs_kernel_length_next(len, last, (uint64_t)(i - 1), t);
        every = tgs_time_every_next(every, i - 1 >= 2, r.confirms);
        len = r.len;
        last = t;
        printf("%s%llu%s/%u", i > 1 ? " " : "", (unsigned long long)len, r.recheck ? "*" : "", every);
    }
    printf("\n");
    return 0;
}
