/* Feeds grid sizes through libtgs.so's rules for a function's lengths on the grid sizes
 * timed (libshim/src/kernel_length.h), eight places as the shim keeps: an argument N is
 * a reading on N blocks, noted in the place tgs_fn_place picks; ?N asks which grid size a
 * kernel on N blocks not timed there takes its length from, and prints it (0: none near
 * enough), space-separated. */
#include <stdio.h>
#include <stdlib.h>

#include "../../libshim/src/kernel_length.h"

#define PLACES 8

int main(int argc, char **argv) {
    uint64_t b[PLACES] = {0};
    int printed = 0;
    for (int i = 1; i < argc; i++) {
        int ask = argv[i][0] == '?';
        uint64_t blocks = strtoull(argv[i] + ask, NULL, 10);
        if (!ask) {
            b[tgs_fn_place(b, PLACES, blocks)] = blocks;
            continue;
        }
        unsigned at = tgs_fn_nearest(b, PLACES, blocks);
        printf("%s%llu", printed++ ? " " : "", (unsigned long long)(at < PLACES ? b[at] : 0));
    }
    printf("\n");
    return 0;
}
