/* gpuflight tests: a stub CUDA driver (libcuda.so.1) where every call succeeds.
 *
 * Every function of cuda_driver.h, with the real ABI, exported under the real names;
 * no function shares its body with another (built with -fno-ipa-icf), so each name is
 * one probe. Handles are made-up values, never dereferenced:
 *
 *   cuModuleLoadData/Ex   module     0x50000 + n     cuModuleGetFunction  function 0xF0000 + n
 *   cuLibraryLoadData     library    0x60000 + n     cuLibraryGetKernel   kernel   0xE0000 + n
 *   cuKernelGetFunction   function   0xD0000 + n     cuStreamEndCapture   graph    0xA0000 + n
 *   cuGraphInstantiate*   graph exec 0xB0000 + n
 *
 * (n counts calls of that function from 1). Allocations return malloc'd memory.
 * cuGetProcAddress(_v2) hands out the exported functions themselves (the name, else
 * NAME_v2), as the real driver hands the runtime its entry points.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"

/* A stub ignores most of its arguments: the probes read them, not the stub. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

#define GF_EXPORT __attribute__((visibility("default"), noinline))
/* A distinct side effect per function, so no two bodies are identical. */
#define GF_TOUCH(name) do { static volatile unsigned long calls_##name; calls_##name++; } while (0)

static unsigned long next_handle(volatile unsigned long *counter, unsigned long base)
{
	return base + __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
}

GF_EXPORT CUresult cuInit(unsigned int flags)
{
	GF_TOUCH(cuInit);
	(void)flags;
	return CUDA_SUCCESS;
}

static volatile unsigned long modules, functions, libraries, kernels, kernel_functions,
	graphs, execs;

GF_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	(void)image;
	*module = (CUmodule)next_handle(&modules, 0x50000);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n,
				      void *options, void **values)
{
	(void)image, (void)n, (void)options, (void)values;
	GF_TOUCH(cuModuleLoadDataEx);
	*module = (CUmodule)next_handle(&modules, 0x50000);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule module, const char *name)
{
	(void)module;
	if (!name || !*name)
		return 500; /* CUDA_ERROR_NOT_FOUND */
	*f = (CUfunction)next_handle(&functions, 0xF0000);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jitOptions,
				     void **jitValues, unsigned int nJit, void *libOptions,
				     void **libValues, unsigned int nLib)
{
	(void)code, (void)jitOptions, (void)jitValues, (void)nJit, (void)libOptions,
		(void)libValues, (void)nLib;
	*library = (CUlibrary)next_handle(&libraries, 0x60000);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name)
{
	(void)library;
	if (!name || !*name)
		return 500;
	*kernel = (CUkernel)next_handle(&kernels, 0xE0000);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel kernel)
{
	(void)kernel;
	*f = (CUfunction)next_handle(&kernel_functions, 0xD0000);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
	*p = (CUdeviceptr)malloc(n ? n : 1);
	return *p ? CUDA_SUCCESS : 2;
}
GF_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s)
{
	(void)s;
	*p = (CUdeviceptr)malloc(n ? n : 1);
	return *p ? CUDA_SUCCESS : 2;
}
GF_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s)
{
	(void)s;
	GF_TOUCH(cuMemAllocAsync_ptsz);
	*p = (CUdeviceptr)malloc(n ? n : 1);
	return *p ? CUDA_SUCCESS : 2;
}
GF_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int flags)
{
	(void)flags;
	*p = (CUdeviceptr)calloc(1, n ? n : 1);
	return *p ? CUDA_SUCCESS : 2;
}
GF_EXPORT CUresult cuMemAllocHost_v2(void **p, size_t n)
{
	GF_TOUCH(cuMemAllocHost_v2);
	*p = malloc(n ? n : 1);
	return *p ? CUDA_SUCCESS : 2;
}
GF_EXPORT CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags)
{
	(void)flags;
	*p = calloc(1, n ? n : 1);
	return *p ? CUDA_SUCCESS : 2;
}
GF_EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
	free((void *)p);
	return CUDA_SUCCESS;
}
GF_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
	(void)s;
	GF_TOUCH(cuMemFreeAsync);
	free((void *)p);
	return CUDA_SUCCESS;
}
GF_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
	(void)s;
	GF_TOUCH(cuMemFreeAsync_ptsz);
	free((void *)p);
	return CUDA_SUCCESS;
}
GF_EXPORT CUresult cuMemFreeHost(void *p)
{
	GF_TOUCH(cuMemFreeHost);
	free(p);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
	(void)s;
	*g = (CUgraph)next_handle(&graphs, 0xA0000);
	return CUDA_SUCCESS;
}
GF_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
	(void)s;
	GF_TOUCH(cuStreamEndCapture_ptsz);
	*g = (CUgraph)next_handle(&graphs, 0xA0000);
	return CUDA_SUCCESS;
}
GF_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
	(void)g, (void)flags;
	*e = (CUgraphExec)next_handle(&execs, 0xB0000);
	return CUDA_SUCCESS;
}
GF_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g, void *params)
{
	(void)g, (void)params;
	GF_TOUCH(cuGraphInstantiateWithParams);
	*e = (CUgraphExec)next_handle(&execs, 0xB0000);
	return CUDA_SUCCESS;
}
GF_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g, void *params)
{
	(void)g, (void)params;
	GF_TOUCH(cuGraphInstantiateWithParams_ptsz);
	*e = (CUgraphExec)next_handle(&execs, 0xB0000);
	return CUDA_SUCCESS;
}

/* ---- functions with nothing to do ------------------------------------------------ */

GF_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int sharedMem, CUstream stream, void **params, void **extra)
{
	GF_TOUCH(cuLaunchKernel);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int sharedMem, CUstream stream, void **params, void **extra)
{
	GF_TOUCH(cuLaunchKernel_ptsz);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int sharedMem, CUstream stream, void **params)
{
	GF_TOUCH(cuLaunchCooperativeKernel);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int sharedMem, CUstream stream, void **params)
{
	GF_TOUCH(cuLaunchCooperativeKernel_ptsz);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
	GF_TOUCH(cuLaunchKernelEx);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
	GF_TOUCH(cuLaunchKernelEx_ptsz);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	GF_TOUCH(cuMemcpyHtoD_v2);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
	GF_TOUCH(cuMemcpyHtoD_v2_ptds);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	GF_TOUCH(cuMemcpyDtoH_v2);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n)
{
	GF_TOUCH(cuMemcpyDtoH_v2_ptds);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	GF_TOUCH(cuMemcpyDtoD_v2);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	GF_TOUCH(cuMemcpyDtoD_v2_ptds);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	GF_TOUCH(cuMemcpyHtoDAsync_v2);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	GF_TOUCH(cuMemcpyHtoDAsync_v2_ptsz);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
	GF_TOUCH(cuMemcpyDtoHAsync_v2);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
	GF_TOUCH(cuMemcpyDtoHAsync_v2_ptsz);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	GF_TOUCH(cuMemcpyDtoDAsync_v2);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	GF_TOUCH(cuMemcpyDtoDAsync_v2_ptsz);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	GF_TOUCH(cuMemcpy);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	GF_TOUCH(cuMemcpy_ptds);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	GF_TOUCH(cuMemcpyAsync);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	GF_TOUCH(cuMemcpyAsync_ptsz);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n)
{
	GF_TOUCH(cuMemcpyPeer);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyPeer_ptds(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n)
{
	GF_TOUCH(cuMemcpyPeer_ptds);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n, CUstream s)
{
	GF_TOUCH(cuMemcpyPeerAsync);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n, CUstream s)
{
	GF_TOUCH(cuMemcpyPeerAsync_ptsz);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n)
{
	GF_TOUCH(cuMemsetD8_v2);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char v, size_t n)
{
	GF_TOUCH(cuMemsetD8_v2_ptds);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short v, size_t n)
{
	GF_TOUCH(cuMemsetD16_v2);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr dst, unsigned short v, size_t n)
{
	GF_TOUCH(cuMemsetD16_v2_ptds);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n)
{
	GF_TOUCH(cuMemsetD32_v2);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int v, size_t n)
{
	GF_TOUCH(cuMemsetD32_v2_ptds);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s)
{
	GF_TOUCH(cuMemsetD8Async);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char v, size_t n, CUstream s)
{
	GF_TOUCH(cuMemsetD8Async_ptsz);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, CUstream s)
{
	GF_TOUCH(cuMemsetD16Async);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr dst, unsigned short v, size_t n, CUstream s)
{
	GF_TOUCH(cuMemsetD16Async_ptsz);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s)
{
	GF_TOUCH(cuMemsetD32Async);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int v, size_t n, CUstream s)
{
	GF_TOUCH(cuMemsetD32Async_ptsz);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuStreamSynchronize(CUstream s)
{
	GF_TOUCH(cuStreamSynchronize);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s)
{
	GF_TOUCH(cuStreamSynchronize_ptsz);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuCtxSynchronize(void)
{
	GF_TOUCH(cuCtxSynchronize);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuEventSynchronize(CUevent e)
{
	GF_TOUCH(cuEventSynchronize);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
	GF_TOUCH(cuGraphLaunch);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s)
{
	GF_TOUCH(cuGraphLaunch_ptsz);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode)
{
	GF_TOUCH(cuStreamBeginCapture_v2);
	return CUDA_SUCCESS;
}

GF_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode)
{
	GF_TOUCH(cuStreamBeginCapture_v2_ptsz);
	return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress --------------------------------------------------------------- */

static const struct {
	const char *name;
	void *fn;
} entry_points[] = {
	{"cuInit", (void *)cuInit},
	{"cuModuleLoadData", (void *)cuModuleLoadData},
	{"cuModuleLoadDataEx", (void *)cuModuleLoadDataEx},
	{"cuModuleGetFunction", (void *)cuModuleGetFunction},
	{"cuLibraryLoadData", (void *)cuLibraryLoadData},
	{"cuLibraryGetKernel", (void *)cuLibraryGetKernel},
	{"cuKernelGetFunction", (void *)cuKernelGetFunction},
	{"cuLaunchKernel", (void *)cuLaunchKernel},
	{"cuLaunchKernel_ptsz", (void *)cuLaunchKernel_ptsz},
	{"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel},
	{"cuLaunchCooperativeKernel_ptsz", (void *)cuLaunchCooperativeKernel_ptsz},
	{"cuLaunchKernelEx", (void *)cuLaunchKernelEx},
	{"cuLaunchKernelEx_ptsz", (void *)cuLaunchKernelEx_ptsz},
	{"cuMemcpyHtoD_v2", (void *)cuMemcpyHtoD_v2},
	{"cuMemcpyHtoD_v2_ptds", (void *)cuMemcpyHtoD_v2_ptds},
	{"cuMemcpyDtoH_v2", (void *)cuMemcpyDtoH_v2},
	{"cuMemcpyDtoH_v2_ptds", (void *)cuMemcpyDtoH_v2_ptds},
	{"cuMemcpyDtoD_v2", (void *)cuMemcpyDtoD_v2},
	{"cuMemcpyDtoD_v2_ptds", (void *)cuMemcpyDtoD_v2_ptds},
	{"cuMemcpyHtoDAsync_v2", (void *)cuMemcpyHtoDAsync_v2},
	{"cuMemcpyHtoDAsync_v2_ptsz", (void *)cuMemcpyHtoDAsync_v2_ptsz},
	{"cuMemcpyDtoHAsync_v2", (void *)cuMemcpyDtoHAsync_v2},
	{"cuMemcpyDtoHAsync_v2_ptsz", (void *)cuMemcpyDtoHAsync_v2_ptsz},
	{"cuMemcpyDtoDAsync_v2", (void *)cuMemcpyDtoDAsync_v2},
	{"cuMemcpyDtoDAsync_v2_ptsz", (void *)cuMemcpyDtoDAsync_v2_ptsz},
	{"cuMemcpy", (void *)cuMemcpy},
	{"cuMemcpy_ptds", (void *)cuMemcpy_ptds},
	{"cuMemcpyAsync", (void *)cuMemcpyAsync},
	{"cuMemcpyAsync_ptsz", (void *)cuMemcpyAsync_ptsz},
	{"cuMemcpyPeer", (void *)cuMemcpyPeer},
	{"cuMemcpyPeer_ptds", (void *)cuMemcpyPeer_ptds},
	{"cuMemcpyPeerAsync", (void *)cuMemcpyPeerAsync},
	{"cuMemcpyPeerAsync_ptsz", (void *)cuMemcpyPeerAsync_ptsz},
	{"cuMemsetD8_v2", (void *)cuMemsetD8_v2},
	{"cuMemsetD8_v2_ptds", (void *)cuMemsetD8_v2_ptds},
	{"cuMemsetD16_v2", (void *)cuMemsetD16_v2},
	{"cuMemsetD16_v2_ptds", (void *)cuMemsetD16_v2_ptds},
	{"cuMemsetD32_v2", (void *)cuMemsetD32_v2},
	{"cuMemsetD32_v2_ptds", (void *)cuMemsetD32_v2_ptds},
	{"cuMemsetD8Async", (void *)cuMemsetD8Async},
	{"cuMemsetD8Async_ptsz", (void *)cuMemsetD8Async_ptsz},
	{"cuMemsetD16Async", (void *)cuMemsetD16Async},
	{"cuMemsetD16Async_ptsz", (void *)cuMemsetD16Async_ptsz},
	{"cuMemsetD32Async", (void *)cuMemsetD32Async},
	{"cuMemsetD32Async_ptsz", (void *)cuMemsetD32Async_ptsz},
	{"cuMemAlloc_v2", (void *)cuMemAlloc_v2},
	{"cuMemAllocAsync", (void *)cuMemAllocAsync},
	{"cuMemAllocAsync_ptsz", (void *)cuMemAllocAsync_ptsz},
	{"cuMemAllocManaged", (void *)cuMemAllocManaged},
	{"cuMemAllocHost_v2", (void *)cuMemAllocHost_v2},
	{"cuMemHostAlloc", (void *)cuMemHostAlloc},
	{"cuMemFree_v2", (void *)cuMemFree_v2},
	{"cuMemFreeAsync", (void *)cuMemFreeAsync},
	{"cuMemFreeAsync_ptsz", (void *)cuMemFreeAsync_ptsz},
	{"cuMemFreeHost", (void *)cuMemFreeHost},
	{"cuStreamSynchronize", (void *)cuStreamSynchronize},
	{"cuStreamSynchronize_ptsz", (void *)cuStreamSynchronize_ptsz},
	{"cuCtxSynchronize", (void *)cuCtxSynchronize},
	{"cuEventSynchronize", (void *)cuEventSynchronize},
	{"cuGraphLaunch", (void *)cuGraphLaunch},
	{"cuGraphLaunch_ptsz", (void *)cuGraphLaunch_ptsz},
	{"cuStreamBeginCapture_v2", (void *)cuStreamBeginCapture_v2},
	{"cuStreamBeginCapture_v2_ptsz", (void *)cuStreamBeginCapture_v2_ptsz},
	{"cuStreamEndCapture", (void *)cuStreamEndCapture},
	{"cuStreamEndCapture_ptsz", (void *)cuStreamEndCapture_ptsz},
	{"cuGraphInstantiateWithFlags", (void *)cuGraphInstantiateWithFlags},
	{"cuGraphInstantiateWithParams", (void *)cuGraphInstantiateWithParams},
	{"cuGraphInstantiateWithParams_ptsz", (void *)cuGraphInstantiateWithParams_ptsz},
};

static void *find_entry_point(const char *symbol)
{
	char versioned[128];
	size_t n = sizeof(entry_points) / sizeof(entry_points[0]);
	for (size_t i = 0; i < n; i++)
		if (strcmp(entry_points[i].name, symbol) == 0)
			return entry_points[i].fn;
	if (strlen(symbol) + 4 > sizeof(versioned))
		return NULL;
	strcpy(versioned, symbol);
	strcat(versioned, "_v2");
	for (size_t i = 0; i < n; i++)
		if (strcmp(entry_points[i].name, versioned) == 0)
			return entry_points[i].fn;
	return NULL;
}

GF_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
				    unsigned long long flags)
{
	(void)cudaVersion, (void)flags;
	*pfn = find_entry_point(symbol);
	return *pfn ? CUDA_SUCCESS : 500;
}

GF_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
				       unsigned long long flags, int *status)
{
	(void)cudaVersion, (void)flags;
	*pfn = find_entry_point(symbol);
	if (status)
		*status = *pfn ? 1 : 0;
	return *pfn ? CUDA_SUCCESS : 500;
}
