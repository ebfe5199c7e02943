/* gpuflight test workload: the CUDA driver API as frameworks call it, with known arguments.
 *
 *   driver --mode triton|jax|all [--iters N] [--handles-in-memory]      (default N = 1)
 *
 * Links libcuda.so.1 (the real one, where every call fails without a driver, or
 * stubcuda.c's). Return codes are ignored; a handle a failed call did not make stays
 * NULL (0). H is a 64 KiB malloc'd host buffer, D the device buffer (H when allocation
 * fails). Every mode first calls cuInit(0) (not probed). tests/workloads/expected.py
 * (driver_events) is the oracle.
 *
 * triton (torch.compile's launcher):
 *   cuModuleLoadData(&m, cubin); cuModuleGetFunction(&f, m,
 *   "triton_poi_fused_add_mul_0"); cuMemAlloc_v2(&D, 1<<20);
 *   N times cuLaunchKernelEx(cfg{grid {64,1,1}, block {128,1,1}, smem 1024,
 *                                stream 0x7001}, f, params, NULL);
 *   cuStreamSynchronize(0x7001); cuMemFree_v2(D)
 *
 * jax (XLA's executor):
 *   cuModuleLoadDataEx(&m, cubin, 0, NULL, NULL);
 *   cuModuleGetFunction(&f, m, "fusion_12");
 *   cuModuleGetFunction(&g, m, "_ZN3xla3gpu12_GLOBAL__N_113reduce_kernelIfLi256EEEvPKT_PS3_i");
 *   cuMemAlloc_v2(&D, 65536); cuMemcpyHtoDAsync_v2(D, H, 4096, 0x7002);
 *   N times { cuLaunchKernel(f, 7,8,9, 32,4,2, smem 48, 0x7002);
 *             cuLaunchKernel(g, 1,2,3, 64,1,1, smem 0, 0x7002) }
 *   cuStreamBeginCapture_v2(0x7003, 0); 2 x cuLaunchKernel(f, 7,8,9, 32,4,2, 48, 0x7003);
 *   cuStreamEndCapture(0x7003, &graph); cuGraphInstantiateWithFlags(&exec, graph, 0);
 *   3 x cuGraphLaunch(exec, 0x7002);
 *   cuMemcpyDtoHAsync_v2(H, D, 4096, 0x7002); cuStreamSynchronize(0x7002); cuMemFree_v2(D)
 *
 * Streams, events and graph execs are made-up values X (0x7001, ...). NVIDIA's driver reads
 * the object a handle points to even when it has no device, so with --handles-in-memory
 * each X becomes BASE + (X & 0xfff) * 64, inside a zeroed static buffer, and the program
 * prints "handle-base 0x<BASE>" first. Devices pointers are host memory (never read).
 *
 * all: once each, in the order of bpf/events.h, every driver function probed
 *   (arguments in the table of all_apis() below; handles and streams are made-up values).
 *   Kernels come from a library: cuLibraryLoadData(&lib, cubin, ...);
 *   cuLibraryGetKernel(&k, lib, "lib_kernel"); cuKernelGetFunction(&kf, k).
 *
 * --results: each call of a function whose probe completes at its return prints
 *   "result API CODE NS": what it returned, and the CLOCK_MONOTONIC ns from just before the
 *   call to just after it (a probe's duration lies within).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_driver.h"

static int print_results;

static long long now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static CUresult noted(const char *api, CUresult r, long long start)
{
	long long ns = now_ns() - start;
	if (print_results)
		printf("result %s %d %lld\n", api, (int)r, ns);
	return r;
}

/* The call, timed and its result noted: a macro of the function's own name, which does not
 * expand again inside its expansion. */
#define TIMED(api, ...) ({ long long t_ = now_ns(); noted(#api, (api)(__VA_ARGS__), t_); })
#define cuMemcpyHtoD_v2(...) TIMED(cuMemcpyHtoD_v2, __VA_ARGS__)
#define cuMemcpyHtoD_v2_ptds(...) TIMED(cuMemcpyHtoD_v2_ptds, __VA_ARGS__)
#define cuMemcpyDtoH_v2(...) TIMED(cuMemcpyDtoH_v2, __VA_ARGS__)
#define cuMemcpyDtoH_v2_ptds(...) TIMED(cuMemcpyDtoH_v2_ptds, __VA_ARGS__)
#define cuMemcpyDtoD_v2(...) TIMED(cuMemcpyDtoD_v2, __VA_ARGS__)
#define cuMemcpyDtoD_v2_ptds(...) TIMED(cuMemcpyDtoD_v2_ptds, __VA_ARGS__)
#define cuMemcpy(...) TIMED(cuMemcpy, __VA_ARGS__)
#define cuMemcpy_ptds(...) TIMED(cuMemcpy_ptds, __VA_ARGS__)
#define cuMemcpyPeer(...) TIMED(cuMemcpyPeer, __VA_ARGS__)
#define cuMemcpyPeer_ptds(...) TIMED(cuMemcpyPeer_ptds, __VA_ARGS__)
#define cuMemAlloc_v2(...) TIMED(cuMemAlloc_v2, __VA_ARGS__)
#define cuMemAllocAsync(...) TIMED(cuMemAllocAsync, __VA_ARGS__)
#define cuMemAllocAsync_ptsz(...) TIMED(cuMemAllocAsync_ptsz, __VA_ARGS__)
#define cuMemAllocManaged(...) TIMED(cuMemAllocManaged, __VA_ARGS__)
#define cuMemAllocHost_v2(...) TIMED(cuMemAllocHost_v2, __VA_ARGS__)
#define cuMemHostAlloc(...) TIMED(cuMemHostAlloc, __VA_ARGS__)
#define cuMemFree_v2(...) TIMED(cuMemFree_v2, __VA_ARGS__)
#define cuMemFreeAsync(...) TIMED(cuMemFreeAsync, __VA_ARGS__)
#define cuMemFreeAsync_ptsz(...) TIMED(cuMemFreeAsync_ptsz, __VA_ARGS__)
#define cuMemFreeHost(...) TIMED(cuMemFreeHost, __VA_ARGS__)
#define cuStreamSynchronize(...) TIMED(cuStreamSynchronize, __VA_ARGS__)
#define cuStreamSynchronize_ptsz(...) TIMED(cuStreamSynchronize_ptsz, __VA_ARGS__)
#define cuCtxSynchronize(...) TIMED(cuCtxSynchronize, __VA_ARGS__)
#define cuEventSynchronize(...) TIMED(cuEventSynchronize, __VA_ARGS__)
#define cuStreamEndCapture(...) TIMED(cuStreamEndCapture, __VA_ARGS__)
#define cuStreamEndCapture_ptsz(...) TIMED(cuStreamEndCapture_ptsz, __VA_ARGS__)
#define cuGraphInstantiateWithFlags(...) TIMED(cuGraphInstantiateWithFlags, __VA_ARGS__)
#define cuGraphInstantiateWithParams(...) TIMED(cuGraphInstantiateWithParams, __VA_ARGS__)
#define cuGraphInstantiateWithParams_ptsz(...) \
	TIMED(cuGraphInstantiateWithParams_ptsz, __VA_ARGS__)

static unsigned long handle_base;
static unsigned char handle_memory[0x1000 * 64] __attribute__((aligned(64)));

static unsigned long handle(unsigned long x)
{
	return handle_base ? handle_base + (x & 0xfff) * 64 : x;
}

#define S(x) ((CUstream)handle(x))

static unsigned char cubin[256] = {0x7f, 'E', 'L', 'F'};
static unsigned char host[65536];
static void *params[1];

static CUdeviceptr device_alloc(size_t n)
{
	CUdeviceptr d = 0;
	cuMemAlloc_v2(&d, n);
	return d ? d : (CUdeviceptr)host;
}

static void triton(long iters)
{
	CUmodule m = NULL;
	CUfunction f = NULL;
	cuModuleLoadData(&m, cubin);
	cuModuleGetFunction(&f, m, "triton_poi_fused_add_mul_0");
	CUdeviceptr d = device_alloc(1 << 20);
	CUlaunchConfig cfg = {64, 1, 1, 128, 1, 1, 1024, S(0x7001), NULL, 0};
	for (long i = 0; i < iters; i++)
		cuLaunchKernelEx(&cfg, f, params, NULL);
	cuStreamSynchronize(S(0x7001));
	cuMemFree_v2(d == (CUdeviceptr)host ? 0 : d);
}

static void jax(long iters)
{
	CUmodule m = NULL;
	CUfunction f = NULL, g = NULL;
	cuModuleLoadDataEx(&m, cubin, 0, NULL, NULL);
	cuModuleGetFunction(&f, m, "fusion_12");
	cuModuleGetFunction(&g, m, "_ZN3xla3gpu12_GLOBAL__N_113reduce_kernelIfLi256EEEvPKT_PS3_i");
	CUdeviceptr d = device_alloc(65536);
	cuMemcpyHtoDAsync_v2(d, host, 4096, S(0x7002));
	for (long i = 0; i < iters; i++) {
		cuLaunchKernel(f, 7, 8, 9, 32, 4, 2, 48, S(0x7002), params, NULL);
		cuLaunchKernel(g, 1, 2, 3, 64, 1, 1, 0, S(0x7002), params, NULL);
	}
	CUgraph graph = NULL;
	CUgraphExec exec = NULL;
	cuStreamBeginCapture_v2(S(0x7003), 0);
	for (int i = 0; i < 2; i++)
		cuLaunchKernel(f, 7, 8, 9, 32, 4, 2, 48, S(0x7003), params, NULL);
	cuStreamEndCapture(S(0x7003), &graph);
	cuGraphInstantiateWithFlags(&exec, graph, 0);
	for (int i = 0; i < 3; i++)
		cuGraphLaunch(exec, S(0x7002));
	cuMemcpyDtoHAsync_v2(host, d, 4096, S(0x7002));
	cuStreamSynchronize(S(0x7002));
	cuMemFree_v2(d == (CUdeviceptr)host ? 0 : d);
}

/* Every probed driver function once; the oracle lists the same calls in the same order. */
static void all_apis(void)
{
	CUlibrary lib = NULL;
	CUkernel k = NULL;
	CUfunction kf = NULL;
	cuLibraryLoadData(&lib, cubin, NULL, NULL, 0, NULL, NULL, 0);
	cuLibraryGetKernel(&k, lib, "lib_kernel");
	cuKernelGetFunction(&kf, k);
	CUdeviceptr a = (CUdeviceptr)host, b = (CUdeviceptr)(host + 32768);
	CUlaunchConfig cfg = {3, 5, 7, 32, 2, 2, 4096, S(0x8001), NULL, 0};

	cuLaunchKernel(kf, 1, 2, 3, 4, 5, 6, 100, S(0x8000), params, NULL);
	cuLaunchKernel_ptsz(kf, 2, 1, 1, 64, 1, 1, 0, S(0), params, NULL);
	cuLaunchKernelEx(&cfg, kf, params, NULL);
	cfg.sharedMemBytes = 8192;
	cfg.hStream = S(0x8002);
	cuLaunchKernelEx_ptsz(&cfg, kf, params, NULL);
	cuLaunchCooperativeKernel(kf, 9, 1, 1, 256, 1, 1, 512, S(0x8003), params);
	cuLaunchCooperativeKernel_ptsz(kf, 10, 1, 1, 128, 2, 1, 256, S(0x8004), params);

	cuMemcpyHtoD_v2(a, host, 1001);
	cuMemcpyHtoD_v2_ptds(a, host, 1002);
	cuMemcpyDtoH_v2(host, b, 1003);
	cuMemcpyDtoH_v2_ptds(host, b, 1004);
	cuMemcpyDtoD_v2(a, b, 1005);
	cuMemcpyDtoD_v2_ptds(a, b, 1006);
	cuMemcpyHtoDAsync_v2(a, host, 1007, S(0x8005));
	cuMemcpyHtoDAsync_v2_ptsz(a, host, 1008, S(0x8006));
	cuMemcpyDtoHAsync_v2(host, b, 1009, S(0x8007));
	cuMemcpyDtoHAsync_v2_ptsz(host, b, 1010, S(0x8008));
	cuMemcpyDtoDAsync_v2(a, b, 1011, S(0x8009));
	cuMemcpyDtoDAsync_v2_ptsz(a, b, 1012, S(0x800a));
	cuMemcpy(a, b, 1013);
	cuMemcpy_ptds(a, b, 1014);
	cuMemcpyAsync(a, b, 1015, S(0x800b));
	cuMemcpyAsync_ptsz(a, b, 1016, S(0x800c));
	cuMemcpyPeer(a, NULL, b, NULL, 1017);
	cuMemcpyPeer_ptds(a, NULL, b, NULL, 1018);
	cuMemcpyPeerAsync(a, NULL, b, NULL, 1019, S(0x800d));
	cuMemcpyPeerAsync_ptsz(a, NULL, b, NULL, 1020, S(0x800e));

	cuMemsetD8_v2(a, 1, 2001);
	cuMemsetD8_v2_ptds(a, 2, 2002);
	cuMemsetD16_v2(a, 3, 2003);
	cuMemsetD16_v2_ptds(a, 4, 2004);
	cuMemsetD32_v2(a, 5, 2005);
	cuMemsetD32_v2_ptds(a, 6, 2006);
	cuMemsetD8Async(a, 7, 2007, S(0x800f));
	cuMemsetD8Async_ptsz(a, 8, 2008, S(0x8010));
	cuMemsetD16Async(a, 9, 2009, S(0x8011));
	cuMemsetD16Async_ptsz(a, 10, 2010, S(0x8012));
	cuMemsetD32Async(a, 11, 2011, S(0x8013));
	cuMemsetD32Async_ptsz(a, 12, 2012, S(0x8014));

	CUdeviceptr p1 = 0, p2 = 0, p3 = 0, p4 = 0;
	void *h1 = NULL, *h2 = NULL;
	cuMemAlloc_v2(&p1, 3001);
	cuMemAllocAsync(&p2, 3002, S(0x8015));
	cuMemAllocAsync_ptsz(&p3, 3003, S(0x8016));
	cuMemAllocManaged(&p4, 3004, 1);
	cuMemAllocHost_v2(&h1, 3005);
	cuMemHostAlloc(&h2, 3006, 0);
	cuMemFree_v2(p1);
	cuMemFreeAsync(p2, S(0x8017));
	cuMemFreeAsync_ptsz(p3, S(0x8018));
	cuMemFreeHost(h1);

	cuStreamSynchronize(S(0x8019));
	cuStreamSynchronize_ptsz(S(0x801a));
	cuCtxSynchronize();
	cuEventSynchronize((CUevent)handle(0x6001));

	cuGraphLaunch((CUgraphExec)handle(0x3101), S(0x801b));
	cuGraphLaunch_ptsz((CUgraphExec)handle(0x3102), S(0x801c));
	CUgraph g1 = NULL, g2 = NULL;
	CUgraphExec e1 = NULL, e2 = NULL, e3 = NULL;
	cuStreamBeginCapture_v2(S(0x801d), 0);
	cuStreamBeginCapture_v2_ptsz(S(0x801e), 0);
	cuStreamEndCapture(S(0x801d), &g1);
	cuStreamEndCapture_ptsz(S(0x801e), &g2);
	cuGraphInstantiateWithFlags(&e1, g1, 0);
	cuGraphInstantiateWithParams(&e2, g2, NULL);
	cuGraphInstantiateWithParams_ptsz(&e3, g1, NULL);
	(void)p4, (void)h2, (void)e1, (void)e2, (void)e3;
}

static void usage(void)
{
	fprintf(stderr, "usage: driver --mode triton|jax|all [--iters N] [--handles-in-memory]"
			" [--results]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *mode = NULL;
	long iters = 1;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--results") == 0) {
			print_results = 1;
			continue;
		}
		if (i + 1 >= argc && strcmp(argv[i], "--handles-in-memory") != 0)
			usage();
		if (strcmp(argv[i], "--mode") == 0)
			mode = argv[++i];
		else if (strcmp(argv[i], "--iters") == 0)
			iters = atol(argv[++i]);
		else if (strcmp(argv[i], "--handles-in-memory") == 0)
			handle_base = (unsigned long)handle_memory;
		else
			usage();
	}
	if (!mode)
		usage();
	if (handle_base) {
		printf("handle-base 0x%lx\n", handle_base);
		fflush(stdout);
	}
	cuInit(0);
	if (strcmp(mode, "triton") == 0)
		triton(iters);
	else if (strcmp(mode, "jax") == 0)
		jax(iters);
	else if (strcmp(mode, "all") == 0)
		all_apis();
	else
		usage();
	return 0;
}
