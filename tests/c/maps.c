/* A dynamically linked program for the docker tests: which shared objects it has loaded
 * (/proc/self/maps), so a test can see that the preload worked inside a container. */
#include <stdio.h>
#include <string.h>

int main(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024], last[1024] = "";
    while (f && fgets(line, sizeof line, f)) {
        char *name = strchr(line, '/');
        if (name && strstr(name, ".so") && strcmp(name, last)) {
            fputs(name, stdout);
            snprintf(last, sizeof last, "%s", name);
        }
    }
    return 0;
}
