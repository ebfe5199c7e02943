/* gpuflight test workload: a CUDA runtime that arrives late, through dlopen.
 *
 *   dlopen --lib PATH [--delay-ms D] [--iters N]
 *
 * Defaults: D = 0, N = 1. The program is not linked against any libcudart:
 *   1. dlopen(PATH, RTLD_NOW)   (exit 1, with a line on stderr, if that fails)
 *   2. sleep D ms               (time for a tracer to notice the new mapping)
 *   3. N times, via dlsym:
 *        cudaLaunchKernel(&k, {7,1,1}, {64,1,1}, args, 0, 0)
 *        cudaMemcpy(buf, buf2, 512, H2H)      (two malloc'd 512-byte buffers)
 *   4. exit 0 (CUDA return codes are ignored).
 * tests/workloads/expected.py (dlopen_events) is the oracle for these calls.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_abi.h"

static volatile int kernel_touch;

__attribute__((noinline, used)) void k(int *arg);
__attribute__((noinline, used)) void k(int *arg)
{
	kernel_touch = arg ? *arg : 7;
}

static long parse_count(const char *s)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (!*s || *end || v < 0) {
		fprintf(stderr, "dlopen: not a count: %s\n", s);
		exit(2);
	}
	return v;
}

static void usage(void)
{
	fputs("usage: dlopen --lib PATH [--delay-ms D] [--iters N]\n", stderr);
	exit(2);
}

int main(int argc, char **argv)
{
	const char *lib = NULL;
	long delay_ms = 0, iters = 1, i;
	void *handle, *sym_launch, *sym_memcpy;
	cudaLaunchKernel_fn launch;
	cudaMemcpy_fn copy;
	char *buf, *buf2;
	int value = 7;
	void *args[] = {&value};
	int a;

	for (a = 1; a < argc; a++) {
		if (!strcmp(argv[a], "--lib") && a + 1 < argc)
			lib = argv[++a];
		else if (!strcmp(argv[a], "--delay-ms") && a + 1 < argc)
			delay_ms = parse_count(argv[++a]);
		else if (!strcmp(argv[a], "--iters") && a + 1 < argc)
			iters = parse_count(argv[++a]);
		else
			usage();
	}
	if (!lib)
		usage();

	handle = dlopen(lib, RTLD_NOW);
	if (!handle) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 1;
	}
	sym_launch = dlsym(handle, "cudaLaunchKernel");
	sym_memcpy = dlsym(handle, "cudaMemcpy");
	if (!sym_launch || !sym_memcpy) {
		fprintf(stderr, "dlopen: %s lacks cudaLaunchKernel or cudaMemcpy\n", lib);
		return 1;
	}
	/* POSIX guarantees that a dlsym result converts to a function pointer. */
	memcpy(&launch, &sym_launch, sizeof(launch));
	memcpy(&copy, &sym_memcpy, sizeof(copy));

	if (delay_ms > 0) {
		struct timespec ts = {.tv_sec = delay_ms / 1000,
				      .tv_nsec = (delay_ms % 1000) * 1000000L};

		while (nanosleep(&ts, &ts) != 0) {
		}
	}

	buf = calloc(1, 512);
	buf2 = calloc(1, 512);
	if (!buf || !buf2)
		return 1;
	for (i = 0; i < iters; i++) {
		launch((const void *)(uintptr_t)&k, (dim3){7, 1, 1}, (dim3){64, 1, 1}, args, 0, 0);
		copy(buf, buf2, 512, cudaMemcpyHostToHost);
	}
	free(buf);
	free(buf2);
	return 0;
}
