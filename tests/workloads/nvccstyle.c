/* gpuflight test workload: what nvcc 12.4+ makes of a CUDA program, written in C.
 *
 *   nvccstyle [--iters N] [--replays R] [--wait-file PATH]      (defaults N = 1, R = 1)
 *
 * Host stubs carry the kernels' mangled names (C accepts them as identifiers), so they
 * sit in the executable's .symtab as nvcc 13 leaves them. A constructor registers the
 * module as nvcc's does: __cudaRegisterFatBinary, then __cudaRegisterFunction(stub,
 * mangled name) for three kernels, then __cudaRegisterFatBinaryEnd. The fourth stub,
 * _Z12unregisteredPf, is never registered: it is launched by its address, and only its
 * symbol names it. As in nvcc's output, each registered kernel's host function calls its
 * __device_stub_<symbol>, which asks once for the cudaKernel_t (__cudaGetKernel), keeps it
 * in a static named like nvcc's function-local `__handle` (_ZZ<stub>E8__handle) and
 * launches by it.
 * tests/workloads/expected.py (nvccstyle_events) is the oracle.
 *
 *   kernel (stub symbol)                                   demangled
 *   _Z5scalePfi                                            scale(float*, int)
 *   _Z4axpyIfLi4EEvPT_S0_i                                 void axpy<float, 4>(float*, float, int)
 *   _ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLi128EEEEEvNT_6ParamsE
 *                                     void cutlass::Kernel<cutlass::gemm::kernel::Gemm<float, 128> >(...)
 *   _Z12unregisteredPf                                     unregistered(float*)
 *
 * 1. cudaMalloc(&d, 4096)
 *    With --wait-file: one iteration of step 2 now, then wait until PATH exists (a tracer
 *    attaches meanwhile; polled every 10 ms, for up to 180 s, then exit 3).
 * 2. N times, on stream 0x9000:
 *      scale         cudaLaunchKernel     grid {16,1,1} block {256,1,1} smem 0
 *      axpy          cudaLaunchKernel     grid {8,2,1}  block {128,1,1} smem 0
 *      cutlass gemm  cudaLaunchKernelExC  grid {4,4,1}  block {32,8,1}  smem 2048
 *      unregistered  cudaLaunchKernel     grid {1,1,1}  block {32,1,1}  smem 0 (by stub address)
 *      cudaMemcpy(d, h, 4096, H2D)
 * 3. A graph: cudaStreamBeginCapture(0x9001); scale, scale, axpy on 0x9001 (as above);
 *    cudaStreamEndCapture(0x9001, &graph); cudaGraphInstantiate(&exec, graph, 0);
 *    R times cudaGraphLaunch(exec, 0x9002); cudaStreamSynchronize(0x9002).
 * 4. cudaDeviceSynchronize(); cudaFree(d); exit 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_abi.h"

typedef struct CUgraph_st *cudaGraph_t;
void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **handle);
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
			    const char *deviceName, int thread_limit, void *tid, void *bid,
			    void *bDim, void *gDim, int *wSize);
cudaError_t __cudaGetKernel(void **kernel, const void *hostFun);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
				 unsigned long long flags);

/* nvcc's <<<grid, block, smem, stream>>>: the stub reads what the call site pushed. */
static dim3 next_grid, next_block;
static size_t next_smem;
static cudaStream_t next_stream;
#define CONFIGURE(gx, gy, gz, bx, by, bz, smem, stream)                                  \
	(next_grid = (dim3){gx, gy, gz}, next_block = (dim3){bx, by, bz}, next_smem = smem, \
	 next_stream = (cudaStream_t)(stream))

static const unsigned char fatbin[64] = {0x50, 0xed, 0x55, 0xba};
static void **module;

/* nvcc's stubs: the kernel's host function calls __device_stub_<symbol>, which keeps the
 * kernel's cudaKernel_t in a function-local static `__handle` (in C, a file-scope static
 * given the C++ name of that local: _ZZ<stub>E8__handle) and launches by it. */
#define DEVICE_STUB_PROLOGUE(handle, kernel)                                             \
	if (!handle)                                                                     \
		__cudaGetKernel(&handle, (const void *)kernel)

void _Z5scalePfi(float *p, int n);
void _Z4axpyIfLi4EEvPT_S0_i(float *y, float a, int n);
void _ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLi128EEEEEvNT_6ParamsE(void *params);

static void *_ZZ25__device_stub__Z5scalePfiPfiE8__handle;
static void *_ZZ36__device_stub__Z4axpyIfLi4EEvPT_S0_iPffiE8__handle;
static void *_ZZ77__device_stub__ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLi128EEEEEvNT_6ParamsEPvE8__handle;

__attribute__((noinline)) void __device_stub__Z5scalePfi(float *p, int n)
{
	DEVICE_STUB_PROLOGUE(_ZZ25__device_stub__Z5scalePfiPfiE8__handle, _Z5scalePfi);
	void *args[] = {&p, &n};
	cudaLaunchKernel(_ZZ25__device_stub__Z5scalePfiPfiE8__handle, next_grid, next_block, args,
			 next_smem, next_stream);
}

__attribute__((noinline)) void __device_stub__Z4axpyIfLi4EEvPT_S0_i(float *y, float a, int n)
{
	DEVICE_STUB_PROLOGUE(_ZZ36__device_stub__Z4axpyIfLi4EEvPT_S0_iPffiE8__handle,
			     _Z4axpyIfLi4EEvPT_S0_i);
	void *args[] = {&y, &a, &n};
	cudaLaunchKernel(_ZZ36__device_stub__Z4axpyIfLi4EEvPT_S0_iPffiE8__handle, next_grid,
			 next_block, args, next_smem, next_stream);
}

__attribute__((noinline)) void
__device_stub__ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLi128EEEEEvNT_6ParamsE(void *params)
{
	DEVICE_STUB_PROLOGUE(
		_ZZ77__device_stub__ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLi128EEEEEvNT_6ParamsEPvE8__handle,
		_ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLi128EEEEEvNT_6ParamsE);
	void *args[] = {&params};
	cudaLaunchConfig_t config = {next_grid, next_block, next_smem, next_stream, NULL, 0};
	cudaLaunchKernelExC(
		&config,
		_ZZ77__device_stub__ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLi128EEEEEvNT_6ParamsEPvE8__handle,
		args);
}

__attribute__((noinline)) void _Z5scalePfi(float *p, int n)
{
	__device_stub__Z5scalePfi(p, n);
}

__attribute__((noinline)) void _Z4axpyIfLi4EEvPT_S0_i(float *y, float a, int n)
{
	__device_stub__Z4axpyIfLi4EEvPT_S0_i(y, a, n);
}

__attribute__((noinline)) void _ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLi128EEEEEvNT_6ParamsE(void *params)
{
	__device_stub__ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLi128EEEEEvNT_6ParamsE(params);
}

/* Never registered: launched by the stub's own address (as before nvcc 12.4). */
__attribute__((noinline)) void _Z12unregisteredPf(float *p)
{
	void *args[] = {&p};
	cudaLaunchKernel((const void *)_Z12unregisteredPf, next_grid, next_block, args, next_smem,
			 next_stream);
}

__attribute__((constructor)) static void register_module(void)
{
	module = __cudaRegisterFatBinary((void *)fatbin);
	__cudaRegisterFunction(module, (const char *)_Z5scalePfi, "_Z5scalePfi", "_Z5scalePfi",
			       -1, NULL, NULL, NULL, NULL, NULL);
	__cudaRegisterFunction(module, (const char *)_Z4axpyIfLi4EEvPT_S0_i,
			       "_Z4axpyIfLi4EEvPT_S0_i", "_Z4axpyIfLi4EEvPT_S0_i", -1, NULL, NULL,
			       NULL, NULL, NULL);
	__cudaRegisterFunction(
		module, (const char *)_ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLi128EEEEEvNT_6ParamsE,
		"_ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLi128EEEEEvNT_6ParamsE",
		"_ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLi128EEEEEvNT_6ParamsE", -1, NULL, NULL,
		NULL, NULL, NULL);
	__cudaRegisterFatBinaryEnd(module);
}

/* One iteration of step 2. */
static void step(float *d, float *host)
{
	CONFIGURE(16, 1, 1, 256, 1, 1, 0, 0x9000);
	_Z5scalePfi(d, 1024);
	CONFIGURE(8, 2, 1, 128, 1, 1, 0, 0x9000);
	_Z4axpyIfLi4EEvPT_S0_i(d, 2.0f, 1024);
	CONFIGURE(4, 4, 1, 32, 8, 1, 2048, 0x9000);
	_ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLi128EEEEEvNT_6ParamsE(d);
	CONFIGURE(1, 1, 1, 32, 1, 1, 0, 0x9000);
	_Z12unregisteredPf(d);
	cudaMemcpy(d, host, 4096, cudaMemcpyHostToDevice);
}

static void usage(void)
{
	fprintf(stderr, "usage: nvccstyle [--iters N] [--replays R] [--wait-file PATH]\n");
	exit(2);
}

__attribute__((visibility("default"))) int nvccstyle_main(int argc, char **argv)
{
	long iters = 1, replays = 1;
	const char *wait_file = NULL;
	for (int i = 1; i < argc; i++) {
		if (i + 1 >= argc)
			usage();
		if (strcmp(argv[i], "--iters") == 0)
			iters = atol(argv[++i]);
		else if (strcmp(argv[i], "--replays") == 0)
			replays = atol(argv[++i]);
		else if (strcmp(argv[i], "--wait-file") == 0)
			wait_file = argv[++i];
		else
			usage();
	}
	static float host[1024];
	float *d = NULL;
	cudaMalloc((void **)&d, 4096);
	if (!d)
		d = host;
	if (wait_file) {
		step(d, host);
		for (int waited = 0; access(wait_file, F_OK) != 0; waited++) {
			if (waited == 18000)
				exit(3);
			usleep(10000);
		}
	}
	for (long i = 0; i < iters; i++)
		step(d, host);
	cudaGraph_t graph = NULL;
	cudaGraphExec_t exec = NULL;
	cudaStreamBeginCapture((cudaStream_t)0x9001, 0);
	CONFIGURE(16, 1, 1, 256, 1, 1, 0, 0x9001);
	_Z5scalePfi(d, 1024);
	_Z5scalePfi(d, 1024);
	CONFIGURE(8, 2, 1, 128, 1, 1, 0, 0x9001);
	_Z4axpyIfLi4EEvPT_S0_i(d, 2.0f, 1024);
	cudaStreamEndCapture((cudaStream_t)0x9001, &graph);
	cudaGraphInstantiate(&exec, graph, 0);
	for (long r = 0; r < replays; r++)
		cudaGraphLaunch(exec, (cudaStream_t)0x9002);
	cudaStreamSynchronize((cudaStream_t)0x9002);
	cudaDeviceSynchronize();
	cudaFree(d == host ? NULL : d);
	return 0;
}

#ifndef GF_NO_MAIN
int main(int argc, char **argv)
{
	return nvccstyle_main(argc, argv);
}
#endif
