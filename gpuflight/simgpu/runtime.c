/* gpuflight simulated GPU: the runtime, built twice, as libcudart.so.13 and .so.12.
 *
 * NVIDIA's runtime-API ABI (cuda_runtime_api.h of CUDA 13 or 12, read at build
 * time), implemented by forwarding to the simulated driver's exported entry points
 * (libcuda.so.1 of this directory): a runtime kernel launch becomes a cuLaunchKernel
 * on a CUfunction whose name is the device function name registered for the host
 * stub (__cudaRegisterFunction), so the driver counts it under that name.
 *
 * Every exported API function has its own body and a normal prologue (built with
 * -fno-ipa-icf, noinline), and launches made by nvcc-generated stubs
 * (__cudaLaunchKernel) go through the exported cudaLaunchKernel by a function
 * pointer, so a uprobe on cudaLaunchKernel fires once per launch. Names that the
 * headers declare and this file does not define are generated stubs returning
 * cudaSuccess (runtime*_stubs.c).
 *
 * Contexts: like NVIDIA's runtime, each thread has a current device (default 0);
 * a runtime call uses the driver's current context when there is one, else makes
 * the current device's primary context current.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>

#if CUDART_VERSION < 13000
/* CUDA 12 headers rename these to their _v2 forms; the library exports both. */
#undef cudaGetDeviceProperties
#undef cudaStreamGetCaptureInfo
#endif

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default"), noinline))
#define IMPL static inline __attribute__((always_inline))

#ifndef GF_SIM_SONAME
#define GF_SIM_SONAME "libcudart.so"
#endif

#define MAX_DEVICES 16
#define M_ENTRY 0x52456e74u
#define M_FATBIN 0x52466174u

/* The driver marks callers by this symbol: the simulated runtime's address range. */
API int gfsim_runtime_marker(void)
{
	return CUDART_VERSION;
}

/* ---- errors ------------------------------------------------------------------------ */

static __thread cudaError_t t_last_error;
static __thread int t_device;
static __thread int t_device_set;
static unsigned long long g_rt_stub_calls[4096];

void rt_stub_hit(unsigned int id)
{
	if (id < 4096)
		__atomic_add_fetch(&g_rt_stub_calls[id], 1, __ATOMIC_RELAXED);
}

static cudaError_t to_rt(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS: return cudaSuccess;
	case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
	case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
	case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
	case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
	case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
	case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
	case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
	case CUDA_ERROR_NOT_READY: return cudaErrorNotReady;
	case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
	case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: return cudaErrorPeerAccessAlreadyEnabled;
	case CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: return cudaErrorPeerAccessNotEnabled;
	case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: return cudaErrorHostMemoryAlreadyRegistered;
	case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: return cudaErrorHostMemoryNotRegistered;
	case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return cudaErrorStreamCaptureUnsupported;
	case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return cudaErrorStreamCaptureInvalidated;
	case CUDA_ERROR_ILLEGAL_STATE: return cudaErrorIllegalState;
	case CUDA_ERROR_UNSUPPORTED_LIMIT: return cudaErrorUnsupportedLimit;
	default: return cudaErrorUnknown;
	}
}

static cudaError_t ret(cudaError_t e)
{
	if (e != cudaSuccess)
		t_last_error = e;
	return e;
}

static cudaError_t retd(CUresult r)
{
	return ret(to_rt(r));
}

/* Make the runtime's context current for the driver; the device it is on. */
static int rt_ctx(void)
{
	CUcontext c = NULL;
	CUdevice d;

	cuCtxGetCurrent(&c);
	if (c) {
		if (cuCtxGetDevice(&d) == CUDA_SUCCESS)
			return d;
		return 0;
	}
	cuDevicePrimaryCtxRetain(&c, t_device);
	cuCtxSetCurrent(c);
	return t_device;
}

/* ---- registration: fat binaries, functions, variables -------------------------------- */

struct fatbin {
	uint32_t magic;
	const void *image;
	CUmodule mods[MAX_DEVICES];
};

struct entry {
	uint32_t magic;
	const void *host_fun;
	struct fatbin *fb;
	char *name;
	CUkernel lib_kernel; /* from cudaLibraryGetKernel: the driver's kernel */
	CUfunction funcs[MAX_DEVICES];
	struct entry *next_by_host, *next_by_self;
};

struct var {
	const void *host_var;
	char *name;
	size_t size;
	void *dev[MAX_DEVICES];
	struct var *next;
};

#define NBUCKETS 4096
static pthread_mutex_t g_rt_lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *g_by_host[NBUCKETS];
static struct entry *g_by_self[NBUCKETS];
static struct var *g_vars;

static unsigned int ptr_hash(const void *p)
{
	uintptr_t v = (uintptr_t)p;

	v ^= v >> 17;
	v *= 0xed5ad4bbu;
	v ^= v >> 11;
	return (unsigned int)(v % NBUCKETS);
}

static struct entry *entry_new(const void *host_fun, struct fatbin *fb, const char *name,
			       CUkernel lk)
{
	struct entry *e = calloc(1, sizeof(*e));
	unsigned int h;

	if (!e)
		abort();
	e->magic = M_ENTRY;
	e->host_fun = host_fun;
	e->fb = fb;
	e->name = strdup(name);
	e->lib_kernel = lk;
	pthread_mutex_lock(&g_rt_lock);
	if (host_fun) {
		h = ptr_hash(host_fun);
		e->next_by_host = g_by_host[h];
		g_by_host[h] = e;
	}
	h = ptr_hash(e);
	e->next_by_self = g_by_self[h];
	g_by_self[h] = e;
	pthread_mutex_unlock(&g_rt_lock);
	return e;
}

/* The entry of a host stub address or of a cudaKernel_t we handed out. */
static struct entry *entry_of(const void *func)
{
	struct entry *e;

	if (!func)
		return NULL;
	pthread_mutex_lock(&g_rt_lock);
	for (e = g_by_host[ptr_hash(func)]; e; e = e->next_by_host)
		if (e->host_fun == func)
			break;
	if (!e)
		for (e = g_by_self[ptr_hash(func)]; e; e = e->next_by_self)
			if ((const void *)e == func)
				break;
	pthread_mutex_unlock(&g_rt_lock);
	if (!e) {
		/* A function never registered (a program that calls cudaLaunchKernel with
		 * a plain host function): named after its symbol, or its address. */
		char name[512];
		Dl_info info = {0};
		int found = dladdr(func, &info);

		if (found && info.dli_sname && info.dli_saddr == func)
			snprintf(name, sizeof(name), "%s", info.dli_sname);
		else if (found && info.dli_fname)
			snprintf(name, sizeof(name), "%s+0x%lx",
				 strrchr(info.dli_fname, '/') ? strrchr(info.dli_fname, '/') + 1
							      : info.dli_fname,
				 (unsigned long)((uintptr_t)func - (uintptr_t)info.dli_fbase));
		else
			snprintf(name, sizeof(name), "func_%p", func);
		e = entry_new(func, NULL, name, NULL);
	}
	return e;
}

/* The driver function of an entry on device d (modules load lazily, per device). */
static CUfunction entry_func(struct entry *e, int d)
{
	CUfunction f;
	CUmodule m;

	if (d < 0 || d >= MAX_DEVICES)
		return NULL;
	pthread_mutex_lock(&g_rt_lock);
	f = e->funcs[d];
	pthread_mutex_unlock(&g_rt_lock);
	if (f)
		return f;
	if (e->lib_kernel) {
		if (cuKernelGetFunction(&f, e->lib_kernel) != CUDA_SUCCESS)
			return NULL;
	} else {
		static struct fatbin anon = {M_FATBIN, "", {0}};
		struct fatbin *fb = e->fb ? e->fb : &anon;

		pthread_mutex_lock(&g_rt_lock);
		m = fb->mods[d];
		pthread_mutex_unlock(&g_rt_lock);
		if (!m) {
			if (cuModuleLoadData(&m, fb->image ? fb->image : "") != CUDA_SUCCESS)
				return NULL;
			pthread_mutex_lock(&g_rt_lock);
			if (fb->mods[d])
				m = fb->mods[d];
			else
				fb->mods[d] = m;
			pthread_mutex_unlock(&g_rt_lock);
		}
		if (cuModuleGetFunction(&f, m, e->name) != CUDA_SUCCESS)
			return NULL;
	}
	pthread_mutex_lock(&g_rt_lock);
	e->funcs[d] = f;
	pthread_mutex_unlock(&g_rt_lock);
	return f;
}

static CUfunction func_for(const void *func)
{
	struct entry *e = entry_of(func);
	int d = rt_ctx();

	return e ? entry_func(e, d) : NULL;
}

API void **__cudaRegisterFatBinary(void *fatCubin)
{
	struct fatbin *fb = calloc(1, sizeof(*fb));

	if (!fb)
		abort();
	fb->magic = M_FATBIN;
	fb->image = fatCubin;
	return (void **)fb;
}

API void __cudaRegisterFatBinaryEnd(void **fatCubinHandle)
{
	(void)fatCubinHandle;
}

API void __cudaUnregisterFatBinary(void **fatCubinHandle)
{
	(void)fatCubinHandle; /* entries stay: their counts live in the driver */
}

API void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
				const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
				dim3 *bDim, dim3 *gDim, int *wSize)
{
	(void)deviceFun, (void)thread_limit, (void)tid, (void)bid, (void)bDim, (void)gDim;
	(void)wSize;
	entry_new(hostFun, (struct fatbin *)fatCubinHandle, deviceName ? deviceName : deviceFun,
		  NULL);
}

IMPL void register_var(void **fatCubinHandle, char *hostVar, char *deviceAddress,
			const char *deviceName, int ext, size_t size, int constant, int global)
{
	struct var *v = calloc(1, sizeof(*v));

	(void)fatCubinHandle, (void)deviceAddress, (void)ext, (void)constant, (void)global;
	if (!v)
		abort();
	v->host_var = hostVar;
	v->name = strdup(deviceName ? deviceName : "");
	v->size = size ? size : 1;
	pthread_mutex_lock(&g_rt_lock);
	v->next = g_vars;
	g_vars = v;
	pthread_mutex_unlock(&g_rt_lock);
}

API void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
			   const char *deviceName, int ext, size_t size, int constant, int global)
{
	register_var(fatCubinHandle, hostVar, deviceAddress, deviceName, ext, size, constant, global);
}

API void __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress,
				  char *deviceAddress, const char *deviceName, int ext, size_t size,
				  int constant, int global)
{
	register_var(fatCubinHandle, (char *)hostVarPtrAddress, deviceAddress, deviceName, ext, size,
		     constant, global);
}

API char __cudaInitModule(void **fatCubinHandle)
{
	(void)fatCubinHandle;
	return 1;
}

API void __cudaRegisterTexture(void **fatCubinHandle, const void *hostVar, const void **deviceAddress,
			       const char *deviceName, int dim, int norm, int ext)
{
	(void)fatCubinHandle, (void)hostVar, (void)deviceAddress, (void)deviceName, (void)dim;
	(void)norm, (void)ext;
}

API void __cudaRegisterSurface(void **fatCubinHandle, const void *hostVar, const void **deviceAddress,
			       const char *deviceName, int dim, int ext)
{
	(void)fatCubinHandle, (void)hostVar, (void)deviceAddress, (void)deviceName, (void)dim;
	(void)ext;
}

/* Device memory of a registered variable on the current device. */
static void *var_addr(const void *symbol, size_t *size)
{
	struct var *v;
	int d = rt_ctx();
	void *p;

	pthread_mutex_lock(&g_rt_lock);
	for (v = g_vars; v; v = v->next)
		if (v->host_var == symbol)
			break;
	pthread_mutex_unlock(&g_rt_lock);
	if (!v || d < 0 || d >= MAX_DEVICES)
		return NULL;
	if (size)
		*size = v->size;
	pthread_mutex_lock(&g_rt_lock);
	p = v->dev[d];
	pthread_mutex_unlock(&g_rt_lock);
	if (!p) {
		CUdeviceptr dp;

		if (cuMemAlloc_v2(&dp, v->size) != CUDA_SUCCESS)
			return NULL;
		cuMemcpyHtoD_v2(dp, symbol, v->size); /* initial value: the host shadow */
		pthread_mutex_lock(&g_rt_lock);
		if (v->dev[d]) {
			cuMemFree_v2(dp);
		} else {
			v->dev[d] = (void *)(uintptr_t)dp;
		}
		p = v->dev[d];
		pthread_mutex_unlock(&g_rt_lock);
	}
	return p;
}

/* ---- launch configuration (<<<>>>) ----------------------------------------------------- */

struct callcfg {
	dim3 grid, block;
	size_t smem;
	void *stream;
};

static __thread struct callcfg t_cfg[16];
static __thread int t_ncfg;

API unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
					 struct CUstream_st *stream)
{
	if (t_ncfg >= 16)
		return 1;
	t_cfg[t_ncfg].grid = gridDim;
	t_cfg[t_ncfg].block = blockDim;
	t_cfg[t_ncfg].smem = sharedMem;
	t_cfg[t_ncfg].stream = stream;
	t_ncfg++;
	return 0;
}

API cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
					   void *stream)
{
	if (t_ncfg <= 0)
		return cudaErrorInvalidConfiguration;
	t_ncfg--;
	if (gridDim)
		*gridDim = t_cfg[t_ncfg].grid;
	if (blockDim)
		*blockDim = t_cfg[t_ncfg].block;
	if (sharedMem)
		*sharedMem = t_cfg[t_ncfg].smem;
	if (stream)
		*(void **)stream = t_cfg[t_ncfg].stream;
	return cudaSuccess;
}

/* ---- launches ------------------------------------------------------------------------- */

IMPL cudaError_t launch(const void *func, dim3 g, dim3 b, void **args, size_t smem,
			cudaStream_t stream)
{
	CUfunction f = func_for(func);

	if (!f)
		return ret(cudaErrorInvalidDeviceFunction);
	return retd(cuLaunchKernel(f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned int)smem,
				   (CUstream)stream, args, NULL));
}

API cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
				 size_t sharedMem, cudaStream_t stream)
{
	return launch(func, gridDim, blockDim, args, sharedMem, stream);
}

API cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim, void **args,
				      size_t sharedMem, cudaStream_t stream)
{
	return launch(func, gridDim, blockDim, args, sharedMem, stream);
}

IMPL cudaError_t launch_ex(const cudaLaunchConfig_t *c, const void *func, void **args)
{
	CUfunction f;
	CUlaunchConfig cc;

	if (!c)
		return ret(cudaErrorInvalidValue);
	f = func_for(func);
	if (!f)
		return ret(cudaErrorInvalidDeviceFunction);
	memset(&cc, 0, sizeof(cc));
	cc.gridDimX = c->gridDim.x, cc.gridDimY = c->gridDim.y, cc.gridDimZ = c->gridDim.z;
	cc.blockDimX = c->blockDim.x, cc.blockDimY = c->blockDim.y, cc.blockDimZ = c->blockDim.z;
	cc.sharedMemBytes = (unsigned int)c->dynamicSmemBytes;
	cc.hStream = (CUstream)c->stream;
	return retd(cuLaunchKernelEx(&cc, f, args, NULL));
}

API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
				    void **args)
{
	return launch_ex(config, func, args);
}

API cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func,
					 void **args)
{
	return launch_ex(config, func, args);
}

IMPL cudaError_t launch_coop(const void *func, dim3 g, dim3 b, void **args, size_t smem,
			     cudaStream_t stream)
{
	CUfunction f = func_for(func);

	if (!f)
		return ret(cudaErrorInvalidDeviceFunction);
	return retd(cuLaunchCooperativeKernel(f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned int)smem,
					      (CUstream)stream, args));
}

API cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim,
					    void **args, size_t sharedMem, cudaStream_t stream)
{
	return launch_coop(func, gridDim, blockDim, args, sharedMem, stream);
}

API cudaError_t cudaLaunchCooperativeKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim,
						 void **args, size_t sharedMem,
						 cudaStream_t stream)
{
	return launch_coop(func, gridDim, blockDim, args, sharedMem, stream);
}

/* nvcc's host stubs (CUDA 12.x+, non-legacy launch) go through these: they call the
 * exported cudaLaunchKernel by pointer, so its probe fires once per launch. */
typedef cudaError_t (*launch_fn)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
static launch_fn volatile p_launch = cudaLaunchKernel;
static launch_fn volatile p_launch_ptsz = cudaLaunchKernel_ptsz;

API cudaError_t __cudaGetKernel(cudaKernel_t *kernelPtr, const void *funcAddr)
{
	struct entry *e = entry_of(funcAddr);

	if (!kernelPtr || !e)
		return ret(cudaErrorInvalidValue);
	*kernelPtr = (cudaKernel_t)e;
	return cudaSuccess;
}

API cudaError_t cudaGetKernel(cudaKernel_t *kernelPtr, const void *entryFuncAddr)
{
	struct entry *e = entry_of(entryFuncAddr);

	if (!kernelPtr || !e)
		return ret(cudaErrorInvalidValue);
	*kernelPtr = (cudaKernel_t)e;
	return cudaSuccess;
}

static const void *kernel_host(cudaKernel_t k)
{
	struct entry *e = (struct entry *)k;

	return e && e->magic == M_ENTRY && e->host_fun ? e->host_fun : (const void *)k;
}

API cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
				   size_t sharedMem, cudaStream_t stream)
{
	return p_launch(kernel_host(kernel), gridDim, blockDim, args, sharedMem, stream);
}

API cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
					void **args, size_t sharedMem, cudaStream_t stream)
{
	return p_launch_ptsz(kernel_host(kernel), gridDim, blockDim, args, sharedMem, stream);
}

API cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
	rt_ctx();
	return retd(cuLaunchHostFunc((CUstream)stream, (CUhostFn)fn, userData));
}

API cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
	rt_ctx();
	return retd(cuLaunchHostFunc_ptsz((CUstream)stream, (CUhostFn)fn, userData));
}

/* ---- functions and kernels -------------------------------------------------------------- */

API cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
	CUfunction f = func_for(func);
	int v;

	if (!attr)
		return ret(cudaErrorInvalidValue);
	if (!f)
		return ret(cudaErrorInvalidDeviceFunction);
	memset(attr, 0, sizeof(*attr));
	cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f);
	attr->sharedSizeBytes = (size_t)v;
	cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, f);
	attr->constSizeBytes = (size_t)v;
	cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f);
	attr->localSizeBytes = (size_t)v;
	cuFuncGetAttribute(&attr->maxThreadsPerBlock, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f);
	cuFuncGetAttribute(&attr->numRegs, CU_FUNC_ATTRIBUTE_NUM_REGS, f);
	cuFuncGetAttribute(&attr->ptxVersion, CU_FUNC_ATTRIBUTE_PTX_VERSION, f);
	cuFuncGetAttribute(&attr->binaryVersion, CU_FUNC_ATTRIBUTE_BINARY_VERSION, f);
	cuFuncGetAttribute(&attr->maxDynamicSharedSizeBytes,
			   CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f);
	cuFuncGetAttribute(&attr->preferredShmemCarveout,
			   CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, f);
	return cudaSuccess;
}

API cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
	CUfunction f = func_for(func);

	if (!f)
		return ret(cudaErrorInvalidDeviceFunction);
	return retd(cuFuncSetAttribute(f, (CUfunction_attribute)attr, value));
}

API cudaError_t cudaFuncSetCacheConfig(const void *func, enum cudaFuncCache cacheConfig)
{
	(void)cacheConfig;
	return func_for(func) ? cudaSuccess : ret(cudaErrorInvalidDeviceFunction);
}

API cudaError_t cudaFuncGetName(const char **name, const void *func)
{
	struct entry *e = entry_of(func);

	if (!name || !e)
		return ret(cudaErrorInvalidValue);
	*name = e->name;
	return cudaSuccess;
}

API cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t kernel, enum cudaFuncAttribute attr,
						int value, int device)
{
	struct entry *e = entry_of((const void *)kernel);
	CUfunction f;

	if (!e)
		return ret(cudaErrorInvalidValue);
	rt_ctx();
	f = entry_func(e, device);
	if (!f)
		return ret(cudaErrorInvalidDeviceFunction);
	return retd(cuFuncSetAttribute(f, (CUfunction_attribute)attr, value));
}

API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *func,
							       int blockSize,
							       size_t dynamicSMemSize)
{
	return retd(cuOccupancyMaxActiveBlocksPerMultiprocessor(numBlocks, func_for(func),
								 blockSize, dynamicSMemSize));
}

API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks,
									const void *func,
									int blockSize,
									size_t dynamicSMemSize,
									unsigned int flags)
{
	return retd(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
		numBlocks, func_for(func), blockSize, dynamicSMemSize, flags));
}

API cudaError_t cudaOccupancyAvailableDynamicSMemPerBlock(size_t *dynamicSmemSize,
							  const void *func, int numBlocks,
							  int blockSize)
{
	return retd(cuOccupancyAvailableDynamicSMemPerBlock(dynamicSmemSize, func_for(func),
							    numBlocks, blockSize));
}

API cudaError_t cudaOccupancyMaxActiveClusters(int *numClusters, const void *func,
					       const cudaLaunchConfig_t *launchConfig)
{
	(void)launchConfig;
	return retd(cuOccupancyMaxActiveClusters(numClusters, func_for(func), NULL));
}

/* ---- libraries ------------------------------------------------------------------------------ */

API cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code,
				    enum cudaJitOption *jitOptions, void **jitOptionsValues,
				    unsigned int numJitOptions,
				    enum cudaLibraryOption *libraryOptions,
				    void **libraryOptionValues, unsigned int numLibraryOptions)
{
	(void)jitOptions, (void)jitOptionsValues, (void)numJitOptions, (void)libraryOptions;
	(void)libraryOptionValues, (void)numLibraryOptions;
	rt_ctx();
	return retd(cuLibraryLoadData((CUlibrary *)library, code, NULL, NULL, 0, NULL, NULL, 0));
}

API cudaError_t cudaLibraryLoadFromFile(cudaLibrary_t *library, const char *fileName,
					enum cudaJitOption *jitOptions, void **jitOptionsValues,
					unsigned int numJitOptions,
					enum cudaLibraryOption *libraryOptions,
					void **libraryOptionValues, unsigned int numLibraryOptions)
{
	(void)jitOptions, (void)jitOptionsValues, (void)numJitOptions, (void)libraryOptions;
	(void)libraryOptionValues, (void)numLibraryOptions;
	rt_ctx();
	return retd(cuLibraryLoadFromFile((CUlibrary *)library, fileName, NULL, NULL, 0, NULL, NULL,
					  0));
}

API cudaError_t cudaLibraryUnload(cudaLibrary_t library)
{
	return retd(cuLibraryUnload((CUlibrary)library));
}

API cudaError_t cudaLibraryGetKernel(cudaKernel_t *pKernel, cudaLibrary_t library,
				     const char *name)
{
	CUkernel k;
	CUresult r;

	if (!pKernel || !name)
		return ret(cudaErrorInvalidValue);
	r = cuLibraryGetKernel(&k, (CUlibrary)library, name);
	if (r != CUDA_SUCCESS)
		return retd(r);
	*pKernel = (cudaKernel_t)entry_new(NULL, NULL, name, k);
	return cudaSuccess;
}

API cudaError_t cudaLibraryGetKernelCount(unsigned int *count, cudaLibrary_t lib)
{
	return retd(cuLibraryGetKernelCount(count, (CUlibrary)lib));
}

API cudaError_t cudaLibraryGetGlobal(void **dptr, size_t *bytes, cudaLibrary_t library,
				     const char *name)
{
	rt_ctx();
	return retd(cuLibraryGetGlobal((CUdeviceptr *)dptr, bytes, (CUlibrary)library, name));
}

API cudaError_t cudaLibraryGetManaged(void **dptr, size_t *bytes, cudaLibrary_t library,
				      const char *name)
{
	rt_ctx();
	return retd(cuLibraryGetManaged((CUdeviceptr *)dptr, bytes, (CUlibrary)library, name));
}

API cudaError_t cudaLibraryGetUnifiedFunction(void **fptr, cudaLibrary_t library,
					      const char *symbol)
{
	(void)fptr, (void)library, (void)symbol;
	return ret(cudaErrorNotSupported);
}

/* ---- devices ---------------------------------------------------------------------------------- */

API cudaError_t cudaGetDeviceCount(int *count)
{
	return retd(cuDeviceGetCount(count));
}

API cudaError_t cudaGetDevice(int *device)
{
	CUcontext c = NULL;
	CUdevice d;

	if (!device)
		return ret(cudaErrorInvalidValue);
	cuCtxGetCurrent(&c);
	if (c && cuCtxGetDevice(&d) == CUDA_SUCCESS) {
		*device = d;
		return cudaSuccess;
	}
	*device = t_device;
	return cudaSuccess;
}

IMPL cudaError_t set_device(int device)
{
	int n = 0;
	CUcontext c;

	cuDeviceGetCount(&n);
	if (device < 0 || device >= n)
		return ret(cudaErrorInvalidDevice);
	t_device = device;
	t_device_set = 1;
	cuDevicePrimaryCtxRetain(&c, device);
	return retd(cuCtxSetCurrent(c));
}

API cudaError_t cudaSetDevice(int device)
{
	return set_device(device);
}

API cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags)
{
	(void)deviceFlags, (void)flags;
	return set_device(device);
}

API cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
	(void)flags;
	rt_ctx();
	return cudaSuccess;
}

API cudaError_t cudaGetDeviceFlags(unsigned int *flags)
{
	if (!flags)
		return ret(cudaErrorInvalidValue);
	*flags = 0;
	return cudaSuccess;
}

API cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
	return retd(cuDeviceGetAttribute(value, (CUdevice_attribute)attr, device));
}

static int attr(CUdevice_attribute a, int d)
{
	int v = 0;

	cuDeviceGetAttribute(&v, a, d);
	return v;
}

IMPL cudaError_t get_props(struct cudaDeviceProp *p, int d)
{
	int n = 0;

	cuDeviceGetCount(&n);
	if (!p)
		return ret(cudaErrorInvalidValue);
	if (d < 0 || d >= n)
		return ret(cudaErrorInvalidDevice);
	memset(p, 0, sizeof(*p));
	cuDeviceGetName(p->name, sizeof(p->name), d);
	cuDeviceGetUuid_v2((CUuuid *)&p->uuid, d);
	cuDeviceTotalMem_v2(&p->totalGlobalMem, d);
	p->sharedMemPerBlock = (size_t)attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, d);
	p->regsPerBlock = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, d);
	p->warpSize = attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE, d);
	p->memPitch = (size_t)attr(CU_DEVICE_ATTRIBUTE_MAX_PITCH, d);
	p->maxThreadsPerBlock = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, d);
	p->maxThreadsDim[0] = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, d);
	p->maxThreadsDim[1] = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, d);
	p->maxThreadsDim[2] = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, d);
	p->maxGridSize[0] = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, d);
	p->maxGridSize[1] = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, d);
	p->maxGridSize[2] = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, d);
	p->totalConstMem = (size_t)attr(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, d);
	p->major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d);
	p->minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d);
	p->textureAlignment = (size_t)attr(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, d);
	p->texturePitchAlignment = (size_t)attr(CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, d);
	p->multiProcessorCount = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d);
	p->integrated = 0;
	p->canMapHostMemory = 1;
	p->maxTexture1D = 131072;
	p->maxTexture2D[0] = 131072, p->maxTexture2D[1] = 65536;
	p->maxTexture3D[0] = p->maxTexture3D[1] = p->maxTexture3D[2] = 16384;
	p->surfaceAlignment = 512;
	p->concurrentKernels = 1;
	p->ECCEnabled = attr(CU_DEVICE_ATTRIBUTE_ECC_ENABLED, d);
	p->pciBusID = attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d);
	p->pciDeviceID = attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d);
	p->pciDomainID = attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d);
	p->asyncEngineCount = attr(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, d);
	p->unifiedAddressing = 1;
	p->memoryBusWidth = attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, d);
	p->l2CacheSize = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, d);
	p->persistingL2CacheMaxSize = attr(CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE, d);
	p->maxThreadsPerMultiProcessor = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, d);
	p->streamPrioritiesSupported = 1;
	p->globalL1CacheSupported = 1;
	p->localL1CacheSupported = 1;
	p->sharedMemPerMultiprocessor =
		(size_t)attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, d);
	p->regsPerMultiprocessor = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, d);
	p->managedMemory = 1;
	p->multiGpuBoardGroupID = d;
	p->concurrentManagedAccess = 1;
	p->computePreemptionSupported = 1;
	p->cooperativeLaunch = 1;
	p->sharedMemPerBlockOptin =
		(size_t)attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, d);
	p->maxBlocksPerMultiProcessor = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, d);
	p->accessPolicyMaxWindowSize = attr(CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE, d);
	p->reservedSharedMemPerBlock =
		(size_t)attr(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, d);
	p->hostRegisterSupported = 1;
	p->memoryPoolsSupported = 1;
	p->clusterLaunch = 1;
	p->unifiedFunctionPointers = 1;
#if CUDART_VERSION < 13000
	p->clockRate = attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE, d);
	p->memoryClockRate = attr(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, d);
	p->deviceOverlap = 1;
	p->computeMode = 0;
	p->singleToDoublePrecisionPerfRatio = 2;
#else
	p->deviceNumaId = -1;
	p->gpuPciDeviceID = (unsigned int)attr(CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID, d);
	p->gpuPciSubsystemID = (unsigned int)attr(CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID, d);
#endif
	return cudaSuccess;
}

#if CUDART_VERSION >= 13000
API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
	return get_props(prop, device);
}
#else
API cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *prop, int device)
{
	return get_props(prop, device);
}

/* CUDA 11's unversioned name (same layout up to what CUDA 11 had). */
API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
	return get_props(prop, device);
}
#endif

API cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
	return retd(cuDeviceGetPCIBusId(pciBusId, len, device));
}

API cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *pciBusId)
{
	return retd(cuDeviceGetByPCIBusId(device, pciBusId));
}

API cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
	return retd(cuDeviceCanAccessPeer(canAccessPeer, device, peerDevice));
}

API cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
	CUcontext c;

	rt_ctx();
	if (cuDevicePrimaryCtxRetain(&c, peerDevice) != CUDA_SUCCESS)
		return ret(cudaErrorInvalidDevice);
	return retd(cuCtxEnablePeerAccess(c, flags));
}

API cudaError_t cudaDeviceDisablePeerAccess(int peerDevice)
{
	CUcontext c;

	rt_ctx();
	if (cuDevicePrimaryCtxRetain(&c, peerDevice) != CUDA_SUCCESS)
		return ret(cudaErrorInvalidDevice);
	return retd(cuCtxDisablePeerAccess(c));
}

API cudaError_t cudaDeviceSynchronize(void)
{
	rt_ctx();
	return retd(cuCtxSynchronize());
}

API cudaError_t cudaDeviceReset(void)
{
	int d = rt_ctx();

	return retd(cuDevicePrimaryCtxReset_v2(d));
}

API cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
	return retd(cuCtxGetStreamPriorityRange(leastPriority, greatestPriority));
}

API cudaError_t cudaDeviceSetLimit(enum cudaLimit limit, size_t value)
{
	rt_ctx();
	return retd(cuCtxSetLimit((CUlimit)limit, value));
}

API cudaError_t cudaDeviceGetLimit(size_t *pValue, enum cudaLimit limit)
{
	rt_ctx();
	return retd(cuCtxGetLimit(pValue, (CUlimit)limit));
}

API cudaError_t cudaDeviceGetCacheConfig(enum cudaFuncCache *pCacheConfig)
{
	if (!pCacheConfig)
		return ret(cudaErrorInvalidValue);
	*pCacheConfig = cudaFuncCachePreferNone;
	return cudaSuccess;
}

API cudaError_t cudaDeviceSetCacheConfig(enum cudaFuncCache cacheConfig)
{
	(void)cacheConfig;
	return cudaSuccess;
}

API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
	return retd(cuDeviceGetDefaultMemPool((CUmemoryPool *)memPool, device));
}

API cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device)
{
	return retd(cuDeviceGetMemPool((CUmemoryPool *)memPool, device));
}

API cudaError_t cudaDeviceGetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr,
					       void *value)
{
	return retd(cuDeviceGetGraphMemAttribute(device, (CUgraphMem_attribute)attr, value));
}

API cudaError_t cudaDeviceSetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr,
					       void *value)
{
	return retd(cuDeviceSetGraphMemAttribute(device, (CUgraphMem_attribute)attr, value));
}

API cudaError_t cudaDeviceGraphMemTrim(int device)
{
	return retd(cuDeviceGraphMemTrim(device));
}

API cudaError_t cudaDriverGetVersion(int *driverVersion)
{
	return retd(cuDriverGetVersion(driverVersion));
}

API cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
	if (!runtimeVersion)
		return ret(cudaErrorInvalidValue);
	*runtimeVersion = CUDART_VERSION;
	return cudaSuccess;
}

IMPL cudaError_t entry_point(const char *symbol, void **funcPtr, int version,
			     unsigned long long flags,
			     enum cudaDriverEntryPointQueryResult *driverStatus)
{
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
	CUresult r = cuGetProcAddress_v2(symbol, funcPtr, version, flags, &st);

	if (driverStatus)
		*driverStatus = (enum cudaDriverEntryPointQueryResult)st;
	if (r == CUDA_ERROR_NOT_FOUND)
		return cudaSuccess; /* like NVIDIA's: the status says why */
	return retd(r);
}

API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
						 unsigned int cudaVersion,
						 unsigned long long flags,
						 enum cudaDriverEntryPointQueryResult *driverStatus)
{
	return entry_point(symbol, funcPtr, (int)cudaVersion, flags, driverStatus);
}

API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
					unsigned long long flags,
					enum cudaDriverEntryPointQueryResult *driverStatus)
{
	return entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus);
}

/* ---- errors (API) -------------------------------------------------------------------------- */

API cudaError_t cudaGetLastError(void)
{
	cudaError_t e = t_last_error;

	t_last_error = cudaSuccess;
	return e;
}

API cudaError_t cudaPeekAtLastError(void)
{
	return t_last_error;
}

struct rterr {
	cudaError_t code;
	const char *name, *text;
};

#define E(c, t) {c, #c, t}
static const struct rterr rt_errs[] = {
	E(cudaSuccess, "no error"),
	E(cudaErrorInvalidValue, "invalid argument"),
	E(cudaErrorMemoryAllocation, "out of memory"),
	E(cudaErrorInitializationError, "initialization error"),
	E(cudaErrorCudartUnloading, "driver shutting down"),
	E(cudaErrorInvalidConfiguration, "invalid configuration argument"),
	E(cudaErrorInvalidDevice, "invalid device ordinal"),
	E(cudaErrorInvalidDeviceFunction, "invalid device function"),
	E(cudaErrorInvalidResourceHandle, "invalid resource handle"),
	E(cudaErrorSymbolNotFound, "named symbol not found"),
	E(cudaErrorNotReady, "device not ready"),
	E(cudaErrorNotSupported, "operation not supported"),
	E(cudaErrorNoDevice, "no CUDA-capable device is detected"),
	E(cudaErrorInsufficientDriver,
	  "CUDA driver version is insufficient for CUDA runtime version"),
	E(cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled"),
	E(cudaErrorPeerAccessNotEnabled, "peer access has not been enabled"),
	E(cudaErrorHostMemoryAlreadyRegistered,
	  "part or all of the requested memory range is already mapped"),
	E(cudaErrorHostMemoryNotRegistered, "pointer does not correspond to a registered memory region"),
	E(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing"),
	E(cudaErrorStreamCaptureInvalidated,
	  "operation failed due to a previous error during capture"),
	E(cudaErrorIllegalState, "the operation is not permitted"),
	E(cudaErrorUnsupportedLimit, "limit is not supported on this architecture"),
	E(cudaErrorDeviceUninitialized, "invalid device context"),
	E(cudaErrorInvalidPitchValue, "invalid pitch argument"),
	E(cudaErrorInvalidSymbol, "invalid device symbol"),
	E(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
	E(cudaErrorUnknown, "unknown error"),
};
#undef E

API const char *cudaGetErrorString(cudaError_t error)
{
	size_t i;

	for (i = 0; i < sizeof(rt_errs) / sizeof(rt_errs[0]); i++)
		if (rt_errs[i].code == error)
			return rt_errs[i].text;
	return "unrecognized error code";
}

API const char *cudaGetErrorName(cudaError_t error)
{
	size_t i;

	for (i = 0; i < sizeof(rt_errs) / sizeof(rt_errs[0]); i++)
		if (rt_errs[i].code == error)
			return rt_errs[i].name;
	return "cudaErrorUnknown";
}

/* ---- memory -------------------------------------------------------------------------------------- */

API cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	CUresult r;

	if (!devPtr)
		return ret(cudaErrorInvalidValue);
	rt_ctx();
	if (size == 0) {
		*devPtr = NULL;
		return cudaSuccess;
	}
	r = cuMemAlloc_v2((CUdeviceptr *)devPtr, size);
	return retd(r);
}

API cudaError_t cudaFree(void *devPtr)
{
	rt_ctx(); /* cudaFree(0) is how programs initialise the context */
	return retd(cuMemFree_v2((CUdeviceptr)(uintptr_t)devPtr));
}

IMPL cudaError_t malloc_async(void **p, size_t size, cudaStream_t s)
{
	if (!p)
		return ret(cudaErrorInvalidValue);
	rt_ctx();
	if (size == 0) {
		*p = NULL;
		return cudaSuccess;
	}
	return retd(cuMemAllocAsync((CUdeviceptr *)p, size, (CUstream)s));
}

API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
	return malloc_async(devPtr, size, hStream);
}

API cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
	return malloc_async(devPtr, size, hStream);
}

API cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
					cudaStream_t stream)
{
	(void)memPool;
	return malloc_async(ptr, size, stream);
}

API cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
					     cudaStream_t stream)
{
	(void)memPool;
	return malloc_async(ptr, size, stream);
}

API cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
	return retd(cuMemFreeAsync((CUdeviceptr)(uintptr_t)devPtr, (CUstream)hStream));
}

API cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
	return retd(cuMemFreeAsync_ptsz((CUdeviceptr)(uintptr_t)devPtr, (CUstream)hStream));
}

API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
	rt_ctx();
	return retd(cuMemAllocManaged((CUdeviceptr *)devPtr, size, flags ? flags : 1));
}

API cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
	rt_ctx();
	return retd(cuMemAllocPitch_v2((CUdeviceptr *)devPtr, pitch, width, height, 4));
}

API cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	rt_ctx();
	return retd(cuMemAllocHost_v2(ptr, size));
}

API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	rt_ctx();
	return retd(cuMemHostAlloc(pHost, size, flags));
}

API cudaError_t cudaFreeHost(void *ptr)
{
	return retd(cuMemFreeHost(ptr));
}

API cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
	rt_ctx();
	return retd(cuMemHostRegister_v2(ptr, size, flags));
}

API cudaError_t cudaHostUnregister(void *ptr)
{
	return retd(cuMemHostUnregister(ptr));
}

API cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
	return retd(cuMemHostGetDevicePointer_v2((CUdeviceptr *)pDevice, pHost, flags));
}

API cudaError_t cudaHostGetFlags(unsigned int *pFlags, void *pHost)
{
	return retd(cuMemHostGetFlags(pFlags, pHost));
}

API cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
	rt_ctx();
	return retd(cuMemGetInfo_v2(free, total));
}

API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
					 const void *ptr)
{
	CUpointer_attribute which[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
					CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
					CU_POINTER_ATTRIBUTE_IS_MANAGED,
					CU_POINTER_ATTRIBUTE_RANGE_SIZE};
	unsigned int type = 0;
	int device = -2, managed = 0;
	size_t size = 0;
	void *data[4] = {&type, &device, &managed, &size};

	if (!attributes)
		return ret(cudaErrorInvalidValue);
	memset(attributes, 0, sizeof(*attributes));
	cuPointerGetAttributes(4, which, data, (CUdeviceptr)(uintptr_t)ptr);
	if (!type) {
		attributes->type = cudaMemoryTypeUnregistered;
		attributes->device = -2;
		return cudaSuccess;
	}
	attributes->type = managed ? cudaMemoryTypeManaged
			   : type == CU_MEMORYTYPE_DEVICE ? cudaMemoryTypeDevice
							  : cudaMemoryTypeHost;
	attributes->device = device;
	attributes->devicePointer = (void *)ptr;
	attributes->hostPointer = type == CU_MEMORYTYPE_HOST || managed ? (void *)ptr : NULL;
	return cudaSuccess;
}

API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
	return retd(cuIpcGetMemHandle((CUipcMemHandle *)handle, (CUdeviceptr)(uintptr_t)devPtr));
}

API cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle,
				     unsigned int flags)
{
	CUipcMemHandle h;

	memcpy(&h, &handle, sizeof(h));
	return retd(cuIpcOpenMemHandle_v2((CUdeviceptr *)devPtr, h, flags));
}

API cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
	return retd(cuIpcCloseMemHandle((CUdeviceptr)(uintptr_t)devPtr));
}

/* Memory pools. */
API cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep)
{
	return retd(cuMemPoolTrimTo((CUmemoryPool)memPool, minBytesToKeep));
}

API cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
					void *value)
{
	return retd(cuMemPoolSetAttribute((CUmemoryPool)memPool, (CUmemPool_attribute)attr, value));
}

API cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
					void *value)
{
	return retd(cuMemPoolGetAttribute((CUmemoryPool)memPool, (CUmemPool_attribute)attr, value));
}

API cudaError_t cudaMemPoolSetAccess(cudaMemPool_t memPool, const struct cudaMemAccessDesc *descList,
				     size_t count)
{
	(void)descList;
	return retd(cuMemPoolSetAccess((CUmemoryPool)memPool, NULL, count));
}

/* ---- copies -------------------------------------------------------------------------------- */

#define DP(p) ((CUdeviceptr)(uintptr_t)(p))

IMPL cudaError_t memcpy_kind(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
			     cudaStream_t s, int async)
{
	CUstream cs = (CUstream)s;

	rt_ctx();
	switch (kind) {
	case cudaMemcpyHostToDevice:
		return retd(async ? cuMemcpyHtoDAsync_v2(DP(dst), src, n, cs)
				  : cuMemcpyHtoD_v2(DP(dst), src, n));
	case cudaMemcpyDeviceToHost:
		return retd(async ? cuMemcpyDtoHAsync_v2(dst, DP(src), n, cs)
				  : cuMemcpyDtoH_v2(dst, DP(src), n));
	case cudaMemcpyDeviceToDevice:
		return retd(async ? cuMemcpyDtoDAsync_v2(DP(dst), DP(src), n, cs)
				  : cuMemcpyDtoD_v2(DP(dst), DP(src), n));
	case cudaMemcpyHostToHost:
	case cudaMemcpyDefault:
		return retd(async ? cuMemcpyAsync(DP(dst), DP(src), n, cs)
				  : cuMemcpy(DP(dst), DP(src), n));
	default:
		return ret(cudaErrorInvalidMemcpyDirection);
	}
}

/* GF_SIM_TAIL_CALLS=1: cudaMemcpy and cudaMemcpyAsync end in a tail call to the driver,
 * `jmp *ptr` to the cuMemcpy / cuMemcpyAsync that cuGetProcAddress gave (as a runtime built
 * with sibling calls may: its frame is gone, so the driver returns straight to the
 * application, and its return address is the application's). The rest of this file is built
 * without sibling calls (build.py). */
typedef CUresult (*copy_fn)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*copy_async_fn)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
static copy_fn g_tail_copy;
static copy_async_fn g_tail_copy_async;
static pthread_once_t g_tail_once = PTHREAD_ONCE_INIT;

static void *tail_entry_point(const char *name)
{
	void *fn = NULL;
	CUdriverProcAddressQueryResult st;

	if (cuGetProcAddress_v2(name, &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &st) !=
	    CUDA_SUCCESS)
		return NULL;
	return fn;
}

static void tail_calls_init(void)
{
	const char *on = getenv("GF_SIM_TAIL_CALLS");

	if (!on || strcmp(on, "1") != 0)
		return;
	g_tail_copy = (copy_fn)tail_entry_point("cuMemcpy");
	g_tail_copy_async = (copy_async_fn)tail_entry_point("cuMemcpyAsync");
}

API __attribute__((optimize("optimize-sibling-calls")))
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	pthread_once(&g_tail_once, tail_calls_init);
	if (g_tail_copy) {
		rt_ctx();
		/* cudaError_t and CUresult agree on success (0) and are both 32 bits: no
		 * conversion after the call, so it is a jump. */
		return (cudaError_t)g_tail_copy(DP(dst), DP(src), count);
	}
	return memcpy_kind(dst, src, count, kind, NULL, 0);
}

API cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count,
				enum cudaMemcpyKind kind)
{
	return memcpy_kind(dst, src, count, kind, (cudaStream_t)0x2, 0);
}

API __attribute__((optimize("optimize-sibling-calls")))
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
			    cudaStream_t stream)
{
	pthread_once(&g_tail_once, tail_calls_init);
	if (g_tail_copy_async) {
		rt_ctx();
		return (cudaError_t)g_tail_copy_async(DP(dst), DP(src), count, (CUstream)stream);
	}
	return memcpy_kind(dst, src, count, kind, stream, 1);
}

API cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
				     enum cudaMemcpyKind kind, cudaStream_t stream)
{
	return memcpy_kind(dst, src, count, kind, stream, 1);
}

API cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice,
			       size_t count)
{
	(void)dstDevice, (void)srcDevice;
	rt_ctx();
	return retd(cuMemcpyPeer(DP(dst), NULL, DP(src), NULL, count));
}

API cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice,
				    size_t count, cudaStream_t stream)
{
	(void)dstDevice, (void)srcDevice;
	rt_ctx();
	return retd(cuMemcpyPeerAsync(DP(dst), NULL, DP(src), NULL, count, (CUstream)stream));
}

IMPL cudaError_t memcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
			  size_t height, cudaStream_t s, int async)
{
	CUDA_MEMCPY2D c;

	rt_ctx();
	memset(&c, 0, sizeof(c));
	c.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
	c.srcDevice = DP(src);
	c.srcHost = src;
	c.srcPitch = spitch;
	c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
	c.dstDevice = DP(dst);
	c.dstHost = dst;
	c.dstPitch = dpitch;
	c.WidthInBytes = width;
	c.Height = height;
	return retd(async ? cuMemcpy2DAsync_v2(&c, (CUstream)s) : cuMemcpy2D_v2(&c));
}

API cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
			     size_t width, size_t height, enum cudaMemcpyKind kind)
{
	(void)kind;
	return memcpy2d(dst, dpitch, src, spitch, width, height, NULL, 0);
}

API cudaError_t cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src, size_t spitch,
				  size_t width, size_t height, enum cudaMemcpyKind kind)
{
	(void)kind;
	return memcpy2d(dst, dpitch, src, spitch, width, height, NULL, 0);
}

API cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
				  size_t width, size_t height, enum cudaMemcpyKind kind,
				  cudaStream_t stream)
{
	(void)kind;
	return memcpy2d(dst, dpitch, src, spitch, width, height, stream, 1);
}

API cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src, size_t spitch,
				       size_t width, size_t height, enum cudaMemcpyKind kind,
				       cudaStream_t stream)
{
	(void)kind;
	return memcpy2d(dst, dpitch, src, spitch, width, height, stream, 1);
}

API cudaError_t cudaGetSymbolAddress(void **devPtr, const void *symbol)
{
	void *p = var_addr(symbol, NULL);

	if (!devPtr)
		return ret(cudaErrorInvalidValue);
	if (!p)
		return ret(cudaErrorInvalidSymbol);
	*devPtr = p;
	return cudaSuccess;
}

API cudaError_t cudaGetSymbolSize(size_t *size, const void *symbol)
{
	if (!size)
		return ret(cudaErrorInvalidValue);
	return var_addr(symbol, size) ? cudaSuccess : ret(cudaErrorInvalidSymbol);
}

IMPL cudaError_t to_symbol(const void *symbol, const void *src, size_t count, size_t offset,
			   enum cudaMemcpyKind kind, cudaStream_t s, int async)
{
	size_t size = 0;
	char *p = var_addr(symbol, &size);

	if (!p)
		return ret(cudaErrorInvalidSymbol);
	if (offset + count > size)
		return ret(cudaErrorInvalidValue);
	return memcpy_kind(p + offset, src, count,
			   kind == cudaMemcpyDefault ? cudaMemcpyDefault
			   : kind == cudaMemcpyDeviceToDevice ? cudaMemcpyDeviceToDevice
							      : cudaMemcpyHostToDevice,
			   s, async);
}

API cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count,
				   size_t offset, enum cudaMemcpyKind kind)
{
	return to_symbol(symbol, src, count, offset, kind, NULL, 0);
}

API cudaError_t cudaMemcpyToSymbolAsync(const void *symbol, const void *src, size_t count,
					size_t offset, enum cudaMemcpyKind kind,
					cudaStream_t stream)
{
	return to_symbol(symbol, src, count, offset, kind, stream, 1);
}

IMPL cudaError_t from_symbol(void *dst, const void *symbol, size_t count, size_t offset,
			     enum cudaMemcpyKind kind, cudaStream_t s, int async)
{
	size_t size = 0;
	char *p = var_addr(symbol, &size);

	if (!p)
		return ret(cudaErrorInvalidSymbol);
	if (offset + count > size)
		return ret(cudaErrorInvalidValue);
	return memcpy_kind(dst, p + offset, count,
			   kind == cudaMemcpyDefault ? cudaMemcpyDefault
			   : kind == cudaMemcpyDeviceToDevice ? cudaMemcpyDeviceToDevice
							      : cudaMemcpyDeviceToHost,
			   s, async);
}

API cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count, size_t offset,
				     enum cudaMemcpyKind kind)
{
	return from_symbol(dst, symbol, count, offset, kind, NULL, 0);
}

API cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t count,
					  size_t offset, enum cudaMemcpyKind kind,
					  cudaStream_t stream)
{
	return from_symbol(dst, symbol, count, offset, kind, stream, 1);
}

/* ---- memsets ------------------------------------------------------------------------------ */

API cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
	rt_ctx();
	return retd(cuMemsetD8_v2(DP(devPtr), (unsigned char)value, count));
}

API cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count)
{
	rt_ctx();
	return retd(cuMemsetD8_v2_ptds(DP(devPtr), (unsigned char)value, count));
}

API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	rt_ctx();
	return retd(cuMemsetD8Async(DP(devPtr), (unsigned char)value, count, (CUstream)stream));
}

API cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	rt_ctx();
	return retd(cuMemsetD8Async_ptsz(DP(devPtr), (unsigned char)value, count,
					 (CUstream)stream));
}

API cudaError_t cudaMemset2D(void *devPtr, size_t pitch, int value, size_t width, size_t height)
{
	rt_ctx();
	return retd(cuMemsetD2D8_v2(DP(devPtr), pitch, (unsigned char)value, width, height));
}

API cudaError_t cudaMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width,
				  size_t height, cudaStream_t stream)
{
	rt_ctx();
	return retd(cuMemsetD2D8Async(DP(devPtr), pitch, (unsigned char)value, width, height,
				      (CUstream)stream));
}

API cudaError_t cudaMemset2D_ptds(void *devPtr, size_t pitch, int value, size_t width,
				  size_t height)
{
	rt_ctx();
	return retd(cuMemsetD2D8_v2_ptds(DP(devPtr), pitch, (unsigned char)value, width, height));
}

API cudaError_t cudaMemset2DAsync_ptsz(void *devPtr, size_t pitch, int value, size_t width,
				       size_t height, cudaStream_t stream)
{
	rt_ctx();
	return retd(cuMemsetD2D8Async_ptsz(DP(devPtr), pitch, (unsigned char)value, width, height,
					   (CUstream)stream));
}

/* A 3D memset: one 2D memset of the driver's per slice (pitch x ysize bytes apart). */
IMPL cudaError_t memset3d(struct cudaPitchedPtr p, int value, struct cudaExtent e, cudaStream_t s,
			  int async, int per_thread)
{
	CUresult r = CUDA_SUCCESS;
	size_t z;

	rt_ctx();
	for (z = 0; z < e.depth && r == CUDA_SUCCESS; z++) {
		CUdeviceptr slice = DP((char *)p.ptr + z * p.pitch * p.ysize);
		unsigned char v = (unsigned char)value;

		if (async)
			r = per_thread ? cuMemsetD2D8Async_ptsz(slice, p.pitch, v, e.width, e.height,
								(CUstream)s)
				       : cuMemsetD2D8Async(slice, p.pitch, v, e.width, e.height,
							   (CUstream)s);
		else
			r = per_thread ? cuMemsetD2D8_v2_ptds(slice, p.pitch, v, e.width, e.height)
				       : cuMemsetD2D8_v2(slice, p.pitch, v, e.width, e.height);
	}
	return retd(r);
}

API cudaError_t cudaMemset3D(struct cudaPitchedPtr pitchedDevPtr, int value,
			     struct cudaExtent extent)
{
	return memset3d(pitchedDevPtr, value, extent, NULL, 0, 0);
}

API cudaError_t cudaMemset3D_ptds(struct cudaPitchedPtr pitchedDevPtr, int value,
				  struct cudaExtent extent)
{
	return memset3d(pitchedDevPtr, value, extent, NULL, 0, 1);
}

API cudaError_t cudaMemset3DAsync(struct cudaPitchedPtr pitchedDevPtr, int value,
				  struct cudaExtent extent, cudaStream_t stream)
{
	return memset3d(pitchedDevPtr, value, extent, stream, 1, 0);
}

API cudaError_t cudaMemset3DAsync_ptsz(struct cudaPitchedPtr pitchedDevPtr, int value,
				       struct cudaExtent extent, cudaStream_t stream)
{
	return memset3d(pitchedDevPtr, value, extent, stream, 1, 1);
}

/* ---- streams ------------------------------------------------------------------------------------ */

API cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
	rt_ctx();
	return retd(cuStreamCreate((CUstream *)pStream, 0));
}

API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
	rt_ctx();
	return retd(cuStreamCreate((CUstream *)pStream, flags));
}

API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags,
					     int priority)
{
	rt_ctx();
	return retd(cuStreamCreateWithPriority((CUstream *)pStream, flags, priority));
}

API cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
	return retd(cuStreamDestroy_v2((CUstream)stream));
}

API cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	rt_ctx();
	return retd(cuStreamSynchronize((CUstream)stream));
}

API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
	rt_ctx();
	return retd(cuStreamSynchronize_ptsz((CUstream)stream));
}

API cudaError_t cudaStreamQuery(cudaStream_t stream)
{
	CUresult r;

	rt_ctx();
	r = cuStreamQuery((CUstream)stream);
	return r == CUDA_ERROR_NOT_READY ? cudaErrorNotReady : retd(r);
}

API cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream)
{
	CUresult r;

	rt_ctx();
	r = cuStreamQuery_ptsz((CUstream)stream);
	return r == CUDA_ERROR_NOT_READY ? cudaErrorNotReady : retd(r);
}

API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
	rt_ctx();
	return retd(cuStreamWaitEvent((CUstream)stream, (CUevent)event, flags));
}

API cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event,
					 unsigned int flags)
{
	rt_ctx();
	return retd(cuStreamWaitEvent_ptsz((CUstream)stream, (CUevent)event, flags));
}

API cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int *priority)
{
	rt_ctx();
	return retd(cuStreamGetPriority((CUstream)hStream, priority));
}

API cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int *flags)
{
	rt_ctx();
	return retd(cuStreamGetFlags((CUstream)hStream, flags));
}

API cudaError_t cudaStreamGetId(cudaStream_t hStream, unsigned long long *streamId)
{
	rt_ctx();
	return retd(cuStreamGetId((CUstream)hStream, streamId));
}

API cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int *device)
{
	rt_ctx();
	return retd(cuStreamGetDevice((CUstream)hStream, device));
}

struct rt_cb {
	cudaStreamCallback_t cb;
	cudaStream_t s;
	void *user;
};

static void rt_cb_trampoline(void *p)
{
	struct rt_cb *w = p;

	w->cb(w->s, cudaSuccess, w->user);
	free(w);
}

API cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback,
				      void *userData, unsigned int flags)
{
	struct rt_cb *w;

	(void)flags;
	if (!callback)
		return ret(cudaErrorInvalidValue);
	w = calloc(1, sizeof(*w));
	if (!w)
		return ret(cudaErrorMemoryAllocation);
	w->cb = callback, w->s = stream, w->user = userData;
	rt_ctx();
	return retd(cuLaunchHostFunc((CUstream)stream, rt_cb_trampoline, w));
}

API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
	rt_ctx();
	return retd(cuStreamBeginCapture_v2((CUstream)stream, (CUstreamCaptureMode)mode));
}

API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
	rt_ctx();
	return retd(cuStreamBeginCapture_v2_ptsz((CUstream)stream, (CUstreamCaptureMode)mode));
}

API cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
					      const cudaGraphNode_t *dependencies,
					      const cudaGraphEdgeData *dependencyData,
					      size_t numDependencies,
					      enum cudaStreamCaptureMode mode)
{
	(void)dependencyData;
	rt_ctx();
	return retd(cuStreamBeginCaptureToGraph((CUstream)stream, (CUgraph)graph,
						(const CUgraphNode *)dependencies, NULL,
						numDependencies, (CUstreamCaptureMode)mode));
}

API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
	return retd(cuStreamEndCapture((CUstream)stream, (CUgraph *)pGraph));
}

API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph)
{
	return retd(cuStreamEndCapture_ptsz((CUstream)stream, (CUgraph *)pGraph));
}

API cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
				      enum cudaStreamCaptureStatus *pCaptureStatus)
{
	rt_ctx();
	return retd(cuStreamIsCapturing((CUstream)stream, (CUstreamCaptureStatus *)pCaptureStatus));
}

API cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream,
					   enum cudaStreamCaptureStatus *pCaptureStatus)
{
	rt_ctx();
	return retd(cuStreamIsCapturing_ptsz((CUstream)stream,
					     (CUstreamCaptureStatus *)pCaptureStatus));
}

IMPL cudaError_t capture_info(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
			      unsigned long long *id, cudaGraph_t *graph,
			      const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
			      size_t *ndeps)
{
	rt_ctx();
	return retd(cuStreamGetCaptureInfo_v3((CUstream)stream, (CUstreamCaptureStatus *)status,
					      (cuuint64_t *)id, (CUgraph *)graph,
					      (const CUgraphNode **)deps,
					      (const CUgraphEdgeData **)edges, ndeps));
}

#if CUDART_VERSION >= 13000
API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
					 enum cudaStreamCaptureStatus *captureStatus_out,
					 unsigned long long *id_out, cudaGraph_t *graph_out,
					 const cudaGraphNode_t **dependencies_out,
					 const cudaGraphEdgeData **edgeData_out,
					 size_t *numDependencies_out)
{
	return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out,
			    edgeData_out, numDependencies_out);
}

API cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t stream,
					      enum cudaStreamCaptureStatus *captureStatus_out,
					      unsigned long long *id_out, cudaGraph_t *graph_out,
					      const cudaGraphNode_t **dependencies_out,
					      const cudaGraphEdgeData **edgeData_out,
					      size_t *numDependencies_out)
{
	return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out,
			    edgeData_out, numDependencies_out);
}

API cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t stream,
						    cudaGraphNode_t *dependencies,
						    const cudaGraphEdgeData *dependencyData,
						    size_t numDependencies, unsigned int flags)
{
	(void)dependencyData;
	return retd(cuStreamUpdateCaptureDependencies_v2((CUstream)stream,
							 (CUgraphNode *)dependencies, NULL,
							 numDependencies, flags));
}
#else
API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
					 enum cudaStreamCaptureStatus *captureStatus_out,
					 unsigned long long *id_out)
{
	return capture_info(stream, captureStatus_out, id_out, NULL, NULL, NULL, NULL);
}

API cudaError_t cudaStreamGetCaptureInfo_v2(cudaStream_t stream,
					    enum cudaStreamCaptureStatus *captureStatus_out,
					    unsigned long long *id_out, cudaGraph_t *graph_out,
					    const cudaGraphNode_t **dependencies_out,
					    size_t *numDependencies_out)
{
	return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
			    numDependencies_out);
}

API cudaError_t cudaStreamGetCaptureInfo_v3(cudaStream_t stream,
					    enum cudaStreamCaptureStatus *captureStatus_out,
					    unsigned long long *id_out, cudaGraph_t *graph_out,
					    const cudaGraphNode_t **dependencies_out,
					    const cudaGraphEdgeData **edgeData_out,
					    size_t *numDependencies_out)
{
	return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out,
			    edgeData_out, numDependencies_out);
}

API cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t stream,
						    cudaGraphNode_t *dependencies,
						    size_t numDependencies, unsigned int flags)
{
	return retd(cuStreamUpdateCaptureDependencies_v2((CUstream)stream,
							 (CUgraphNode *)dependencies, NULL,
							 numDependencies, flags));
}
#endif

API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
	return retd(cuThreadExchangeStreamCaptureMode((CUstreamCaptureMode *)mode));
}

/* ---- events --------------------------------------------------------------------------------------- */

API cudaError_t cudaEventCreate(cudaEvent_t *event)
{
	rt_ctx();
	return retd(cuEventCreate((CUevent *)event, 0));
}

API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
	rt_ctx();
	return retd(cuEventCreate((CUevent *)event, flags));
}

API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	rt_ctx();
	return retd(cuEventRecord((CUevent)event, (CUstream)stream));
}

API cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream)
{
	rt_ctx();
	return retd(cuEventRecord_ptsz((CUevent)event, (CUstream)stream));
}

API cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
					 unsigned int flags)
{
	rt_ctx();
	return retd(cuEventRecordWithFlags((CUevent)event, (CUstream)stream, flags));
}

API cudaError_t cudaEventQuery(cudaEvent_t event)
{
	CUresult r = cuEventQuery((CUevent)event);

	return r == CUDA_ERROR_NOT_READY ? cudaErrorNotReady : retd(r);
}

API cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	return retd(cuEventSynchronize((CUevent)event));
}

API cudaError_t cudaEventDestroy(cudaEvent_t event)
{
	return retd(cuEventDestroy_v2((CUevent)event));
}

API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
	return retd(cuEventElapsedTime_v2(ms, (CUevent)start, (CUevent)end));
}

#if CUDART_VERSION < 13000
API cudaError_t cudaEventElapsedTime_v2(float *ms, cudaEvent_t start, cudaEvent_t end)
{
	return retd(cuEventElapsedTime_v2(ms, (CUevent)start, (CUevent)end));
}
#endif

/* ---- graphs ------------------------------------------------------------------------------------------ */

API cudaError_t cudaGraphCreate(cudaGraph_t *pGraph, unsigned int flags)
{
	return retd(cuGraphCreate((CUgraph *)pGraph, flags));
}

API cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
	return retd(cuGraphDestroy((CUgraph)graph));
}

API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
				     unsigned long long flags)
{
	rt_ctx();
	return retd(cuGraphInstantiateWithFlags((CUgraphExec *)pGraphExec, (CUgraph)graph, flags));
}

API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
					      unsigned long long flags)
{
	rt_ctx();
	return retd(cuGraphInstantiateWithFlags((CUgraphExec *)pGraphExec, (CUgraph)graph, flags));
}

API cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
					       cudaGraphInstantiateParams *instantiateParams)
{
	CUresult r;

	rt_ctx();
	r = cuGraphInstantiateWithFlags((CUgraphExec *)pGraphExec, (CUgraph)graph,
					instantiateParams ? instantiateParams->flags : 0);
	if (instantiateParams) {
		instantiateParams->result_out = r == CUDA_SUCCESS ? cudaGraphInstantiateSuccess
								  : cudaGraphInstantiateError;
		instantiateParams->errNode_out = NULL;
	}
	return retd(r);
}

API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
	return retd(cuGraphExecDestroy((CUgraphExec)graphExec));
}

API cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	rt_ctx();
	return retd(cuGraphLaunch((CUgraphExec)graphExec, (CUstream)stream));
}

API cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	rt_ctx();
	return retd(cuGraphLaunch_ptsz((CUgraphExec)graphExec, (CUstream)stream));
}

API cudaError_t cudaGraphUpload(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	return retd(cuGraphUpload((CUgraphExec)graphExec, (CUstream)stream));
}

API cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *numNodes)
{
	return retd(cuGraphGetNodes((CUgraph)graph, (CUgraphNode *)nodes, numNodes));
}

API cudaError_t cudaGraphGetRootNodes(cudaGraph_t graph, cudaGraphNode_t *pRootNodes,
				      size_t *pNumRootNodes)
{
	return retd(cuGraphGetRootNodes((CUgraph)graph, (CUgraphNode *)pRootNodes, pNumRootNodes));
}

API cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, enum cudaGraphNodeType *pType)
{
	return retd(cuGraphNodeGetType((CUgraphNode)node, (CUgraphNodeType *)pType));
}

#if CUDART_VERSION >= 13000
API cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t *pDependencies,
					     cudaGraphEdgeData *edgeData,
					     size_t *pNumDependencies)
{
	return retd(cuGraphNodeGetDependencies_v2((CUgraphNode)node, (CUgraphNode *)pDependencies,
						  (CUgraphEdgeData *)edgeData, pNumDependencies));
}
#else
API cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t *pDependencies,
					     size_t *pNumDependencies)
{
	return retd(cuGraphNodeGetDependencies_v2((CUgraphNode)node, (CUgraphNode *)pDependencies,
						  NULL, pNumDependencies));
}
#endif

API cudaError_t cudaGraphAddEmptyNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
				      const cudaGraphNode_t *pDependencies, size_t numDependencies)
{
	return retd(cuGraphAddEmptyNode((CUgraphNode *)pGraphNode, (CUgraph)graph,
					(const CUgraphNode *)pDependencies, numDependencies));
}

API cudaError_t cudaGraphAddKernelNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
				       const cudaGraphNode_t *pDependencies, size_t numDependencies,
				       const struct cudaKernelNodeParams *p)
{
	CUDA_KERNEL_NODE_PARAMS k;

	if (!p)
		return ret(cudaErrorInvalidValue);
	memset(&k, 0, sizeof(k));
	k.func = func_for(p->func);
	k.gridDimX = p->gridDim.x, k.gridDimY = p->gridDim.y, k.gridDimZ = p->gridDim.z;
	k.blockDimX = p->blockDim.x, k.blockDimY = p->blockDim.y, k.blockDimZ = p->blockDim.z;
	k.sharedMemBytes = p->sharedMemBytes;
	k.kernelParams = p->kernelParams;
	return retd(cuGraphAddKernelNode_v2((CUgraphNode *)pGraphNode, (CUgraph)graph,
					    (const CUgraphNode *)pDependencies, numDependencies,
					    &k));
}

API cudaError_t cudaGraphAddMemsetNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
				       const cudaGraphNode_t *pDependencies, size_t numDependencies,
				       const struct cudaMemsetParams *p)
{
	CUDA_MEMSET_NODE_PARAMS m;

	if (!p)
		return ret(cudaErrorInvalidValue);
	memset(&m, 0, sizeof(m));
	m.dst = DP(p->dst);
	m.pitch = p->pitch;
	m.value = p->value;
	m.elementSize = p->elementSize;
	m.width = p->width;
	m.height = p->height;
	return retd(cuGraphAddMemsetNode((CUgraphNode *)pGraphNode, (CUgraph)graph,
					 (const CUgraphNode *)pDependencies, numDependencies, &m,
					 NULL));
}

API cudaError_t cudaGraphAddHostNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
				     const cudaGraphNode_t *pDependencies, size_t numDependencies,
				     const struct cudaHostNodeParams *p)
{
	CUDA_HOST_NODE_PARAMS h;

	if (!p)
		return ret(cudaErrorInvalidValue);
	memset(&h, 0, sizeof(h));
	h.fn = (CUhostFn)p->fn;
	h.userData = p->userData;
	return retd(cuGraphAddHostNode((CUgraphNode *)pGraphNode, (CUgraph)graph,
				       (const CUgraphNode *)pDependencies, numDependencies, &h));
}

API cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					   const cudaGraphNode_t *pDependencies,
					   size_t numDependencies, cudaGraph_t childGraph)
{
	return retd(cuGraphAddChildGraphNode((CUgraphNode *)pGraphNode, (CUgraph)graph,
					     (const CUgraphNode *)pDependencies, numDependencies,
					     (CUgraph)childGraph));
}

/* cudaGraphAddNode: only kinds whose runtime and driver parameters coincide are kept;
 * others become empty nodes. */
IMPL cudaError_t add_node(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
			  const cudaGraphNode_t *deps, size_t n, struct cudaGraphNodeParams *p)
{
	CUgraphNodeParams c;

	if (!p)
		return ret(cudaErrorInvalidValue);
	memset(&c, 0, sizeof(c));
	if (p->type == cudaGraphNodeTypeKernel) {
		c.type = CU_GRAPH_NODE_TYPE_KERNEL;
		c.kernel.func = func_for(p->kernel.func);
		c.kernel.gridDimX = p->kernel.gridDim.x;
		c.kernel.gridDimY = p->kernel.gridDim.y;
		c.kernel.gridDimZ = p->kernel.gridDim.z;
		c.kernel.blockDimX = p->kernel.blockDim.x;
		c.kernel.blockDimY = p->kernel.blockDim.y;
		c.kernel.blockDimZ = p->kernel.blockDim.z;
		c.kernel.sharedMemBytes = p->kernel.sharedMemBytes;
	} else if (p->type == cudaGraphNodeTypeMemset) {
		c.type = CU_GRAPH_NODE_TYPE_MEMSET;
		c.memset.dst = DP(p->memset.dst);
		c.memset.pitch = p->memset.pitch;
		c.memset.value = p->memset.value;
		c.memset.elementSize = p->memset.elementSize;
		c.memset.width = p->memset.width;
		c.memset.height = p->memset.height;
	} else if (p->type == cudaGraphNodeTypeHost) {
		c.type = CU_GRAPH_NODE_TYPE_HOST;
		c.host.fn = (CUhostFn)p->host.fn;
		c.host.userData = p->host.userData;
	} else if (p->type == cudaGraphNodeTypeGraph) {
		c.type = CU_GRAPH_NODE_TYPE_GRAPH;
		c.graph.graph = (CUgraph)p->graph.graph;
	} else {
		c.type = CU_GRAPH_NODE_TYPE_EMPTY;
	}
	return retd(cuGraphAddNode_v2((CUgraphNode *)pGraphNode, (CUgraph)graph,
				      (const CUgraphNode *)deps, NULL, n, &c));
}

#if CUDART_VERSION >= 13000
API cudaError_t cudaGraphAddNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
				 const cudaGraphNode_t *pDependencies,
				 const cudaGraphEdgeData *dependencyData, size_t numDependencies,
				 struct cudaGraphNodeParams *nodeParams)
{
	(void)dependencyData;
	return add_node(pGraphNode, graph, pDependencies, numDependencies, nodeParams);
}
#else
API cudaError_t cudaGraphAddNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
				 const cudaGraphNode_t *pDependencies, size_t numDependencies,
				 struct cudaGraphNodeParams *nodeParams)
{
	return add_node(pGraphNode, graph, pDependencies, numDependencies, nodeParams);
}

API cudaError_t cudaGraphAddNode_v2(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
				    const cudaGraphNode_t *pDependencies,
				    const cudaGraphEdgeData *dependencyData, size_t numDependencies,
				    struct cudaGraphNodeParams *nodeParams)
{
	(void)dependencyData;
	return add_node(pGraphNode, graph, pDependencies, numDependencies, nodeParams);
}
#endif

API cudaError_t cudaGraphDebugDotPrint(cudaGraph_t graph, const char *path, unsigned int flags)
{
	return retd(cuGraphDebugDotPrint((CUgraph)graph, path, flags));
}

API cudaError_t cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle *pHandle_out,
						 cudaGraph_t graph,
						 unsigned int defaultLaunchValue,
						 unsigned int flags)
{
	return retd(cuGraphConditionalHandleCreate((CUgraphConditionalHandle *)pHandle_out,
						   (CUgraph)graph, NULL, defaultLaunchValue, flags));
}

API cudaError_t cudaUserObjectCreate(cudaUserObject_t *object_out, void *ptr,
				     cudaHostFn_t destroy, unsigned int initialRefcount,
				     unsigned int flags)
{
	return retd(cuUserObjectCreate((CUuserObject *)object_out, ptr, (CUhostFn)destroy,
				       initialRefcount, flags));
}

API cudaError_t cudaUserObjectRetain(cudaUserObject_t object, unsigned int count)
{
	return retd(cuUserObjectRetain((CUuserObject)object, count));
}

API cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count)
{
	return retd(cuUserObjectRelease((CUuserObject)object, count));
}

API cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t object,
					  unsigned int count, unsigned int flags)
{
	return retd(cuGraphRetainUserObject((CUgraph)graph, (CUuserObject)object, count, flags));
}

API cudaError_t cudaGraphReleaseUserObject(cudaGraph_t graph, cudaUserObject_t object,
					   unsigned int count)
{
	return retd(cuGraphReleaseUserObject((CUgraph)graph, (CUuserObject)object, count));
}

/* ---- misc ----------------------------------------------------------------------------------------- */

API cudaError_t cudaProfilerStart(void)
{
	return retd(cuProfilerStart());
}

API cudaError_t cudaProfilerStop(void)
{
	return retd(cuProfilerStop());
}

API cudaError_t cudaThreadSynchronize(void)
{
	rt_ctx();
	return retd(cuCtxSynchronize());
}
