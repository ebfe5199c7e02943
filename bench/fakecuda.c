/* bench: a driver whose cuLaunchKernel does nothing, compiled with frame pointers (it
 * starts with `push rbp`), exported as libcuda.so.1 so gpuflight probes it as a driver. */
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;

__attribute__((noinline)) int cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy,
					     unsigned int gz, unsigned int bx, unsigned int by,
					     unsigned int bz, unsigned int shared, CUstream stream,
					     void **params, void **extra)
{
	__asm__ volatile("" ::"r"(f), "r"(params), "r"(extra), "r"(stream) : "memory");
	(void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared;
	return 0;
}
