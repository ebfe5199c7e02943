/* bench: a runtime whose entry points do nothing, compiled with frame pointers
 * so each one starts with `push rbp` like NVIDIA's libcudart. */
#include "../gpuflight/demo/cuda_abi.h"

__attribute__((noinline)) cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block,
							void **args, size_t shared, cudaStream_t stream)
{
	__asm__ volatile("" ::"r"(func), "r"(args), "r"(shared), "r"(stream) : "memory");
	(void)grid, (void)block;
	return 0;
}

__attribute__((noinline)) cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
						       enum cudaMemcpyKind kind, cudaStream_t stream)
{
	volatile enum cudaMemcpyKind spilled = kind; /* a stack slot: keeps the frame */
	__asm__ volatile("" ::"r"(dst), "r"(src), "r"(count), "r"(stream) : "memory");
	(void)spilled;
	return 0;
}
