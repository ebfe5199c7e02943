/* bench: N calls of cudaLaunchKernel (and optionally cudaMemcpyAsync) in a
 * tight loop; prints the mean wall-clock ns per call on stdout.
 *
 *   calls N [copies|driver]
 *
 * driver: cuLaunchKernel instead (the driver API, as Triton and XLA launch).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "../gpuflight/demo/cuda_abi.h"

static void kernel(void) {}

int cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
		   unsigned int by, unsigned int bz, unsigned int shared, void *stream,
		   void **params, void **extra);

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1000000;
	int copies = argc > 2 && strcmp(argv[2], "copies") == 0;
	int driver = argc > 2 && strcmp(argv[2], "driver") == 0;
	static char a[64], b[64];
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < n; i++) {
		if (driver) {
			cuLaunchKernel((void *)kernel, 64, 1, 1, 256, 1, 1, 0, 0, 0, 0);
			continue;
		}
		cudaLaunchKernel((const void *)kernel, (dim3){64, 1, 1}, (dim3){256, 1, 1}, 0, 0, 0);
		if (copies)
			cudaMemcpyAsync(a, b, sizeof(a), cudaMemcpyHostToDevice, 0);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
	printf("%.1f\n", ns / (double)(n * (copies ? 2 : 1)));
	return 0;
}
