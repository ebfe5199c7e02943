/* gpuflight simulated GPU: a stub CUDA runtime, built as libcudart.so.12.
 *
 * It exports the CUDA runtime functions of bpf/events.h (and their _ptsz/_ptds
 * variants) with exactly the real ABI (see cuda_abi.h) and the real symbol
 * version (libcudart.so.12), so any program built against the real runtime or
 * against this one runs on either. Every call succeeds (returns cudaSuccess;
 * only a NULL out-pointer or an allocation failure returns an error).
 *
 * One simulated GPU timeline, shared by all streams and threads (mutex
 * protected). Work is appended after the current "busy until" time:
 *   launch        the kernel is submitted at call entry; it runs for
 *                 GF_SIM_KERNEL_BASE_NS + total_threads * GF_SIM_NS_PER_THREAD;
 *                 then the call costs the CPU GF_SIM_LAUNCH_NS of busy-spin
 *                 (the driver's bookkeeping), so back-to-back launches of short
 *                 kernels leave the GPU idle, as on real hardware.
 *   async copy    enqueues bytes / bandwidth; the bytes are moved at once.
 *   sync copy     waits for the timeline, then takes bytes / bandwidth of wall
 *                 time while it really moves the bytes (device memory is host
 *                 memory here).
 *   memset        like a copy, at the D2D bandwidth; the plain (non-Async)
 *                 forms wait for completion.
 *   graph launch  enqueues 50 us.
 *   sync          stream, device and event syncs all wait for the timeline.
 * Waits longer than 50 us sleep (clock_nanosleep) until 50 us before the
 * deadline and spin the rest; shorter waits spin.
 *
 * Bandwidths: H2D and D2H 12 GB/s, D2D 600 GB/s, H2H and default 20 GB/s.
 * Streams, events, graphs and pools are opaque values: never dereferenced.
 *
 * Environment (read once at load):
 *   GF_SIM_LAUNCH_NS       CPU cost of a launch, ns (default 4000)
 *   GF_SIM_KERNEL_BASE_NS  fixed part of a kernel's duration, ns (default 600)
 *   GF_SIM_NS_PER_THREAD   per-thread part, ns, fractional (default 0.04)
 *   GF_SIM_H2D_GBPS, GF_SIM_D2H_GBPS, GF_SIM_D2D_GBPS, GF_SIM_H2H_GBPS,
 *   GF_SIM_DEFAULT_GBPS    bandwidths, GB/s (1e9 bytes/s)
 *   GF_SIM_REPORT          a file path: at exit, append one JSON line
 *     {"kernels":N,"gpu_busy_ns":B,"span_ns":S,"utilization":B/S}
 *     N counts kernel launches; B is the time the timeline held any work
 *     (kernels, copies, memsets, graphs); S runs from the start of the first
 *     enqueued work to the end of the last.
 * It never writes to stdout or stderr.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

#define API __attribute__((visibility("default")))

#define SPIN_NS 50000ull          /* waits up to this long spin */
#define GRAPH_NS 50000ull         /* one graph launch on the timeline */
#define DEVICE_ALIGN 256

/* ---- configuration ---------------------------------------------------- */

static uint64_t launch_ns = 4000;
static uint64_t kernel_base_ns = 600;
static double ns_per_thread = 0.04;
/* bytes per ns (== GB/s), indexed by cudaMemcpyKind */
static double bw[5] = {20.0, 12.0, 12.0, 600.0, 20.0};
static char report_path[4096];

static uint64_t env_u64(const char *name, uint64_t dflt)
{
	const char *s = getenv(name);
	char *end;
	unsigned long long v;

	if (!s || !*s)
		return dflt;
	v = strtoull(s, &end, 10);
	return *end ? dflt : (uint64_t)v;
}

static double env_pos_double(const char *name, double dflt)
{
	const char *s = getenv(name);
	char *end;
	double v;

	if (!s || !*s)
		return dflt;
	v = strtod(s, &end);
	return (*end || !(v >= 0.0)) ? dflt : v;
}

static void __attribute__((constructor)) sim_init(void)
{
	const char *report = getenv("GF_SIM_REPORT");
	double v;

	launch_ns = env_u64("GF_SIM_LAUNCH_NS", launch_ns);
	kernel_base_ns = env_u64("GF_SIM_KERNEL_BASE_NS", kernel_base_ns);
	ns_per_thread = env_pos_double("GF_SIM_NS_PER_THREAD", ns_per_thread);
	v = env_pos_double("GF_SIM_H2H_GBPS", bw[cudaMemcpyHostToHost]);
	bw[cudaMemcpyHostToHost] = v > 0 ? v : bw[cudaMemcpyHostToHost];
	v = env_pos_double("GF_SIM_H2D_GBPS", bw[cudaMemcpyHostToDevice]);
	bw[cudaMemcpyHostToDevice] = v > 0 ? v : bw[cudaMemcpyHostToDevice];
	v = env_pos_double("GF_SIM_D2H_GBPS", bw[cudaMemcpyDeviceToHost]);
	bw[cudaMemcpyDeviceToHost] = v > 0 ? v : bw[cudaMemcpyDeviceToHost];
	v = env_pos_double("GF_SIM_D2D_GBPS", bw[cudaMemcpyDeviceToDevice]);
	bw[cudaMemcpyDeviceToDevice] = v > 0 ? v : bw[cudaMemcpyDeviceToDevice];
	v = env_pos_double("GF_SIM_DEFAULT_GBPS", bw[cudaMemcpyDefault]);
	bw[cudaMemcpyDefault] = v > 0 ? v : bw[cudaMemcpyDefault];
	if (report && *report && strlen(report) < sizeof(report_path))
		memcpy(report_path, report, strlen(report) + 1);
}

/* ---- the timeline ----------------------------------------------------- */

static pthread_mutex_t tl_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t tl_busy_until;  /* end of the last enqueued work */
static uint64_t tl_first_start; /* start of the first, valid if tl_started */
static uint64_t tl_busy_ns;
static uint64_t tl_kernels;
static int tl_started;

struct slot {
	uint64_t start, end;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static void wait_until(uint64_t deadline)
{
	for (;;) {
		uint64_t now = now_ns();

		if (now >= deadline)
			return;
		if (deadline - now > SPIN_NS) {
			uint64_t wake = deadline - SPIN_NS;
			struct timespec ts = {
				.tv_sec = (time_t)(wake / 1000000000ull),
				.tv_nsec = (long)(wake % 1000000000ull),
			};

			clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
		} else {
			cpu_relax();
		}
	}
}

static struct slot enqueue(uint64_t at, uint64_t duration, int is_kernel)
{
	struct slot s;

	pthread_mutex_lock(&tl_lock);
	s.start = at > tl_busy_until ? at : tl_busy_until;
	s.end = s.start + duration;
	if (!tl_started) {
		tl_started = 1;
		tl_first_start = s.start;
	}
	tl_busy_until = s.end;
	tl_busy_ns += duration;
	if (is_kernel)
		tl_kernels++;
	pthread_mutex_unlock(&tl_lock);
	return s;
}

static uint64_t busy_until(void)
{
	uint64_t t;

	pthread_mutex_lock(&tl_lock);
	t = tl_busy_until;
	pthread_mutex_unlock(&tl_lock);
	return t;
}

static uint64_t transfer_ns(size_t bytes, int kind)
{
	double gbps = (kind >= 0 && kind <= 4) ? bw[kind] : bw[cudaMemcpyDefault];

	return (uint64_t)((double)bytes / gbps + 0.5);
}

static void __attribute__((destructor)) sim_report(void)
{
	char line[256];
	uint64_t busy, span, kernels;
	int fd, n;

	if (!report_path[0])
		return;
	pthread_mutex_lock(&tl_lock);
	busy = tl_busy_ns;
	kernels = tl_kernels;
	span = tl_started ? tl_busy_until - tl_first_start : 0;
	pthread_mutex_unlock(&tl_lock);
	n = snprintf(line, sizeof(line),
		     "{\"kernels\":%llu,\"gpu_busy_ns\":%llu,\"span_ns\":%llu,"
		     "\"utilization\":%.6f}\n",
		     (unsigned long long)kernels, (unsigned long long)busy,
		     (unsigned long long)span, span ? (double)busy / (double)span : 0.0);
	if (n <= 0 || (size_t)n >= sizeof(line))
		return;
	fd = open(report_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (write(fd, line, (size_t)n) != n) {
		/* nothing to do: the stub never reports on stderr */
	}
	close(fd);
}

/* ---- implementations (always inlined: every exported entry point has its
 * own body, so no exported function jumps into another's entry address) -- */

#define IMPL static inline __attribute__((always_inline))

IMPL cudaError_t launch(dim3 grid, dim3 block)
{
	uint64_t t0 = now_ns();
	uint64_t threads = (uint64_t)grid.x * grid.y * grid.z * block.x * block.y * block.z;
	uint64_t dur = kernel_base_ns + (uint64_t)((double)threads * ns_per_thread + 0.5);

	enqueue(t0, dur, 1);
	wait_until(t0 + launch_ns);
	return cudaSuccess;
}

IMPL cudaError_t launch_cfg(const cudaLaunchConfig_t *config)
{
	if (!config)
		return cudaErrorInvalidValue;
	return launch(config->gridDim, config->blockDim);
}

static void copy_rows(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
		      size_t height)
{
	size_t i;

	if (!dst || !src || !width)
		return;
	if (dpitch == width && spitch == width) {
		memmove(dst, src, width * height);
		return;
	}
	for (i = 0; i < height; i++)
		memmove((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
}

static void set_rows(void *dst, size_t pitch, int value, size_t width, size_t height)
{
	size_t i;

	if (!dst || !width)
		return;
	for (i = 0; i < height; i++)
		memset((char *)dst + i * pitch, value, width);
}

static void set_3d(struct cudaPitchedPtr p, int value, struct cudaExtent e)
{
	size_t z;

	for (z = 0; z < e.depth; z++)
		set_rows(p.ptr ? (char *)p.ptr + z * p.pitch * p.ysize : NULL, p.pitch, value,
			 e.width, e.height);
}

IMPL cudaError_t copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
			size_t height, int kind, int sync)
{
	struct slot s = enqueue(now_ns(), transfer_ns(width * height, kind), 0);

	if (sync)
		wait_until(s.start);
	copy_rows(dst, dpitch, src, spitch, width, height);
	if (sync)
		wait_until(s.end);
	return cudaSuccess;
}

IMPL cudaError_t copy1d(void *dst, const void *src, size_t count, int kind, int sync)
{
	return copy2d(dst, count, src, count, count, 1, kind, sync);
}

IMPL cudaError_t fill2d(void *dst, size_t pitch, int value, size_t width, size_t height,
			int sync)
{
	struct slot s = enqueue(now_ns(), transfer_ns(width * height, cudaMemcpyDeviceToDevice), 0);

	if (sync)
		wait_until(s.start);
	set_rows(dst, pitch, value, width, height);
	if (sync)
		wait_until(s.end);
	return cudaSuccess;
}

IMPL cudaError_t fill3d(struct cudaPitchedPtr p, int value, struct cudaExtent e, int sync)
{
	size_t bytes = e.width * e.height * e.depth;
	struct slot s = enqueue(now_ns(), transfer_ns(bytes, cudaMemcpyDeviceToDevice), 0);

	if (sync)
		wait_until(s.start);
	set_3d(p, value, e);
	if (sync)
		wait_until(s.end);
	return cudaSuccess;
}

IMPL cudaError_t alloc(void **out, size_t size)
{
	void *p = NULL;
	size_t rounded;

	if (!out)
		return cudaErrorInvalidValue;
	*out = NULL;
	if (size == 0)
		return cudaSuccess;
	rounded = (size + DEVICE_ALIGN - 1) & ~(size_t)(DEVICE_ALIGN - 1);
	if (rounded < size || posix_memalign(&p, DEVICE_ALIGN, rounded) != 0)
		return cudaErrorMemoryAllocation;
	*out = p;
	return cudaSuccess;
}

IMPL cudaError_t release(void *p)
{
	free(p);
	return cudaSuccess;
}

IMPL cudaError_t sync_all(void)
{
	wait_until(busy_until());
	return cudaSuccess;
}

IMPL cudaError_t graph(void)
{
	enqueue(now_ns(), GRAPH_NS, 0);
	return cudaSuccess;
}

/* ---- exported API ----------------------------------------------------- */

API cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
				 size_t sharedMem, cudaStream_t stream)
{
	(void)func, (void)args, (void)sharedMem, (void)stream;
	return launch(gridDim, blockDim);
}

API cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim,
				      void **args, size_t sharedMem, cudaStream_t stream)
{
	(void)func, (void)args, (void)sharedMem, (void)stream;
	return launch(gridDim, blockDim);
}

API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
				    void **args)
{
	(void)func, (void)args;
	return launch_cfg(config);
}

API cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func,
					 void **args)
{
	(void)func, (void)args;
	return launch_cfg(config);
}

API cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim,
					    void **args, size_t sharedMem, cudaStream_t stream)
{
	(void)func, (void)args, (void)sharedMem, (void)stream;
	return launch(gridDim, blockDim);
}

API cudaError_t cudaLaunchCooperativeKernel_ptsz(const void *func, dim3 gridDim,
						 dim3 blockDim, void **args, size_t sharedMem,
						 cudaStream_t stream)
{
	(void)func, (void)args, (void)sharedMem, (void)stream;
	return launch(gridDim, blockDim);
}

API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	return copy1d(dst, src, count, (int)kind, 1);
}

API cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count,
				enum cudaMemcpyKind kind)
{
	return copy1d(dst, src, count, (int)kind, 1);
}

API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
				enum cudaMemcpyKind kind, cudaStream_t stream)
{
	(void)stream;
	return copy1d(dst, src, count, (int)kind, 0);
}

API cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
				     enum cudaMemcpyKind kind, cudaStream_t stream)
{
	(void)stream;
	return copy1d(dst, src, count, (int)kind, 0);
}

API cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice,
			       size_t count)
{
	(void)dstDevice, (void)srcDevice;
	return copy1d(dst, src, count, cudaMemcpyDeviceToDevice, 1);
}

API cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice,
				    size_t count, cudaStream_t stream)
{
	(void)dstDevice, (void)srcDevice, (void)stream;
	return copy1d(dst, src, count, cudaMemcpyDeviceToDevice, 0);
}

API cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
			     size_t width, size_t height, enum cudaMemcpyKind kind)
{
	return copy2d(dst, dpitch, src, spitch, width, height, (int)kind, 1);
}

API cudaError_t cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src, size_t spitch,
				  size_t width, size_t height, enum cudaMemcpyKind kind)
{
	return copy2d(dst, dpitch, src, spitch, width, height, (int)kind, 1);
}

API cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
				  size_t width, size_t height, enum cudaMemcpyKind kind,
				  cudaStream_t stream)
{
	(void)stream;
	return copy2d(dst, dpitch, src, spitch, width, height, (int)kind, 0);
}

API cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src,
				       size_t spitch, size_t width, size_t height,
				       enum cudaMemcpyKind kind, cudaStream_t stream)
{
	(void)stream;
	return copy2d(dst, dpitch, src, spitch, width, height, (int)kind, 0);
}

API cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
	return fill2d(devPtr, count, value, count, 1, 1);
}

API cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count)
{
	return fill2d(devPtr, count, value, count, 1, 1);
}

API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	(void)stream;
	return fill2d(devPtr, count, value, count, 1, 0);
}

API cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count,
				     cudaStream_t stream)
{
	(void)stream;
	return fill2d(devPtr, count, value, count, 1, 0);
}

API cudaError_t cudaMemset2D(void *devPtr, size_t pitch, int value, size_t width, size_t height)
{
	return fill2d(devPtr, pitch, value, width, height, 1);
}

API cudaError_t cudaMemset2D_ptds(void *devPtr, size_t pitch, int value, size_t width,
				  size_t height)
{
	return fill2d(devPtr, pitch, value, width, height, 1);
}

API cudaError_t cudaMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width,
				  size_t height, cudaStream_t stream)
{
	(void)stream;
	return fill2d(devPtr, pitch, value, width, height, 0);
}

API cudaError_t cudaMemset2DAsync_ptsz(void *devPtr, size_t pitch, int value, size_t width,
				       size_t height, cudaStream_t stream)
{
	(void)stream;
	return fill2d(devPtr, pitch, value, width, height, 0);
}

API cudaError_t cudaMemset3D(struct cudaPitchedPtr pitchedDevPtr, int value,
			     struct cudaExtent extent)
{
	return fill3d(pitchedDevPtr, value, extent, 1);
}

API cudaError_t cudaMemset3D_ptds(struct cudaPitchedPtr pitchedDevPtr, int value,
				  struct cudaExtent extent)
{
	return fill3d(pitchedDevPtr, value, extent, 1);
}

API cudaError_t cudaMemset3DAsync(struct cudaPitchedPtr pitchedDevPtr, int value,
				  struct cudaExtent extent, cudaStream_t stream)
{
	(void)stream;
	return fill3d(pitchedDevPtr, value, extent, 0);
}

API cudaError_t cudaMemset3DAsync_ptsz(struct cudaPitchedPtr pitchedDevPtr, int value,
				       struct cudaExtent extent, cudaStream_t stream)
{
	(void)stream;
	return fill3d(pitchedDevPtr, value, extent, 0);
}

API cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	return alloc(devPtr, size);
}

API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
	(void)hStream;
	return alloc(devPtr, size);
}

API cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
	(void)hStream;
	return alloc(devPtr, size);
}

API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
	(void)flags;
	return alloc(devPtr, size);
}

API cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	return alloc(ptr, size);
}

API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	(void)flags;
	return alloc(pHost, size);
}

API cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
					cudaStream_t stream)
{
	(void)memPool, (void)stream;
	return alloc(ptr, size);
}

API cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
					     cudaStream_t stream)
{
	(void)memPool, (void)stream;
	return alloc(ptr, size);
}

API cudaError_t cudaFree(void *devPtr)
{
	return release(devPtr);
}

API cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
	(void)hStream;
	return release(devPtr);
}

API cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
	(void)hStream;
	return release(devPtr);
}

API cudaError_t cudaFreeHost(void *ptr)
{
	return release(ptr);
}

API cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	(void)stream;
	return sync_all();
}

API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
	(void)stream;
	return sync_all();
}

API cudaError_t cudaDeviceSynchronize(void)
{
	return sync_all();
}

API cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	(void)event;
	return sync_all();
}

API cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	(void)graphExec, (void)stream;
	return graph();
}

API cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	(void)graphExec, (void)stream;
	return graph();
}

API cudaError_t cudaGetLastError(void)
{
	return cudaSuccess;
}

API const char *cudaGetErrorString(cudaError_t error)
{
	switch (error) {
	case cudaSuccess:
		return "no error";
	case cudaErrorInvalidValue:
		return "invalid argument";
	case cudaErrorMemoryAllocation:
		return "out of memory";
	case cudaErrorInsufficientDriver:
		return "CUDA driver version is insufficient for CUDA runtime version";
	default:
		return "unrecognized error code";
	}
}

API cudaError_t cudaGetDeviceCount(int *count)
{
	if (!count)
		return cudaErrorInvalidValue;
	*count = 1;
	return cudaSuccess;
}
