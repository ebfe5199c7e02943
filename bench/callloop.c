/* bench: N calls of one function of a shared object, in a tight loop; prints the mean
 * wall-clock ns per call on stdout.
 *
 *   callloop LIBRARY FUNCTION N
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: callloop LIBRARY FUNCTION N\n");
		return 2;
	}
	void *lib = dlopen(argv[1], RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	long (*f)(long) = (long (*)(long))dlsym(lib, argv[2]);
	if (!f) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	long n = atol(argv[3]);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < n; i++)
		f(i);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("%.1f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / (double)n);
	return 0;
}
