/* bench: cudaLaunchKernel at a controlled rate, driven from stdin.
 *
 *   rate    then one line per run on stdin: "RATE SECONDS" (RATE 0: as fast as it can)
 *
 * For each line it makes launches for SECONDS at RATE calls/s (checked every 64
 * calls against CLOCK_MONOTONIC, spinning while ahead) and prints "CALLS NS" on
 * stdout: the calls it made and the wall-clock ns they took. A negative SECONDS
 * makes exactly -SECONDS calls at RATE instead (a burst of known size).
 * One long-lived process, so a reader can scope capture to its pid.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "../gpuflight/demo/cuda_abi.h"

static void kernel(void) {}

static long long now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(void)
{
	double rate, seconds;
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (scanf("%lf %lf", &rate, &seconds) == 2) {
		long long limit = seconds < 0 ? (long long)-seconds : -1;
		long long t0 = now_ns(), end = t0 + (long long)(seconds * 1e9), t = t0;
		long long calls = 0;
		for (;;) {
			for (int i = 0; i < 64 && calls != limit; i++, calls++)
				cudaLaunchKernel((const void *)kernel, (dim3){64, 1, 1},
						 (dim3){256, 1, 1}, 0, 0, 0);
			t = now_ns();
			if (calls == limit || (limit < 0 && t >= end))
				break;
			if (rate > 0) /* ahead of the schedule: wait for it */
				while ((t - t0) * rate < calls * 1e9)
					t = now_ns();
		}
		printf("%lld %lld\n", calls, t - t0);
	}
	return 0;
}
