/* gpuflight tests: a stub CUDA runtime that implements its calls with the driver.
 *
 * Built as libcudart.so.12 over stubcuda.c's libcuda.so.1, or compiled into another
 * shared object with hidden symbols (a static runtime inside a library, as cuBLAS
 * carries one). Like NVIDIA's runtime it reaches the driver both ways:
 *
 *   through pointers from cuGetProcAddress   cuLaunchKernel, cuLaunchKernelEx,
 *                                            cuMemcpy, cuMemcpyAsync, cuStreamSynchronize,
 *                                            cuStreamBeginCapture(_v2), cuStreamEndCapture,
 *                                            cuGraphInstantiateWithFlags, cuGraphLaunch
 *   through the exported symbols             cuMemAlloc_v2, cuMemFree_v2, cuCtxSynchronize,
 *                                            cuLibraryLoadData, cuLibraryGetKernel
 *
 * Each driver call is made from inside the runtime function (never a tail call), so its
 * return address lies in the runtime's text. Module registration follows nvcc's
 * protocol: __cudaRegisterFatBinary loads a library (cuLibraryLoadData),
 * __cudaRegisterFunction gets each kernel's CUkernel (cuLibraryGetKernel) and
 * __cudaGetKernel hands that CUkernel out as the cudaKernel_t; cudaLaunchKernel takes
 * either a cudaKernel_t or a host stub and launches the CUkernel (or, for a stub never
 * registered, the stub's address) with cuLaunchKernel.
 */
#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include "cuda_abi.h"
#include "cuda_driver.h"

#ifndef GF_RUNTIME_API
#define GF_RUNTIME_API __attribute__((visibility("default"), noinline))
#endif

typedef struct CUgraph_st *cudaGraph_t;

typedef CUresult (*launch_fn)(GF_CU_LAUNCH_ARGS);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*copy_fn)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*copy_async_fn)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (*stream_fn)(CUstream);
typedef CUresult (*begin_capture_fn)(CUstream, int);
typedef CUresult (*end_capture_fn)(CUstream, CUgraph *);
typedef CUresult (*instantiate_fn)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*graph_launch_fn)(CUgraphExec, CUstream);

static struct {
	launch_fn launch;
	launch_ex_fn launch_ex;
	copy_fn copy;
	copy_async_fn copy_async;
	stream_fn stream_sync;
	begin_capture_fn begin_capture;
	end_capture_fn end_capture;
	instantiate_fn instantiate;
	graph_launch_fn graph_launch;
} driver;

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void *entry_point(const char *name)
{
	void *fn = NULL;
	if (cuGetProcAddress(name, &fn, 12000, 0) != CUDA_SUCCESS)
		return NULL;
	return fn;
}

static void load_driver(void)
{
	cuInit(0);
	driver.launch = (launch_fn)entry_point("cuLaunchKernel");
	driver.launch_ex = (launch_ex_fn)entry_point("cuLaunchKernelEx");
	driver.copy = (copy_fn)entry_point("cuMemcpy");
	driver.copy_async = (copy_async_fn)entry_point("cuMemcpyAsync");
	driver.stream_sync = (stream_fn)entry_point("cuStreamSynchronize");
	driver.begin_capture = (begin_capture_fn)entry_point("cuStreamBeginCapture");
	driver.end_capture = (end_capture_fn)entry_point("cuStreamEndCapture");
	driver.instantiate = (instantiate_fn)entry_point("cuGraphInstantiateWithFlags");
	driver.graph_launch = (graph_launch_fn)entry_point("cuGraphLaunch");
}

static int ready(void)
{
	pthread_once(&driver_once, load_driver);
	return driver.launch != NULL;
}

static cudaError_t status(CUresult r)
{
	return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

/* ---- module registration (nvcc's protocol) -------------------------------------- */

#define MAX_KERNELS 256
static struct {
	const void *stub;
	CUkernel kernel;
} registered[MAX_KERNELS];
static int registered_count;
static CUlibrary library;

GF_RUNTIME_API void **__cudaRegisterFatBinary(void *fatCubin)
{
	if (ready())
		cuLibraryLoadData(&library, fatCubin, NULL, NULL, 0, NULL, NULL, 0);
	return (void **)&library;
}

GF_RUNTIME_API void __cudaRegisterFatBinaryEnd(void **handle)
{
	(void)handle;
}

GF_RUNTIME_API void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun,
					   char *deviceFun, const char *deviceName,
					   int thread_limit, void *tid, void *bid, void *bDim,
					   void *gDim, int *wSize)
{
	(void)fatCubinHandle, (void)deviceName, (void)thread_limit, (void)tid, (void)bid,
		(void)bDim, (void)gDim, (void)wSize;
	CUkernel kernel = NULL;
	if (registered_count == MAX_KERNELS ||
	    cuLibraryGetKernel(&kernel, library, deviceFun) != CUDA_SUCCESS)
		return;
	registered[registered_count].stub = hostFun;
	registered[registered_count].kernel = kernel;
	registered_count++;
}

static CUkernel kernel_of(const void *stub)
{
	for (int i = 0; i < registered_count; i++)
		if (registered[i].stub == stub)
			return registered[i].kernel;
	return NULL;
}

GF_RUNTIME_API cudaError_t __cudaGetKernel(void **kernel, const void *hostFun)
{
	CUkernel k = kernel_of(hostFun);
	if (!k)
		return cudaErrorInvalidValue;
	*kernel = k;
	return cudaSuccess;
}

/* A launch handle: a cudaKernel_t is a CUkernel already; a registered stub becomes its
 * CUkernel; anything else is passed on as it is. */
static CUfunction function_of(const void *func)
{
	for (int i = 0; i < registered_count; i++)
		if ((const void *)registered[i].kernel == func)
			return (CUfunction)func;
	CUkernel k = kernel_of(func);
	return k ? (CUfunction)k : (CUfunction)func;
}

/* ---- launches -------------------------------------------------------------------- */

GF_RUNTIME_API cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
					    size_t sharedMem, cudaStream_t stream)
{
	if (!ready())
		return cudaErrorInsufficientDriver;
	CUresult r = driver.launch(function_of(func), grid.x, grid.y, grid.z, block.x, block.y,
				   block.z, (unsigned int)sharedMem, (CUstream)stream, args, NULL);
	return status(r);
}

GF_RUNTIME_API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
					       void **args)
{
	if (!ready())
		return cudaErrorInsufficientDriver;
	CUlaunchConfig cu = {
		config->gridDim.x, config->gridDim.y, config->gridDim.z,
		config->blockDim.x, config->blockDim.y, config->blockDim.z,
		(unsigned int)config->dynamicSmemBytes, (CUstream)config->stream, NULL, 0,
	};
	CUresult r = driver.launch_ex(&cu, function_of(func), args, NULL);
	return status(r);
}

/* ---- copies, memory, waits -------------------------------------------------------- */

GF_RUNTIME_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
				      enum cudaMemcpyKind kind)
{
	(void)kind;
	if (!ready())
		return cudaErrorInsufficientDriver;
	CUresult r = driver.copy((CUdeviceptr)dst, (CUdeviceptr)src, count);
	return status(r);
}

GF_RUNTIME_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
					   enum cudaMemcpyKind kind, cudaStream_t stream)
{
	(void)kind;
	if (!ready())
		return cudaErrorInsufficientDriver;
	CUresult r = driver.copy_async((CUdeviceptr)dst, (CUdeviceptr)src, count,
				       (CUstream)stream);
	return status(r);
}

GF_RUNTIME_API cudaError_t cudaMalloc(void **ptr, size_t size)
{
	if (!ready())
		return cudaErrorInsufficientDriver;
	CUdeviceptr p = 0;
	CUresult r = cuMemAlloc_v2(&p, size);
	*ptr = (void *)p;
	return status(r);
}

GF_RUNTIME_API cudaError_t cudaFree(void *ptr)
{
	if (!ready())
		return cudaErrorInsufficientDriver;
	CUresult r = cuMemFree_v2((CUdeviceptr)ptr);
	return status(r);
}

GF_RUNTIME_API cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	if (!ready())
		return cudaErrorInsufficientDriver;
	CUresult r = driver.stream_sync((CUstream)stream);
	return status(r);
}

GF_RUNTIME_API cudaError_t cudaDeviceSynchronize(void)
{
	if (!ready())
		return cudaErrorInsufficientDriver;
	CUresult r = cuCtxSynchronize();
	return status(r);
}

/* ---- graphs -------------------------------------------------------------------- */

GF_RUNTIME_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode)
{
	if (!ready())
		return cudaErrorInsufficientDriver;
	CUresult r = driver.begin_capture((CUstream)stream, mode);
	return status(r);
}

GF_RUNTIME_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
	if (!ready())
		return cudaErrorInsufficientDriver;
	CUresult r = driver.end_capture((CUstream)stream, (CUgraph *)graph);
	return status(r);
}

GF_RUNTIME_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
						unsigned long long flags)
{
	if (!ready())
		return cudaErrorInsufficientDriver;
	CUresult r = driver.instantiate((CUgraphExec *)exec, (CUgraph)graph, flags);
	return status(r);
}

GF_RUNTIME_API cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
	if (!ready())
		return cudaErrorInsufficientDriver;
	CUresult r = driver.graph_launch((CUgraphExec)exec, (CUstream)stream);
	return status(r);
}
