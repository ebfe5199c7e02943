/* gpuflight tests: our own declarations of the CUDA driver API (libcuda) we call.
 *
 * ABI-identical (x86-64 System V) to NVIDIA's cuda.h for the functions declared:
 * handles are pointers, CUdeviceptr is 64-bit, CUresult an int-sized enum. The test
 * workloads call either the real libcuda.so.1 (where every call fails without a
 * driver, after the probes have seen its arguments) or stubcuda.c, our stub.
 *
 *   cuLaunchKernel(f=rdi, gx=esi, gy=edx, gz=ecx, bx=r8d, by=r9d, bz=[sp+8],
 *                  sharedMem=[sp+16], stream=[sp+24], params=[sp+32], extra=[sp+40])
 *   CUlaunchConfig: grid@0, block@12, sharedMemBytes (32-bit)@24, hStream@32,
 *                   attrs@40, numAttrs@48
 */
#ifndef GPUFLIGHT_CUDA_DRIVER_H
#define GPUFLIGHT_CUDA_DRIVER_H

#include <stddef.h>

typedef int CUresult;
#define CUDA_SUCCESS 0
typedef unsigned long long CUdeviceptr;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUctx_st *CUcontext;

typedef struct CUlaunchConfig_st {
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	CUstream hStream;
	void *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(offsetof(CUlaunchConfig, sharedMemBytes) == 24, "sharedMemBytes@24");
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32, "hStream@32");
#endif

#define GF_CU_LAUNCH_ARGS                                                               \
	CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
		unsigned int by, unsigned int bz, unsigned int sharedMem, CUstream stream,  \
		void **params, void **extra

CUresult cuInit(unsigned int flags);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
			  unsigned long long flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
			     unsigned long long flags, int *status);

CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n, void *options,
			    void **values);
CUresult cuModuleGetFunction(CUfunction *f, CUmodule module, const char *name);
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jitOptions,
			   void **jitValues, unsigned int nJit, void *libOptions, void **libValues,
			   unsigned int nLib);
CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name);
CUresult cuKernelGetFunction(CUfunction *f, CUkernel kernel);

CUresult cuLaunchKernel(GF_CU_LAUNCH_ARGS);
CUresult cuLaunchKernel_ptsz(GF_CU_LAUNCH_ARGS);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
				   unsigned int gz, unsigned int bx, unsigned int by,
				   unsigned int bz, unsigned int sharedMem, CUstream stream,
				   void **params);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
					unsigned int gz, unsigned int bx, unsigned int by,
					unsigned int bz, unsigned int sharedMem, CUstream stream,
					void **params);
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
			  void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params,
			       void **extra);

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n);
CUresult cuMemcpyPeer_ptds(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc,
			   size_t n);
CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc,
			   size_t n, CUstream s);
CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc,
				size_t n, CUstream s);

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char v, size_t n);
CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short v, size_t n);
CUresult cuMemsetD16_v2_ptds(CUdeviceptr dst, unsigned short v, size_t n);
CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n);
CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int v, size_t n);
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char v, size_t n, CUstream s);
CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, CUstream s);
CUresult cuMemsetD16Async_ptsz(CUdeviceptr dst, unsigned short v, size_t n, CUstream s);
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int v, size_t n, CUstream s);

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n);
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s);
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int flags);
CUresult cuMemAllocHost_v2(void **p, size_t n);
CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s);
CUresult cuMemFreeHost(void *p);

CUresult cuStreamSynchronize(CUstream s);
CUresult cuStreamSynchronize_ptsz(CUstream s);
CUresult cuCtxSynchronize(void);
CUresult cuEventSynchronize(CUevent e);

CUresult cuGraphLaunch(CUgraphExec e, CUstream s);
CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s);
CUresult cuStreamBeginCapture_v2(CUstream s, int mode);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode);
CUresult cuStreamEndCapture(CUstream s, CUgraph *g);
CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags);
CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g, void *params);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g, void *params);

#endif
