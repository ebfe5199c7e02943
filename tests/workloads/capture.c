/* gpuflight test workload: CUDA runtime calls with exactly known arguments.
 *
 *   capture [--threads T] [--iters N] [--start-delay-ms D] [--hold-ms H] [--all-apis]
 *
 * Defaults: T = 1, N = 1, D = 0, H = 0; T is at most 256.
 * tests/workloads/expected.py is the oracle for what this program calls: keep
 * the two in step.
 *
 * 1. Sleep D ms before the first CUDA call (lets a tracer attach first, or not);
 *    SIGUSR1 ends the sleep early (a test starts the calls once its tracer is ready).
 * 2. T pthreads, t = 0..T-1, each:
 *      cudaMalloc(&d, 1<<24); cudaMallocHost(&h, 1<<20);
 *      (when a call fails, as with the real runtime and no driver, the pointer
 *       is replaced by plain malloc'd memory, so later calls get valid pointers)
 *      N times:
 *        cudaLaunchKernel(&kernel_a, {t+1,2,3}, {128,1,1}, args, 256, 0x1000+t)
 *        cudaLaunchKernel_ptsz(&kernel_b, {64,1,1}, {32,4,1}, args, 0, 0)
 *        cudaLaunchKernelExC({grid {8,8,1}, block {16,16,1}, smem 1024,
 *                             stream 0x2000+t, attrs NULL, 0}, &kernel_c, args)
 *        cudaLaunchCooperativeKernel(&kernel_d, {4,1,1}, {256,1,1}, args, 0, 0)
 *        cudaMemcpy(d, h, 4096*(t+1), H2D)
 *        cudaMemcpyAsync(h, d, 1<<20, D2H, 0x1000+t)
 *        cudaMemset(d, 0, 1000)
 *        cudaStreamSynchronize(0x1000+t)
 *      cudaFree(d); cudaFreeHost(h)   (always called: they are what is probed)
 * 3. After joining: cudaGraphLaunch(0x3000, 0); cudaDeviceSynchronize().
 * 4. With --all-apis, main then calls once each, in this order (the order of
 *    bpf/events.h), every API of events.h not used above. A and B are 64 KiB
 *    malloc'd buffers (plain malloc: no CUDA call); streams, events, pools and
 *    graphs are made-up handle values, never dereferenced by the stub.
 *
 *    API                              arguments                                    recorded as
 *    cudaLaunchKernelExC_ptsz         cfg{grid {3,5,7}, block {32,2,2},            launch
 *                                     smem 4096, stream 0x4001}, &kernel_e
 *    cudaLaunchCooperativeKernel_ptsz &kernel_f, {9,1,1}, {64,2,1}, smem 512,     launch
 *                                     stream 0x4002
 *    cudaMemcpy_ptds                  A, B, 1111, D2D                              memcpy D2D sync
 *    cudaMemcpyAsync_ptsz             A, B, 2222, H2H, stream 0x4003               memcpy H2H async
 *    cudaMemcpyPeer                   A, dev 1, B, dev 0, 3333                     memcpy D2D sync
 *    cudaMemcpyPeerAsync              A, dev 0, B, dev 1, 4444, stream 0x4004      memcpy D2D async
 *    cudaMemcpy2D                     A, dpitch 512, B, spitch 256, w 100, h 11,   memcpy D2H 1100 B
 *                                     D2H
 *    cudaMemcpy2D_ptds                A, 512, B, 512, w 200, h 12, H2D             memcpy H2D 2400 B
 *    cudaMemcpy2DAsync                A, 512, B, 512, w 300, h 13, default,        memcpy default
 *                                     stream 0x4005                                3900 B async
 *    cudaMemcpy2DAsync_ptsz           A, 512, B, 512, w 400, h 14, D2D,            memcpy D2D
 *                                     stream 0x4006                                5600 B async
 *    cudaMemset_ptds                  A, 0x11, 5555                                memset sync
 *    cudaMemsetAsync                  A, 0x22, 6666, stream 0x4007                 memset async
 *    cudaMemsetAsync_ptsz             A, 0x33, 7777, stream 0x4008                 memset async
 *    cudaMemset2D                     A, pitch 512, 0x44, w 120, h 10              memset 1200 B
 *    cudaMemset2D_ptds                A, 512, 0x55, w 130, h 10                    memset 1300 B
 *    cudaMemset2DAsync                A, 512, 0x66, w 140, h 10, stream 0x4009     memset 1400 B async
 *    cudaMemset2DAsync_ptsz           A, 512, 0x67, w 150, h 10, stream 0x400a     memset 1500 B async
 *    cudaMemset3D                     {A, pitch 512, xsize 512, ysize 8}, 0x77,    memset 128 B
 *                                     extent {16, 4, 2}
 *    cudaMemset3D_ptds                same ptr, 0x78, extent {17, 4, 2}            memset 136 B
 *    cudaMemset3DAsync                same ptr, 0x79, extent {18, 4, 2},           memset 144 B async
 *                                     stream 0x400b
 *    cudaMemset3DAsync_ptsz           same ptr, 0x7a, extent {19, 4, 2},           memset 152 B async
 *                                     stream 0x400c
 *    cudaMallocAsync                  &p1, 10001, stream 0x400d                    alloc device_async
 *    cudaMallocAsync_ptsz             &p2, 10002, stream 0x400e                    alloc device_async
 *    cudaMallocManaged                &p3, 10003, cudaMemAttachGlobal              alloc managed
 *    cudaHostAlloc                    &p4, 10004, cudaHostAllocPortable            alloc host_pinned
 *    cudaMallocFromPoolAsync          &p5, 10005, pool 0x5000, stream 0x400f       alloc pool_async
 *    cudaMallocFromPoolAsync_ptsz     &p6, 10006, pool 0x5000, stream 0x4010       alloc pool_async
 *    cudaFreeAsync                    p1, stream 0x4011                            free
 *    cudaFreeAsync_ptsz               p2, stream 0x4012                            free
 *    cudaStreamSynchronize_ptsz       stream 0x4013                                sync stream
 *    cudaEventSynchronize             event 0x6000                                 sync event
 *    cudaGraphLaunch_ptsz             graph exec 0x3001, stream 0x4014             graph_launch
 *
 *    p3..p6 are not freed (no free API is left to call once); a failed
 *    allocation leaves its pointer NULL.
 * 5. Sleep H ms (keeps the library mapped, for node-wide tests); exit 0.
 *
 * Return codes of CUDA calls are ignored: the real runtime, without a driver,
 * fails every call (error 35) after the probes have seen its arguments.
 * Prints nothing unless the command line is wrong (then exit 2).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_abi.h"

#define DEV_BYTES (1u << 24)
#define HOST_BYTES (1u << 20)
#define SCRATCH_BYTES (64u * 1024u)

#define STREAM(v) ((cudaStream_t)(uintptr_t)(v))

/* Host stand-ins for device kernels: distinct bodies, so distinct addresses. */
static volatile unsigned int kernel_touch;

#define KERNEL(name, tag)                                                \
	__attribute__((noinline, used)) void name(int *arg);               \
	__attribute__((noinline, used)) void name(int *arg)                \
	{                                                                \
		kernel_touch = (unsigned int)(tag + (arg ? *arg : 0));       \
	}

KERNEL(kernel_a, 0xa)
KERNEL(kernel_b, 0xb)
KERNEL(kernel_c, 0xc)
KERNEL(kernel_d, 0xd)
KERNEL(kernel_e, 0xe)
KERNEL(kernel_f, 0xf)

typedef void (*kernel_fn)(int *);

static const void *kaddr(kernel_fn f)
{
	return (const void *)(uintptr_t)f;
}

static long iters = 1;

static volatile sig_atomic_t start_now;

static void on_start_now(int sig)
{
	(void)sig;
	start_now = 1;
}

/* The start delay: nanosleep is never restarted after a handler, so SIGUSR1 ends it. */
static void start_delay(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

	while (ms > 0 && !start_now && nanosleep(&ts, &ts) != 0) {
	}
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

	while (ms > 0 && nanosleep(&ts, &ts) != 0) {
	}
}

static void *fallback(void *p, size_t size, void **owned)
{
	if (p)
		return p;
	*owned = malloc(size);
	if (!*owned)
		exit(1);
	memset(*owned, 0, size);
	return *owned;
}

static void *worker(void *arg)
{
	unsigned int t = (unsigned int)(uintptr_t)arg;
	void *d = NULL, *h = NULL, *owned_d = NULL, *owned_h = NULL;
	int value = (int)t;
	void *args[] = {&value};
	long i;

	if (cudaMalloc(&d, DEV_BYTES) != cudaSuccess)
		d = NULL;
	if (cudaMallocHost(&h, HOST_BYTES) != cudaSuccess)
		h = NULL;
	d = fallback(d, DEV_BYTES, &owned_d);
	h = fallback(h, HOST_BYTES, &owned_h);

	for (i = 0; i < iters; i++) {
		const cudaLaunchConfig_t cfg = {
			.gridDim = {8, 8, 1},
			.blockDim = {16, 16, 1},
			.dynamicSmemBytes = 1024,
			.stream = STREAM(0x2000 + t),
			.attrs = NULL,
			.numAttrs = 0,
		};

		cudaLaunchKernel(kaddr(kernel_a), (dim3){t + 1, 2, 3}, (dim3){128, 1, 1}, args, 256,
				 STREAM(0x1000 + t));
		cudaLaunchKernel_ptsz(kaddr(kernel_b), (dim3){64, 1, 1}, (dim3){32, 4, 1}, args, 0,
				      0);
		cudaLaunchKernelExC(&cfg, kaddr(kernel_c), args);
		cudaLaunchCooperativeKernel(kaddr(kernel_d), (dim3){4, 1, 1}, (dim3){256, 1, 1},
					    args, 0, 0);
		cudaMemcpy(d, h, 4096u * (t + 1), cudaMemcpyHostToDevice);
		cudaMemcpyAsync(h, d, HOST_BYTES, cudaMemcpyDeviceToHost, STREAM(0x1000 + t));
		cudaMemset(d, 0, 1000);
		cudaStreamSynchronize(STREAM(0x1000 + t));
	}

	cudaFree(d);
	cudaFreeHost(h);
	free(owned_d);
	free(owned_h);
	return NULL;
}

static void all_apis(void)
{
	unsigned char *a = malloc(SCRATCH_BYTES), *b = malloc(SCRATCH_BYTES);
	void *p1 = NULL, *p2 = NULL, *p3 = NULL, *p4 = NULL, *p5 = NULL, *p6 = NULL;
	const cudaMemPool_t pool = (cudaMemPool_t)(uintptr_t)0x5000;
	int value = 42;
	void *args[] = {&value};
	struct cudaPitchedPtr pp;

	if (!a || !b)
		exit(1);
	memset(a, 0, SCRATCH_BYTES);
	memset(b, 0, SCRATCH_BYTES);
	pp = (struct cudaPitchedPtr){.ptr = a, .pitch = 512, .xsize = 512, .ysize = 8};

	{
		const cudaLaunchConfig_t cfg = {
			.gridDim = {3, 5, 7},
			.blockDim = {32, 2, 2},
			.dynamicSmemBytes = 4096,
			.stream = STREAM(0x4001),
			.attrs = NULL,
			.numAttrs = 0,
		};

		cudaLaunchKernelExC_ptsz(&cfg, kaddr(kernel_e), args);
	}
	cudaLaunchCooperativeKernel_ptsz(kaddr(kernel_f), (dim3){9, 1, 1}, (dim3){64, 2, 1}, args,
					 512, STREAM(0x4002));

	cudaMemcpy_ptds(a, b, 1111, cudaMemcpyDeviceToDevice);
	cudaMemcpyAsync_ptsz(a, b, 2222, cudaMemcpyHostToHost, STREAM(0x4003));
	cudaMemcpyPeer(a, 1, b, 0, 3333);
	cudaMemcpyPeerAsync(a, 0, b, 1, 4444, STREAM(0x4004));
	cudaMemcpy2D(a, 512, b, 256, 100, 11, cudaMemcpyDeviceToHost);
	cudaMemcpy2D_ptds(a, 512, b, 512, 200, 12, cudaMemcpyHostToDevice);
	cudaMemcpy2DAsync(a, 512, b, 512, 300, 13, cudaMemcpyDefault, STREAM(0x4005));
	cudaMemcpy2DAsync_ptsz(a, 512, b, 512, 400, 14, cudaMemcpyDeviceToDevice, STREAM(0x4006));

	cudaMemset_ptds(a, 0x11, 5555);
	cudaMemsetAsync(a, 0x22, 6666, STREAM(0x4007));
	cudaMemsetAsync_ptsz(a, 0x33, 7777, STREAM(0x4008));
	cudaMemset2D(a, 512, 0x44, 120, 10);
	cudaMemset2D_ptds(a, 512, 0x55, 130, 10);
	cudaMemset2DAsync(a, 512, 0x66, 140, 10, STREAM(0x4009));
	cudaMemset2DAsync_ptsz(a, 512, 0x67, 150, 10, STREAM(0x400a));
	cudaMemset3D(pp, 0x77, (struct cudaExtent){16, 4, 2});
	cudaMemset3D_ptds(pp, 0x78, (struct cudaExtent){17, 4, 2});
	cudaMemset3DAsync(pp, 0x79, (struct cudaExtent){18, 4, 2}, STREAM(0x400b));
	cudaMemset3DAsync_ptsz(pp, 0x7a, (struct cudaExtent){19, 4, 2}, STREAM(0x400c));

	cudaMallocAsync(&p1, 10001, STREAM(0x400d));
	cudaMallocAsync_ptsz(&p2, 10002, STREAM(0x400e));
	cudaMallocManaged(&p3, 10003, cudaMemAttachGlobal);
	cudaHostAlloc(&p4, 10004, cudaHostAllocPortable);
	cudaMallocFromPoolAsync(&p5, 10005, pool, STREAM(0x400f));
	cudaMallocFromPoolAsync_ptsz(&p6, 10006, pool, STREAM(0x4010));

	cudaFreeAsync(p1, STREAM(0x4011));
	cudaFreeAsync_ptsz(p2, STREAM(0x4012));

	cudaStreamSynchronize_ptsz(STREAM(0x4013));
	cudaEventSynchronize((cudaEvent_t)(uintptr_t)0x6000);

	cudaGraphLaunch_ptsz((cudaGraphExec_t)(uintptr_t)0x3001, STREAM(0x4014));

	(void)p3, (void)p4, (void)p5, (void)p6;
	free(a);
	free(b);
}

static long parse_count(const char *s)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (!*s || *end || v < 0) {
		fprintf(stderr, "capture: not a count: %s\n", s);
		exit(2);
	}
	return v;
}

static void usage(void)
{
	fputs("usage: capture [--threads T] [--iters N] [--start-delay-ms D] [--hold-ms H] "
	      "[--all-apis]\n",
	      stderr);
	exit(2);
}

int main(int argc, char **argv)
{
	long threads = 1, start_delay_ms = 0, hold_ms = 0, t;
	int with_all_apis = 0, i;
	pthread_t *tids;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = parse_count(argv[++i]);
		else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
			iters = parse_count(argv[++i]);
		else if (!strcmp(argv[i], "--start-delay-ms") && i + 1 < argc)
			start_delay_ms = parse_count(argv[++i]);
		else if (!strcmp(argv[i], "--hold-ms") && i + 1 < argc)
			hold_ms = parse_count(argv[++i]);
		else if (!strcmp(argv[i], "--all-apis"))
			with_all_apis = 1;
		else
			usage();
	}
	if (threads > 256) /* the H2D copy of thread t reads 4096*(t+1) bytes of h */
		usage();

	signal(SIGUSR1, on_start_now);
	start_delay(start_delay_ms);

	tids = calloc((size_t)threads + 1, sizeof(*tids));
	if (!tids)
		return 1;
	for (t = 0; t < threads; t++) {
		if (pthread_create(&tids[t], NULL, worker, (void *)(uintptr_t)t) != 0) {
			fputs("capture: pthread_create failed\n", stderr);
			return 1;
		}
	}
	for (t = 0; t < threads; t++)
		pthread_join(tids[t], NULL);
	free(tids);

	cudaGraphLaunch((cudaGraphExec_t)(uintptr_t)0x3000, 0);
	cudaDeviceSynchronize();

	if (with_all_apis)
		all_apis();

	sleep_ms(hold_ms);
	return 0;
}
