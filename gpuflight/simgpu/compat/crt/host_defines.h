/* gpuflight simulated GPU: a host-only stand-in for the CUDA compiler's
 * crt/host_defines.h, which the runtime headers include but the CUDA runtime
 * wheels do not ship. Only what a host C compiler needs to read
 * cuda_runtime_api.h: the CUDA qualifiers expand to nothing. */
#ifndef GF_COMPAT_HOST_DEFINES_H
#define GF_COMPAT_HOST_DEFINES_H

#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __launch_bounds__(...)
#define __cudart_builtin__
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __no_return__ __attribute__((noreturn))
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(a) __align__(a)
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __annotate__(a) __attribute__((a))
#define __location__(a) __annotate__(a)
#define CUDARTAPI
#define CUDARTAPI_CDECL
#define __specialization_static
#define __dv(v)
#define __CUDA_ALIGN__(n) __align__(n)

#endif
