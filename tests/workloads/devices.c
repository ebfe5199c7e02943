/* gpuflight test workload: the CUDA device of each call, on the simulated GPU with two
 * devices (gpuflight/simgpu, GF_SIM_DEVICES=2): its runtime and its driver.
 *
 *   devices
 *
 * tests/workloads/expected.py (devices_events) is the oracle for what this program calls and
 * on which device: keep the two in step. Every launch has block {32,1,1}, no shared memory,
 * the default stream; its grid x tells the launches apart.
 *
 * Runtime API (kernel_a and kernel_b registered as nvcc's module constructor would):
 *   cudaLaunchKernel(kernel_a, grid 1)          device 0: the thread never set one
 *   cudaSetDevice(1)
 *   cudaLaunchKernel(kernel_a, grid 2)          device 1
 *   cudaLaunchKernel(kernel_b, grid 3)          device 1
 *   cudaSetDevice(7)                            fails (two devices): nothing changes
 *   cudaLaunchKernel(kernel_b, grid 4)          device 1
 *   a new thread: cudaLaunchKernel(kernel_a, grid 5)   device 0: a thread's own default
 * Driver API (a module loaded once, its function `kernel_drv`):
 *   cuDevicePrimaryCtxRetain(&c0, 0), cuDevicePrimaryCtxRetain(&c1, 1)
 *   cuCtxSetCurrent(c0); cuLaunchKernel(grid 6)           device 0
 *   cuCtxSetCurrent(c1); cuLaunchKernel(grid 7)           device 1
 *   cuCtxPushCurrent_v2(c0); cuLaunchKernel(grid 8)       device 0
 *   cuCtxPopCurrent_v2(&c); cuLaunchKernel(grid 9)        device 1 (c1 again)
 *   cuCtxCreate_v2(&c2, 0, 0); cuLaunchKernel(grid 10)    device 0 (pushed)
 *   cuCtxPopCurrent_v2(&c); cuLaunchKernel(grid 11)       device 1
 *
 * Exits 1 (with a line on stderr) when a call that must succeed fails, else 0; prints
 * nothing otherwise.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
	unsigned int x, y, z;
} dim3;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;

int cudaSetDevice(int device);
int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t smem,
		     void *stream);
void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **handle);
void __cudaRegisterFunction(void **handle, const char *hostFun, char *deviceFun,
			    const char *deviceName, int thread_limit, void *tid, void *bid,
			    void *bDim, void *gDim, int *wSize);

int cuInit(unsigned int flags);
int cuDevicePrimaryCtxRetain(CUcontext *pctx, int dev);
int cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, int dev);
int cuCtxSetCurrent(CUcontext ctx);
int cuCtxPushCurrent_v2(CUcontext ctx);
int cuCtxPopCurrent_v2(CUcontext *pctx);
int cuModuleLoadData(CUmodule *module, const void *image);
int cuModuleGetFunction(CUfunction *f, CUmodule module, const char *name);
int cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
		   unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem,
		   CUstream stream, void **params, void **extra);

/* Host stand-ins for device kernels: distinct bodies, so distinct addresses. */
static volatile unsigned int kernel_touch;
__attribute__((noinline, used)) void kernel_a(void);
__attribute__((noinline, used)) void kernel_a(void) { kernel_touch = 0xa; }
__attribute__((noinline, used)) void kernel_b(void);
__attribute__((noinline, used)) void kernel_b(void) { kernel_touch = 0xb; }

static const char fatbin[16] = "gpuflight-devs";

static void must(int rc, const char *what)
{
	if (rc != 0) {
		fprintf(stderr, "devices: %s failed: %d\n", what, rc);
		exit(1);
	}
}

static void launch(void (*k)(void), unsigned int grid)
{
	dim3 g = {grid, 1, 1}, b = {32, 1, 1};

	must(cudaLaunchKernel((const void *)(uintptr_t)k, g, b, NULL, 0, NULL),
	     "cudaLaunchKernel");
}

static void drv_launch(CUfunction f, unsigned int grid)
{
	must(cuLaunchKernel(f, grid, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), "cuLaunchKernel");
}

static void *other_thread(void *arg)
{
	(void)arg;
	launch(kernel_a, 5);
	return NULL;
}

int main(void)
{
	void **handle = __cudaRegisterFatBinary((void *)fatbin);
	pthread_t t;
	CUcontext c0, c1, c2, popped;
	CUmodule m;
	CUfunction f;

	__cudaRegisterFunction(handle, (const char *)(uintptr_t)kernel_a, "kernel_a", "kernel_a",
			       -1, NULL, NULL, NULL, NULL, NULL);
	__cudaRegisterFunction(handle, (const char *)(uintptr_t)kernel_b, "kernel_b", "kernel_b",
			       -1, NULL, NULL, NULL, NULL, NULL);
	__cudaRegisterFatBinaryEnd(handle);

	launch(kernel_a, 1);
	must(cudaSetDevice(1), "cudaSetDevice(1)");
	launch(kernel_a, 2);
	launch(kernel_b, 3);
	if (cudaSetDevice(7) == 0) {
		fprintf(stderr, "devices: cudaSetDevice(7) succeeded: run with GF_SIM_DEVICES=2\n");
		return 1;
	}
	launch(kernel_b, 4);
	if (pthread_create(&t, NULL, other_thread, NULL) != 0 || pthread_join(t, NULL) != 0)
		return 1;

	must(cuInit(0), "cuInit");
	must(cuDevicePrimaryCtxRetain(&c0, 0), "cuDevicePrimaryCtxRetain(0)");
	must(cuDevicePrimaryCtxRetain(&c1, 1), "cuDevicePrimaryCtxRetain(1)");
	must(cuModuleLoadData(&m, fatbin), "cuModuleLoadData");
	must(cuModuleGetFunction(&f, m, "kernel_drv"), "cuModuleGetFunction");
	must(cuCtxSetCurrent(c0), "cuCtxSetCurrent(c0)");
	drv_launch(f, 6);
	must(cuCtxSetCurrent(c1), "cuCtxSetCurrent(c1)");
	drv_launch(f, 7);
	must(cuCtxPushCurrent_v2(c0), "cuCtxPushCurrent_v2");
	drv_launch(f, 8);
	must(cuCtxPopCurrent_v2(&popped), "cuCtxPopCurrent_v2");
	drv_launch(f, 9);
	must(cuCtxCreate_v2(&c2, 0, 0), "cuCtxCreate_v2");
	drv_launch(f, 10);
	must(cuCtxPopCurrent_v2(&popped), "cuCtxPopCurrent_v2");
	drv_launch(f, 11);
	return 0;
}
