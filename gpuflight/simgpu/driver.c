/* gpuflight simulated GPU: the driver, built as libcuda.so.1.
 *
 * NVIDIA's driver-API ABI (cuda.h, compiled against NVIDIA's own headers at build
 * time), implemented on the host:
 *   - device memory is host memory: cuMemAlloc maps real pages, copies and memsets
 *     really move bytes, and pointer attributes answer "device memory" for our
 *     allocations (and "unknown" for any other address);
 *   - kernels do nothing, but every launch is counted per function handle under
 *     the name it was looked up with (cuModuleGetFunction, cuLibraryGetKernel,
 *     cuKernelGetFunction), per device, split into launches that ran, launches
 *     captured into graphs, and kernel nodes replayed by graph launches;
 *   - streams, events, stream capture and graphs work (everything executes in
 *     issue order, at once, on the calling thread);
 *   - GF_SIM_DEVICES (1..16, default 1) H100s (SM 9.0, 132 SMs, 80 GB), one primary
 *     context each, a per-thread context stack.
 * Names that cuda.h declares and this file does not define are generated stubs
 * (driver_stubs.c, made by build.py) that return CUDA_SUCCESS and are counted.
 * cuGetProcAddress resolves name + version through a table generated from
 * cudaTypedefs.h (driver_procs.c). cuGetExportTable answers nothing: NVIDIA's
 * runtimes cannot start on this driver, by design.
 *
 * Time: a per-device timeline (timing.h). With no GF_SIM_* timing variable set it
 * is virtual: work costs no CPU time, events stamp a simulated clock, so
 * cuEventElapsedTime returns small, positive, deterministic times.
 *
 * Counts: GF_SIM_COUNTS=DIR/NAME.json makes each process that used the GPU write
 * DIR/NAME.PID.json at exit (atexit; also on gfsim_flush_counts()), replaced
 * whole each time (written to a temporary file and renamed).
 */
#define _GNU_SOURCE
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "activity.h"
#include "simgpu.h"
#include "timing.h"

#define API __attribute__((visibility("default"), noinline))
#define IMPL static inline __attribute__((always_inline))

#define MAX_DEVICES 16
#define DRIVER_VERSION 13020
#define TOTAL_MEM (80ull << 30)

#define M_CTX 0x53437478u
#define M_STREAM 0x53537472u
#define M_EVENT 0x53457674u
#define M_MODULE 0x534d6f64u
#define M_FUNC 0x5346756eu
#define M_LIB 0x534c6962u
#define M_KERNEL 0x534b726eu
#define M_GRAPH 0x53477270u
#define M_NODE 0x534e6f64u
#define M_EXEC 0x53457865u
#define M_POOL 0x53506f6cu
#define M_UOBJ 0x53556f62u

/* ---- state ---------------------------------------------------------------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_ndev = 1;
static int g_initialized;
static char g_counts_path[4096];
static uint64_t g_next_id = 1;

struct sim_ctx {
	uint32_t magic;
	int device;
	int primary;
	int refs;
	int active;
	unsigned int flags;
	unsigned long long id;
	size_t limits[16];
};

struct capture;

struct sim_stream {
	uint32_t magic;
	int device;
	struct sim_ctx *ctx;
	unsigned int flags;
	int priority;
	unsigned long long id;
	struct capture *cap; /* non-NULL while capturing */
};

struct sim_event {
	uint32_t magic;
	int device;
	unsigned int flags;
	int recorded;
	double stamp_ns;
	/* recorded during a capture: the nodes the record depended on */
	struct capture *cap;
	CUgraphNode *deps;
	size_t ndeps;
};

struct kstat {
	char *name;
	struct kstat *next;
	unsigned long long launches[MAX_DEVICES];
	unsigned long long captured[MAX_DEVICES];
	unsigned long long replayed[MAX_DEVICES];
	unsigned long long nodes_added[MAX_DEVICES];
};

struct sim_func;

struct sim_module {
	uint32_t magic;
	int device;
	struct sim_func *funcs;
	struct sim_library *lib;
};

struct sim_func {
	uint32_t magic;
	struct sim_module *mod;
	struct sim_func *next;
	struct kstat *stat;
	int device;
	int max_dyn_smem;
	int carveout;
	int attrs_set[16];
};

struct sim_kernel {
	uint32_t magic;
	struct sim_library *lib;
	struct sim_kernel *next;
	char *name;
	struct sim_func *per_dev[MAX_DEVICES];
};

struct sim_library {
	uint32_t magic;
	struct sim_kernel *kernels;
	struct sim_module *mods[MAX_DEVICES];
};

enum node_kind { N_KERNEL, N_MEMCPY, N_MEMSET, N_HOST, N_GRAPH, N_EMPTY, N_EV_RECORD, N_EV_WAIT };

struct sim_graph;

struct sim_node {
	uint32_t magic;
	int kind;
	int device;
	struct sim_graph *graph;
	CUgraphNode *deps;
	size_t ndeps;
	/* kernel */
	struct sim_func *func;
	unsigned int grid[3], block[3], smem;
	/* memcpy */
	void *dst;
	const void *src;
	size_t width, height, dpitch, spitch;
	int dir;
	/* memset */
	unsigned int value, elem;
	/* host */
	CUhostFn fn;
	void *user;
	/* child graph, event */
	struct sim_graph *child;
	struct sim_event *event;
};

struct sim_graph {
	uint32_t magic;
	struct sim_node **nodes;
	size_t n, cap;
};

struct sim_exec {
	uint32_t magic;
	int device;
	struct sim_node *nodes; /* a snapshot, in graph order */
	size_t n;
	unsigned long long flags;
};

struct capture {
	struct sim_graph *graph;
	unsigned long long id;
	int mode;
	int own_graph; /* 1: EndCapture hands the graph out */
	struct sim_stream *origin;
	CUgraphNode *deps; /* per-capture frontier (shared by joined streams, simplified) */
	size_t ndeps, capdeps;
};

struct sim_pool {
	uint32_t magic;
	int device;
	unsigned long long attr[16];
};

static struct device {
	struct sim_ctx primary;
	struct sim_stream legacy;
	struct sim_pool pool;
	struct timeline tl;
	unsigned long long graph_launches;
	unsigned long long kernel_nodes_replayed;
	unsigned long long ctx_syncs;
	size_t used;
	int peer[MAX_DEVICES];
} g_dev[MAX_DEVICES];

static struct counters {
	unsigned long long copies[SIM_DIR_COUNT];
	unsigned long long copy_bytes[SIM_DIR_COUNT];
	unsigned long long memsets, memset_bytes;
	unsigned long long allocs, alloc_bytes, frees, host_allocs, host_alloc_bytes;
	unsigned long long stream_syncs, event_syncs, device_syncs, ctx_syncs;
	unsigned long long modules, functions, graphs_instantiated;
	unsigned long long graph_nodes_total;
	unsigned long long events_recorded, host_funcs;
	unsigned long long refused;
	char refused_by[256];
	unsigned long long launch_calls[3]; /* cuLaunchKernel, cuLaunchKernelEx, cooperative */
} g_cnt;

enum { LC_KERNEL, LC_EX, LC_COOP };

static struct kstat *g_kstats[1024];
static unsigned long long g_stub_calls[SIM_MAX_STUBS];

/* ---- per thread ------------------------------------------------------------ */

static __thread struct sim_ctx *t_stack[32];
static __thread int t_depth;
static __thread int t_capture_mode; /* CUstreamCaptureMode of the thread */

static struct sim_ctx *cur_ctx(void)
{
	return t_depth > 0 ? t_stack[t_depth - 1] : NULL;
}

static int cur_device(void)
{
	struct sim_ctx *c = cur_ctx();

	return c ? c->device : 0;
}

/* ---- helpers --------------------------------------------------------------- */

static void *xcalloc(size_t n, size_t sz)
{
	void *p = calloc(n ? n : 1, sz ? sz : 1);

	if (!p)
		abort();
	return p;
}

static char *xstrdup(const char *s)
{
	char *p = strdup(s ? s : "");

	if (!p)
		abort();
	return p;
}

static unsigned int hash_str(const char *s)
{
	unsigned int h = 2166136261u;

	while (*s)
		h = (h ^ (unsigned char)*s++) * 16777619u;
	return h;
}

static struct kstat *kstat_get(const char *name)
{
	unsigned int h = hash_str(name) % 1024;
	struct kstat *k;

	pthread_mutex_lock(&g_lock);
	for (k = g_kstats[h]; k; k = k->next)
		if (!strcmp(k->name, name))
			break;
	if (!k) {
		k = xcalloc(1, sizeof(*k));
		k->name = xstrdup(name);
		k->next = g_kstats[h];
		g_kstats[h] = k;
	}
	pthread_mutex_unlock(&g_lock);
	return k;
}

static int dev_ok(int d)
{
	return d >= 0 && d < g_ndev;
}

/* ---- memory registry -------------------------------------------------------- */

enum { MEM_DEVICE = 1, MEM_HOST = 2, MEM_REGISTERED = 3, MEM_MANAGED = 4 };

struct alloc {
	uintptr_t base;
	size_t size;
	size_t mapped;
	int device;
	int kind;
	unsigned int flags;
	unsigned long long id;
};

static struct alloc *g_allocs;
static size_t g_nallocs, g_capallocs;

/* Index of the allocation containing p, or -1. Caller holds g_lock. */
static long alloc_find_locked(uintptr_t p)
{
	size_t lo = 0, hi = g_nallocs;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (g_allocs[mid].base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return -1;
	lo--;
	if (p >= g_allocs[lo].base && p - g_allocs[lo].base < (g_allocs[lo].size ? g_allocs[lo].size : 1))
		return (long)lo;
	return -1;
}

static int alloc_lookup(uintptr_t p, struct alloc *out)
{
	long i;

	pthread_mutex_lock(&g_lock);
	i = alloc_find_locked(p);
	if (i >= 0 && out)
		*out = g_allocs[i];
	pthread_mutex_unlock(&g_lock);
	return i >= 0;
}

static void alloc_insert(const struct alloc *a)
{
	size_t lo = 0, hi;

	pthread_mutex_lock(&g_lock);
	if (g_nallocs == g_capallocs) {
		g_capallocs = g_capallocs ? g_capallocs * 2 : 256;
		g_allocs = realloc(g_allocs, g_capallocs * sizeof(*g_allocs));
		if (!g_allocs)
			abort();
	}
	hi = g_nallocs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (g_allocs[mid].base < a->base)
			lo = mid + 1;
		else
			hi = mid;
	}
	memmove(&g_allocs[lo + 1], &g_allocs[lo], (g_nallocs - lo) * sizeof(*g_allocs));
	g_allocs[lo] = *a;
	g_allocs[lo].id = g_next_id++;
	g_nallocs++;
	pthread_mutex_unlock(&g_lock);
}

static int alloc_remove(uintptr_t base, struct alloc *out)
{
	long i;

	pthread_mutex_lock(&g_lock);
	i = alloc_find_locked(base);
	if (i < 0 || g_allocs[i].base != base) {
		pthread_mutex_unlock(&g_lock);
		return 0;
	}
	*out = g_allocs[i];
	memmove(&g_allocs[i], &g_allocs[i + 1], (g_nallocs - (size_t)i - 1) * sizeof(*g_allocs));
	g_nallocs--;
	pthread_mutex_unlock(&g_lock);
	return 1;
}

static CUresult mem_alloc(void **out, size_t size, int device, int kind, unsigned int flags)
{
	struct alloc a;
	size_t mapped;
	void *p;

	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	*out = NULL;
	if (size == 0)
		return kind == MEM_DEVICE ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
	if (kind == MEM_DEVICE || kind == MEM_MANAGED) {
		pthread_mutex_lock(&g_lock);
		if (size > TOTAL_MEM - g_dev[device].used) {
			pthread_mutex_unlock(&g_lock);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		pthread_mutex_unlock(&g_lock);
	}
	mapped = (size + 4095) & ~(size_t)4095;
	p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		 -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	memset(&a, 0, sizeof(a));
	a.base = (uintptr_t)p;
	a.size = size;
	a.mapped = mapped;
	a.device = device;
	a.kind = kind;
	a.flags = flags;
	alloc_insert(&a);
	pthread_mutex_lock(&g_lock);
	if (kind == MEM_DEVICE || kind == MEM_MANAGED) {
		g_dev[device].used += mapped;
		g_cnt.allocs++;
		g_cnt.alloc_bytes += size;
	} else {
		g_cnt.host_allocs++;
		g_cnt.host_alloc_bytes += size;
	}
	pthread_mutex_unlock(&g_lock);
	*out = p;
	return CUDA_SUCCESS;
}

static CUresult mem_free(uintptr_t p, int want_host)
{
	struct alloc a;

	if (!p)
		return CUDA_SUCCESS;
	if (!alloc_remove(p, &a))
		return CUDA_ERROR_INVALID_VALUE;
	if ((a.kind == MEM_HOST) != want_host && a.kind != MEM_MANAGED) {
		alloc_insert(&a);
		return CUDA_ERROR_INVALID_VALUE;
	}
	munmap((void *)a.base, a.mapped);
	pthread_mutex_lock(&g_lock);
	if (a.kind == MEM_DEVICE || a.kind == MEM_MANAGED) {
		g_dev[a.device].used -= a.mapped;
		g_cnt.frees++;
	}
	pthread_mutex_unlock(&g_lock);
	return CUDA_SUCCESS;
}

/* Direction of a copy from what the registry knows about both ends. */
static int copy_dir(const void *dst, const void *src)
{
	struct alloc ad, as;
	int d = alloc_lookup((uintptr_t)dst, &ad) && (ad.kind == MEM_DEVICE || ad.kind == MEM_MANAGED);
	int s = alloc_lookup((uintptr_t)src, &as) && (as.kind == MEM_DEVICE || as.kind == MEM_MANAGED);

	if (d && s)
		return ad.device == as.device ? SIM_D2D : SIM_PEER;
	if (d)
		return SIM_H2D;
	if (s)
		return SIM_D2H;
	return SIM_H2H;
}

static int ptr_device(const void *p, int dflt)
{
	struct alloc a;

	if (alloc_lookup((uintptr_t)p, &a) && (a.kind == MEM_DEVICE || a.kind == MEM_MANAGED))
		return a.device;
	return dflt;
}

/* ---- configuration and counts --------------------------------------------- */

static void counts_write(void);

static void sim_atexit(void)
{
	counts_write();
}

static void sim_atfork_child(void)
{
	/* A forked child starts with no GPU activity of its own. */
	size_t i;

	activity_open();

	memset(&g_cnt, 0, sizeof(g_cnt));
	for (i = 0; i < 1024; i++) {
		struct kstat *k;

		for (k = g_kstats[i]; k; k = k->next) {
			memset(k->launches, 0, sizeof(k->launches));
			memset(k->captured, 0, sizeof(k->captured));
			memset(k->replayed, 0, sizeof(k->replayed));
			memset(k->nodes_added, 0, sizeof(k->nodes_added));
		}
	}
	for (i = 0; i < MAX_DEVICES; i++) {
		g_dev[i].graph_launches = 0;
		g_dev[i].kernel_nodes_replayed = 0;
	}
	memset(g_stub_calls, 0, sizeof(g_stub_calls));
	g_initialized = 0;
	pthread_mutex_init(&g_lock, NULL);
}

static void __attribute__((constructor)) sim_init(void)
{
	const char *s = getenv("GF_SIM_DEVICES");
	const char *c = getenv("GF_SIM_COUNTS");
	int d;

	if (s && *s) {
		long v = strtol(s, NULL, 10);

		g_ndev = v < 1 ? 1 : v > MAX_DEVICES ? MAX_DEVICES : (int)v;
	}
	if (c && *c && strlen(c) < sizeof(g_counts_path) - 64)
		strcpy(g_counts_path, c);
	timing_configure();
	for (d = 0; d < MAX_DEVICES; d++) {
		struct device *dv = &g_dev[d];

		dv->primary.magic = M_CTX;
		dv->primary.device = d;
		dv->primary.primary = 1;
		dv->primary.id = (unsigned long long)d + 1;
		dv->primary.limits[CU_LIMIT_STACK_SIZE] = 1024;
		dv->primary.limits[CU_LIMIT_PRINTF_FIFO_SIZE] = 1 << 20;
		dv->primary.limits[CU_LIMIT_MALLOC_HEAP_SIZE] = 8 << 20;
		dv->primary.limits[CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH] = 2;
		dv->primary.limits[CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048;
		dv->primary.limits[CU_LIMIT_MAX_L2_FETCH_GRANULARITY] = 64;
		dv->legacy.magic = M_STREAM;
		dv->legacy.device = d;
		dv->legacy.ctx = &dv->primary;
		dv->pool.magic = M_POOL;
		dv->pool.device = d;
		timeline_init(&dv->tl, d);
	}
	pthread_atfork(NULL, NULL, sim_atfork_child);
	atexit(sim_atexit);
}

static const char *dir_name[SIM_DIR_COUNT] = {"h2d", "d2h", "d2d", "h2h", "peer"};

struct sbuf {
	char *p;
	size_t n, cap;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
	va_list ap;
	int need;

	for (;;) {
		size_t room = b->cap - b->n;

		va_start(ap, fmt);
		need = vsnprintf(b->p + b->n, room, fmt, ap);
		va_end(ap);
		if (need < 0)
			return;
		if ((size_t)need < room) {
			b->n += (size_t)need;
			return;
		}
		b->cap = b->cap * 2 + (size_t)need + 1;
		b->p = realloc(b->p, b->cap);
		if (!b->p)
			abort();
	}
}

static void sb_json_str(struct sbuf *b, const char *s)
{
	sb_printf(b, "\"");
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			sb_printf(b, "\\%c", ch);
		else if (ch < 0x20)
			sb_printf(b, "\\u%04x", ch);
		else
			sb_printf(b, "%c", ch);
	}
	sb_printf(b, "\"");
}

static void sb_dev_array(struct sbuf *b, const unsigned long long *v)
{
	int d;

	sb_printf(b, "[");
	for (d = 0; d < g_ndev; d++)
		sb_printf(b, "%s%llu", d ? "," : "", v[d]);
	sb_printf(b, "]");
}

static unsigned long long sum_dev(const unsigned long long *v)
{
	unsigned long long s = 0;
	int d;

	for (d = 0; d < g_ndev; d++)
		s += v[d];
	return s;
}

extern const char *const sim_stub_names[];
extern const unsigned int sim_stub_count;

static void counts_render(struct sbuf *b)
{
	size_t i;
	int first = 1, d;

	sb_printf(b, "{\"pid\":%d,\"devices\":%d,\"kernels\":{", (int)getpid(), g_ndev);
	for (i = 0; i < 1024; i++) {
		struct kstat *k;

		for (k = g_kstats[i]; k; k = k->next) {
			if (!sum_dev(k->launches) && !sum_dev(k->captured) && !sum_dev(k->replayed) &&
			    !sum_dev(k->nodes_added))
				continue;
			sb_printf(b, "%s", first ? "" : ",");
			first = 0;
			sb_json_str(b, k->name);
			sb_printf(b, ":{\"launches\":%llu,\"captured\":%llu,\"replayed\":%llu,"
				     "\"nodes_added\":%llu,\"per_device\":{\"launches\":",
				  sum_dev(k->launches), sum_dev(k->captured), sum_dev(k->replayed),
				  sum_dev(k->nodes_added));
			sb_dev_array(b, k->launches);
			sb_printf(b, ",\"captured\":");
			sb_dev_array(b, k->captured);
			sb_printf(b, ",\"replayed\":");
			sb_dev_array(b, k->replayed);
			sb_printf(b, "}}");
		}
	}
	sb_printf(b, "},\"graphs\":{\"instantiated\":%llu,\"launches\":[", g_cnt.graphs_instantiated);
	for (d = 0; d < g_ndev; d++)
		sb_printf(b, "%s%llu", d ? "," : "", g_dev[d].graph_launches);
	sb_printf(b, "],\"kernel_nodes_replayed\":[");
	for (d = 0; d < g_ndev; d++)
		sb_printf(b, "%s%llu", d ? "," : "", g_dev[d].kernel_nodes_replayed);
	sb_printf(b, "]},\"copies\":{");
	for (i = 0; i < SIM_DIR_COUNT; i++)
		sb_printf(b, "%s\"%s\":{\"count\":%llu,\"bytes\":%llu}", i ? "," : "", dir_name[i],
			  g_cnt.copies[i], g_cnt.copy_bytes[i]);
	sb_printf(b, "},\"memsets\":{\"count\":%llu,\"bytes\":%llu}", g_cnt.memsets,
		  g_cnt.memset_bytes);
	sb_printf(b, ",\"allocs\":{\"count\":%llu,\"bytes\":%llu,\"frees\":%llu,"
		     "\"host_count\":%llu,\"host_bytes\":%llu}",
		  g_cnt.allocs, g_cnt.alloc_bytes, g_cnt.frees, g_cnt.host_allocs,
		  g_cnt.host_alloc_bytes);
	sb_printf(b, ",\"syncs\":{\"stream\":%llu,\"event\":%llu,\"device\":%llu,\"context\":%llu}",
		  g_cnt.stream_syncs, g_cnt.event_syncs, g_cnt.device_syncs, g_cnt.ctx_syncs);
	sb_printf(b, ",\"modules_loaded\":%llu,\"functions\":%llu,\"events_recorded\":%llu,"
		     "\"host_funcs\":%llu",
		  g_cnt.modules, g_cnt.functions, g_cnt.events_recorded, g_cnt.host_funcs);
	sb_printf(b, ",\"launch_calls\":{\"cuLaunchKernel\":%llu,\"cuLaunchKernelEx\":%llu,"
		     "\"cuLaunchCooperativeKernel\":%llu}",
		  g_cnt.launch_calls[LC_KERNEL], g_cnt.launch_calls[LC_EX], g_cnt.launch_calls[LC_COOP]);
	sb_printf(b, ",\"refused\":{\"count\":%llu,\"last_caller\":", g_cnt.refused);
	sb_json_str(b, g_cnt.refused_by);
	sb_printf(b, "},\"unimplemented\":{");
	first = 1;
	for (i = 0; i < sim_stub_count; i++) {
		if (!g_stub_calls[i])
			continue;
		sb_printf(b, "%s", first ? "" : ",");
		first = 0;
		sb_json_str(b, sim_stub_names[i]);
		sb_printf(b, ":%llu", g_stub_calls[i]);
	}
	sb_printf(b, "}}\n");
}

static void counts_write(void)
{
	char path[4200], tmp[4300];
	struct sbuf b = {0};
	size_t len;
	int fd;

	if (!g_counts_path[0] || !g_initialized)
		return;
	len = strlen(g_counts_path);
	if (len > 5 && !strcmp(g_counts_path + len - 5, ".json"))
		snprintf(path, sizeof(path), "%.*s.%d.json", (int)(len - 5), g_counts_path,
			 (int)getpid());
	else
		snprintf(path, sizeof(path), "%s.%d.json", g_counts_path, (int)getpid());
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	b.cap = 1 << 16;
	b.p = malloc(b.cap);
	if (!b.p)
		return;
	pthread_mutex_lock(&g_lock);
	counts_render(&b);
	pthread_mutex_unlock(&g_lock);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd >= 0) {
		size_t off = 0;

		while (off < b.n) {
			ssize_t w = write(fd, b.p + off, b.n - off);

			if (w <= 0 && errno != EINTR)
				break;
			if (w > 0)
				off += (size_t)w;
		}
		close(fd);
		if (off == b.n)
			rename(tmp, path);
		else
			unlink(tmp);
	}
	free(b.p);
}

/* Exported helpers (not CUDA API): flush the counts now; count a stub call. */
API void gfsim_flush_counts(void)
{
	counts_write();
}

/* The device time of the kernels the calling thread has enqueued, ns (real-time mode: what
 * they keep the device busy; virtual mode: their modeled durations). A workload reads it
 * before and after a request to know that request's GPU time. */
API double gfsim_thread_kernel_ns(void)
{
	return tm_thread_kernel_ns;
}

/* Start the timelines' account afresh (GF_SIM_REPORT covers the work from here on): a
 * workload calls it after its warm-up (start-up, compilation), before the region it measures. */
API void gfsim_timeline_restart(void)
{
	int d;

	for (d = 0; d < g_ndev; d++) {
		struct timeline *t = &g_dev[d].tl;

		pthread_mutex_lock(&t->lock);
		t->started = 0;
		t->busy_ns = 0;
		t->kernels = 0;
		pthread_mutex_unlock(&t->lock);
	}
}

void sim_stub_hit(unsigned int id)
{
	if (id < SIM_MAX_STUBS)
		__atomic_add_fetch(&g_stub_calls[id], 1, __ATOMIC_RELAXED);
	g_initialized = 1;
}

/* The hard rule: NVIDIA's own runtimes (libcudart, cuBLAS, cuDNN, ... which carry
 * a private runtime) must not run on this driver. Their entry points into a driver
 * are refused, and counted. */
static int caller_is_nvidia(const void *ra)
{
	static const char *const names[] = {
		"libcudart.so", "libcublas", "libcudnn", "libcusparse", "libcufft", "libcusolver",
		"libcurand", "libnccl", "libnvshmem", "libcupti", "libcufile", "libnvJitLink",
		"libnvrtc", "libnvblas", "libcusparseLt", "libnvperf", "libcheckpoint", NULL,
	};
	Dl_info info;
	const char *base;
	int i;

	if (!ra || !dladdr(ra, &info) || !info.dli_fname)
		return 0;
	if (dladdr((void *)caller_is_nvidia, &(Dl_info){0})) {
		Dl_info self;

		if (dladdr((void *)caller_is_nvidia, &self) && self.dli_fbase == info.dli_fbase)
			return 0;
	}
	base = strrchr(info.dli_fname, '/');
	base = base ? base + 1 : info.dli_fname;
	/* our own runtime (libcudart.so.1x built by build.py) marks itself */
	if (dlsym(RTLD_DEFAULT, "gfsim_runtime_marker")) {
		Dl_info mine;
		void *m = dlsym(RTLD_DEFAULT, "gfsim_runtime_marker");

		if (dladdr(m, &mine) && mine.dli_fbase == info.dli_fbase)
			return 0;
	}
	for (i = 0; names[i]; i++)
		if (!strncmp(base, names[i], strlen(names[i])))
			goto refuse;
	return 0;
refuse:
	pthread_mutex_lock(&g_lock);
	g_cnt.refused++;
	snprintf(g_cnt.refused_by, sizeof(g_cnt.refused_by), "%s", info.dli_fname);
	pthread_mutex_unlock(&g_lock);
	g_initialized = 1;
	if (getenv("GF_SIM_VERBOSE"))
		fprintf(stderr, "simgpu: refused a driver call from %s\n", info.dli_fname);
	return 1;
}

#define REFUSE_NVIDIA()                                                           \
	do {                                                                      \
		if (caller_is_nvidia(__builtin_return_address(0)))                 \
			return CUDA_ERROR_NOT_SUPPORTED;                          \
	} while (0)

/* ---- handles ---------------------------------------------------------------- */

/* A handle below 64 KiB is a value no object of this driver has (Linux maps nothing there:
 * vm.mmap_min_addr), made up by a program that only needs its calls to be seen: the tests'
 * capture workload (tests/workloads/capture.c) passes such streams, events and graph
 * executables, as it does to NVIDIA's runtimes, which fail each call without a GPU before
 * they look at one. Rather than fault on it, the driver takes such a stream for the legacy
 * stream (as 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are), such an event for one that
 * has completed, and such a graph executable for an empty one; the call succeeds. A real
 * program never passes one. */
#define MADE_UP_BELOW 0x10000u

static int made_up(const void *h)
{
	return h && (uintptr_t)h < MADE_UP_BELOW;
}

static struct sim_stream *get_stream(CUstream h)
{
	struct sim_stream *s = (struct sim_stream *)h;

	if ((uintptr_t)h < MADE_UP_BELOW)
		return &g_dev[cur_device()].legacy;
	if (s->magic != M_STREAM)
		return NULL;
	return s;
}

static struct sim_func *get_func(CUfunction f)
{
	struct sim_func *fn = (struct sim_func *)f;
	struct sim_kernel *k = (struct sim_kernel *)f;

	if (!f)
		return NULL;
	if (fn->magic == M_FUNC)
		return fn;
	if (k->magic == M_KERNEL) {
		extern struct sim_func *kernel_func(struct sim_kernel *k, int dev);

		return kernel_func(k, cur_device());
	}
	return NULL;
}

/* ---- capture ------------------------------------------------------------------ */

static struct sim_node *node_new(struct sim_graph *g, int kind, const CUgraphNode *deps,
				 size_t ndeps)
{
	struct sim_node *n = xcalloc(1, sizeof(*n));

	n->magic = M_NODE;
	n->kind = kind;
	n->graph = g;
	if (ndeps && deps) {
		n->deps = xcalloc(ndeps, sizeof(*deps));
		memcpy(n->deps, deps, ndeps * sizeof(*deps));
		n->ndeps = ndeps;
	}
	pthread_mutex_lock(&g_lock);
	if (g->n == g->cap) {
		g->cap = g->cap ? g->cap * 2 : 16;
		g->nodes = realloc(g->nodes, g->cap * sizeof(*g->nodes));
		if (!g->nodes)
			abort();
	}
	g->nodes[g->n++] = n;
	g_cnt.graph_nodes_total++;
	pthread_mutex_unlock(&g_lock);
	return n;
}

static void cap_set_frontier(struct capture *c, const CUgraphNode *deps, size_t n)
{
	if (n > c->capdeps) {
		c->capdeps = n + 8;
		c->deps = realloc(c->deps, c->capdeps * sizeof(*c->deps));
		if (!c->deps)
			abort();
	}
	if (n)
		memcpy(c->deps, deps, n * sizeof(*deps));
	c->ndeps = n;
}

/* Append a node of `kind` to the capture of s; it depends on the frontier, then is it. */
static struct sim_node *cap_add(struct sim_stream *s, int kind)
{
	struct capture *c = s->cap;
	struct sim_node *n = node_new(c->graph, kind, c->deps, c->ndeps);
	CUgraphNode h = (CUgraphNode)n;

	n->device = s->device;
	cap_set_frontier(c, &h, 1);
	return n;
}

/* ---- work: launches, copies, memsets ------------------------------------------ */

static void count_launch(struct sim_func *f, int device, int captured)
{
	if (captured)
		__atomic_add_fetch(&f->stat->captured[device], 1, __ATOMIC_RELAXED);
	else
		__atomic_add_fetch(&f->stat->launches[device], 1, __ATOMIC_RELAXED);
}

static CUresult launch_common(CUfunction hf, unsigned int gx, unsigned int gy, unsigned int gz,
			      unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem,
			      CUstream hs, int api)
{
	struct sim_stream *s = get_stream(hs);
	struct sim_func *f = get_func(hf);
	uint64_t threads;

	g_initialized = 1;
	__atomic_add_fetch(&g_cnt.launch_calls[api], 1, __ATOMIC_RELAXED);
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
		return CUDA_ERROR_INVALID_VALUE;
	if (s->cap) {
		struct sim_node *n = cap_add(s, N_KERNEL);

		n->func = f;
		n->grid[0] = gx, n->grid[1] = gy, n->grid[2] = gz;
		n->block[0] = bx, n->block[1] = by, n->block[2] = bz;
		n->smem = smem;
		count_launch(f, s->device, 1);
		return CUDA_SUCCESS;
	}
	count_launch(f, s->device, 0);
	threads = (uint64_t)gx * gy * gz * bx * by * bz;
	timeline_kernel(&g_dev[s->device].tl, threads, 1);
	return CUDA_SUCCESS;
}

static void copy_rows(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
		      size_t height)
{
	size_t i;

	if (!dst || !src || !width || !height)
		return;
	if ((dpitch == width && spitch == width) || height == 1) {
		memmove(dst, src, width * height);
		return;
	}
	for (i = 0; i < height; i++)
		memmove((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
}

/* Zeroing a large range of our own mapping: drop its pages (they read back as
 * zeros) instead of writing them. Inductor's autotuner zeroes a 256 MB buffer
 * before every benchmark run; this keeps that free. */
static int zero_pages(void *dst, size_t bytes)
{
	uintptr_t a = (uintptr_t)dst, start = (a + 4095) & ~(uintptr_t)4095;
	uintptr_t end = (a + bytes) & ~(uintptr_t)4095;
	struct alloc al;

	if (bytes < (1u << 20) || !alloc_lookup(a, &al) || al.kind == MEM_REGISTERED ||
	    a + bytes > al.base + al.mapped || end <= start)
		return 0;
	if (madvise((void *)start, end - start, MADV_DONTNEED) != 0)
		return 0;
	memset(dst, 0, start - a);
	memset((void *)end, 0, a + bytes - end);
	return 1;
}

static void fill_rows(void *dst, size_t pitch, unsigned int value, unsigned int elem,
		      size_t width, size_t height)
{
	size_t r, i;

	if (!dst || !width)
		return;
	if ((height == 1 || pitch == width * elem) &&
	    (value & (elem == 1 ? 0xffu : elem == 2 ? 0xffffu : 0xffffffffu)) == 0 &&
	    zero_pages(dst, width * elem * height))
		return;
	for (r = 0; r < height; r++) {
		char *row = (char *)dst + r * pitch;

		if (elem == 1) {
			memset(row, (int)(value & 0xff), width);
		} else if (elem == 2) {
			uint16_t v = (uint16_t)value, *p = (uint16_t *)row;

			for (i = 0; i < width; i++)
				p[i] = v;
		} else {
			uint32_t *p = (uint32_t *)row;

			for (i = 0; i < width; i++)
				p[i] = value;
		}
	}
}

static void count_copy(int dir, size_t bytes)
{
	pthread_mutex_lock(&g_lock);
	g_cnt.copies[dir]++;
	g_cnt.copy_bytes[dir] += bytes;
	pthread_mutex_unlock(&g_lock);
}

/* A 2D copy on stream hs (sync: the call returns when it completed). */
static CUresult do_copy(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
			size_t height, CUstream hs, int sync, int dir)
{
	struct sim_stream *s = get_stream(hs);
	int device;

	g_initialized = 1;
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!width || !height)
		return CUDA_SUCCESS;
	if (!dst || !src)
		return CUDA_ERROR_INVALID_VALUE;
	if (dir < 0)
		dir = copy_dir(dst, src);
	device = ptr_device(dst, ptr_device(src, s->device));
	if (s->cap) {
		struct sim_node *n = cap_add(s, N_MEMCPY);

		n->dst = dst, n->src = src, n->width = width, n->height = height;
		n->dpitch = dpitch, n->spitch = spitch, n->dir = dir;
		return CUDA_SUCCESS;
	}
	count_copy(dir, width * height);
	timeline_copy(&g_dev[device].tl, width * height, dir, sync, copy_rows, dst, dpitch, src,
		      spitch, width, height);
	return CUDA_SUCCESS;
}

static CUresult do_memset(CUdeviceptr dst, size_t pitch, unsigned int value, unsigned int elem,
			  size_t width, size_t height, CUstream hs, int sync)
{
	struct sim_stream *s = get_stream(hs);
	void *p = (void *)(uintptr_t)dst;
	size_t bytes = width * height * elem;

	g_initialized = 1;
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!width || !height)
		return CUDA_SUCCESS;
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	if (height == 1)
		pitch = width * elem;
	if (s->cap) {
		struct sim_node *n = cap_add(s, N_MEMSET);

		n->dst = p, n->dpitch = pitch, n->value = value, n->elem = elem;
		n->width = width, n->height = height;
		return CUDA_SUCCESS;
	}
	pthread_mutex_lock(&g_lock);
	g_cnt.memsets++;
	g_cnt.memset_bytes += bytes;
	pthread_mutex_unlock(&g_lock);
	timeline_work(&g_dev[ptr_device(p, s->device)].tl, bytes, SIM_D2D, sync);
	fill_rows(p, pitch, value, elem, width, height);
	if (sync)
		timeline_sync(&g_dev[ptr_device(p, s->device)].tl);
	return CUDA_SUCCESS;
}

static CUresult do_host_func(CUstream hs, CUhostFn fn, void *user)
{
	struct sim_stream *s = get_stream(hs);

	if (!s || !fn)
		return CUDA_ERROR_INVALID_VALUE;
	if (s->cap) {
		struct sim_node *n = cap_add(s, N_HOST);

		n->fn = fn, n->user = user;
		return CUDA_SUCCESS;
	}
	pthread_mutex_lock(&g_lock);
	g_cnt.host_funcs++;
	pthread_mutex_unlock(&g_lock);
	timeline_sync(&g_dev[s->device].tl);
	fn(user);
	return CUDA_SUCCESS;
}

static void sync_device(int d)
{
	timeline_sync(&g_dev[d].tl);
}

#include "driver_api.inc"
