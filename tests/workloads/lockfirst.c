/* gpuflight tests: a stub CUDA runtime whose functions the kernel may refuse to probe.
 *
 * cudaDeviceSynchronize starts with a lock-prefixed instruction (lock addl $0,(%rsp), the
 * full-barrier idiom), which x86 uprobes refuse to single-step: a tracer must attach the
 * file's other functions all the same and say which one it could not. cudaLaunchKernel,
 * cudaMemcpy (what the dlopen workload calls) and cudaStreamSynchronize are ordinary.
 * Built with -DGF_ALL_LOCKED, every function starts so: nothing of the file can be probed.
 * Every function returns success and does nothing else.
 */
#include <stddef.h>

#include "cuda_abi.h"

/* name: lock addl $0,(%rsp); return 0 (cudaSuccess). */
#define LOCKED(name)                                   \
	__asm__(".text\n"                              \
		".globl " #name "\n"                   \
		".type " #name ", @function\n" #name   \
		":\n"                                  \
		"\tlock addl $0, (%rsp)\n"             \
		"\txorl %eax, %eax\n"                  \
		"\tret\n"                              \
		".size " #name ", .-" #name "\n")

#define API __attribute__((visibility("default"), noinline))

LOCKED(cudaDeviceSynchronize);

#ifdef GF_ALL_LOCKED
LOCKED(cudaLaunchKernel);
LOCKED(cudaMemcpy);
LOCKED(cudaStreamSynchronize);
#else
static volatile int touched;

API cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
				 size_t smem, cudaStream_t stream)
{
	touched += (int)grid.x + (int)block.x + (int)smem + (func && args && !stream);
	return 0;
}

API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	touched += (int)count + (int)kind + (dst != src);
	return 0;
}

API cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	touched += !stream;
	return 0;
}
#endif
