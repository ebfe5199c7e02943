/* gpuflight: our own minimal declarations of the CUDA runtime API we use.
 *
 * The demo workload and the test workloads are built from this header alone,
 * without NVIDIA's headers, and link against either the real libcudart (12 or
 * 13, shared or static) or the simulated GPU's (gpuflight/simgpu). Every
 * declaration here is ABI-identical (x86-64 System V) to the one in NVIDIA's
 * cuda_runtime_api.h / driver_types.h / vector_types.h (checked against the
 * CUDA 13 headers of the nvidia-cuda-runtime wheel); struct tags are the real
 * ones, so code written against the real headers compiles against this one.
 *
 * Only the functions of bpf/events.h (and a few conveniences) are declared.
 * The _ptsz / _ptds functions are the per-thread-default-stream entry points
 * that nvcc code calls when built with --default-stream per-thread; each has
 * exactly the signature of its base function.
 *
 * Calling convention notes for probe writers (System V, by-value structs):
 *   dim3 (12 bytes) travels in two integer registers: x|y<<32, then z.
 *     cudaLaunchKernel(func=rdi, grid=rsi:rdx, block=rcx:r8, args=r9,
 *                      sharedMem=[rsp+8], stream=[rsp+16]) at function entry.
 *   cudaPitchedPtr (32 bytes) and cudaExtent (24 bytes) are passed in memory:
 *     cudaMemset3D(ptr=[rsp+8..40), value=edi, extent=[rsp+40..64)),
 *     cudaMemset3DAsync: the same, stream=rsi.
 */
#ifndef GPUFLIGHT_CUDA_ABI_H
#define GPUFLIGHT_CUDA_ABI_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* enum cudaError in the real headers: an int-sized enum, returned in eax. */
typedef int cudaError_t;
#define cudaSuccess 0
#define cudaErrorInvalidValue 1
#define cudaErrorMemoryAllocation 2
#define cudaErrorInsufficientDriver 35

/* Opaque handles: the runtime never lets user code look inside them. */
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;

/* Special stream handles (cuda_runtime_api.h / driver_types.h). */
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

/* Flags used by the workloads. */
#define cudaMemAttachGlobal 0x01u
#define cudaHostAllocDefault 0x00u
#define cudaHostAllocPortable 0x01u
#define cudaHostAllocMapped 0x02u

typedef struct dim3 {
	unsigned int x, y, z;
} dim3;

/* cudaLaunchAttribute is opaque to us: we only ever pass attrs == NULL. */
struct cudaLaunchAttribute_st;

typedef struct cudaLaunchConfig_st {
	dim3 gridDim;                          /* @0  */
	dim3 blockDim;                         /* @12 */
	size_t dynamicSmemBytes;               /* @24 */
	cudaStream_t stream;                   /* @32 */
	struct cudaLaunchAttribute_st *attrs;  /* @40 */
	unsigned int numAttrs;                 /* @48, then 4 bytes of padding */
} cudaLaunchConfig_t;

typedef struct cudaPitchedPtr {
	void *ptr;
	size_t pitch;
	size_t xsize;
	size_t ysize;
} cudaPitchedPtr;

typedef struct cudaExtent {
	size_t width; /* bytes, for linear memory */
	size_t height;
	size_t depth;
} cudaExtent;

enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4,
};

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(dim3) == 12, "dim3 is 12 bytes");
_Static_assert(sizeof(cudaLaunchConfig_t) == 56, "cudaLaunchConfig_t is 56 bytes");
_Static_assert(offsetof(cudaLaunchConfig_t, gridDim) == 0, "gridDim@0");
_Static_assert(offsetof(cudaLaunchConfig_t, blockDim) == 12, "blockDim@12");
_Static_assert(offsetof(cudaLaunchConfig_t, dynamicSmemBytes) == 24, "dynamicSmemBytes@24");
_Static_assert(offsetof(cudaLaunchConfig_t, stream) == 32, "stream@32");
_Static_assert(offsetof(cudaLaunchConfig_t, attrs) == 40, "attrs@40");
_Static_assert(offsetof(cudaLaunchConfig_t, numAttrs) == 48, "numAttrs@48");
_Static_assert(sizeof(cudaPitchedPtr) == 32, "cudaPitchedPtr is 32 bytes");
_Static_assert(sizeof(cudaExtent) == 24, "cudaExtent is 24 bytes");
_Static_assert(sizeof(enum cudaMemcpyKind) == 4, "cudaMemcpyKind is int-sized");
#endif

/* ---- kernel launch ---------------------------------------------------- */
cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
			     size_t sharedMem, cudaStream_t stream);
cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim, void **args,
				  size_t sharedMem, cudaStream_t stream);
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args);
cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func,
				     void **args);
cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim,
					void **args, size_t sharedMem, cudaStream_t stream);
cudaError_t cudaLaunchCooperativeKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim,
					     void **args, size_t sharedMem, cudaStream_t stream);

/* ---- memcpy ----------------------------------------------------------- */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
			    cudaStream_t stream);
cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
				 enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice,
			   size_t count);
cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice,
				size_t count, cudaStream_t stream);
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
			 size_t height, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src, size_t spitch,
			      size_t width, size_t height, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
			      size_t width, size_t height, enum cudaMemcpyKind kind,
			      cudaStream_t stream);
cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src, size_t spitch,
				   size_t width, size_t height, enum cudaMemcpyKind kind,
				   cudaStream_t stream);

/* ---- memset ----------------------------------------------------------- */
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaMemset2D(void *devPtr, size_t pitch, int value, size_t width, size_t height);
cudaError_t cudaMemset2D_ptds(void *devPtr, size_t pitch, int value, size_t width,
			      size_t height);
cudaError_t cudaMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width,
			      size_t height, cudaStream_t stream);
cudaError_t cudaMemset2DAsync_ptsz(void *devPtr, size_t pitch, int value, size_t width,
				   size_t height, cudaStream_t stream);
cudaError_t cudaMemset3D(struct cudaPitchedPtr pitchedDevPtr, int value, struct cudaExtent extent);
cudaError_t cudaMemset3D_ptds(struct cudaPitchedPtr pitchedDevPtr, int value,
			      struct cudaExtent extent);
cudaError_t cudaMemset3DAsync(struct cudaPitchedPtr pitchedDevPtr, int value,
			      struct cudaExtent extent, cudaStream_t stream);
cudaError_t cudaMemset3DAsync_ptsz(struct cudaPitchedPtr pitchedDevPtr, int value,
				   struct cudaExtent extent, cudaStream_t stream);

/* ---- allocation ------------------------------------------------------- */
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
				    cudaStream_t stream);
cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
					 cudaStream_t stream);

/* ---- free ------------------------------------------------------------- */
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
cudaError_t cudaFreeHost(void *ptr);

/* ---- synchronization -------------------------------------------------- */
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaEventSynchronize(cudaEvent_t event);

/* ---- graphs ----------------------------------------------------------- */
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream);
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream);

/* ---- conveniences (not probed) ---------------------------------------- */
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetDeviceCount(int *count);

/* Function-pointer types, for dlsym users. */
typedef cudaError_t (*cudaLaunchKernel_fn)(const void *, dim3, dim3, void **, size_t,
					   cudaStream_t);
typedef cudaError_t (*cudaMemcpy_fn)(void *, const void *, size_t, enum cudaMemcpyKind);

#ifdef __cplusplus
}
#endif

#endif
