/* gpuflight test workload: a user who races the agent's path to a library.
 *
 *   swaprace DIR LINK LIB
 *
 * Maps DIR/LIB (dlopen: a "runtime" this user made), prints "mapped" on stdout, then swaps
 * DIR with LINK (a symbolic link to a directory of another user, holding a file LIB of its
 * own) with renameat2(RENAME_EXCHANGE), over and over, until stdin closes. Between any two
 * uses of the path /proc/PID/root/DIR/LIB, the agent may meet either file there.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	char path[4096];
	struct pollfd in = {.fd = 0, .events = POLLIN};
	unsigned long swaps = 0;

	if (argc != 4) {
		fprintf(stderr, "usage: swaprace DIR LINK LIB\n");
		return 2;
	}
	snprintf(path, sizeof(path), "%s/%s", argv[1], argv[3]);
	if (!dlopen(path, RTLD_NOW | RTLD_LOCAL)) {
		fprintf(stderr, "swaprace: %s\n", dlerror());
		return 1;
	}
	printf("mapped\n");
	fflush(stdout);
	for (;;) {
		if (renameat2(AT_FDCWD, argv[1], AT_FDCWD, argv[2], RENAME_EXCHANGE) != 0) {
			perror("swaprace: renameat2");
			return 1;
		}
		if (++swaps % 64 == 0 && poll(&in, 1, 0) > 0)
			return 0; /* stdin readable: closed, or told to stop */
	}
}
