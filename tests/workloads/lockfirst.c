/* gpuflight tests: a stub CUDA runtime one of whose functions the kernel cannot probe.
 *
 * cudaDeviceSynchronize starts with a lock-prefixed instruction (lock addl $0,(%rsp), the
 * full-barrier idiom), which x86 uprobes refuse to single-step: a tracer must attach the
 * file's other functions all the same and say which one it could not. cudaLaunchKernel and
 * cudaMemcpy (what the dlopen workload calls) are ordinary and succeed; so does the rest.
 */
#include <stddef.h>

#include "cuda_abi.h"

#define API __attribute__((visibility("default"), noinline))

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

/* cudaError_t cudaDeviceSynchronize(void): a barrier, then success. */
__asm__(".text\n"
	".globl cudaDeviceSynchronize\n"
	".type cudaDeviceSynchronize, @function\n"
	"cudaDeviceSynchronize:\n"
	"\tlock addl $0, (%rsp)\n"
	"\txorl %eax, %eax\n"
	"\tret\n"
	".size cudaDeviceSynchronize, .-cudaDeviceSynchronize\n");
