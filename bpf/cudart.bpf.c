/* gpuflight: uprobes on the CUDA runtime API (libcudart, shared or static) and on
 * the driver API (libcuda). One file: bcc rewrites map calls, and makes loadable
 * programs, only in the file it compiles, not in files it includes.
 *
 * Each probed function gets `<name>_entry` (and `<name>_return` where a result
 * or a duration is needed); producer/probes.py attaches them by these names.
 * Events go to one ring buffer as fixed-size records (events.h) that user
 * space maps and decodes in bulk; a reservation that fails is counted, never
 * silent.
 *
 * Build-time parameters (cflags):
 *   GF_RINGBUF_PAGES  size of the event ring buffer in pages (power of two)
 *   GF_FILTER_PIDS    1: only processes in `scope_pids` are captured
 *   GF_FOLLOW_FORKS   1: children of scoped processes join the scope
 *   GF_HOLD_ON_LOAD   1: a scoped process that execs or changes its link map is
 *                     stopped (SIGSTOP) until user space has attached to what
 *                     it mapped
 *   GF_WATCH_EXEC     1: exec is reported like a link-map change (needs tracefs)
 *   GF_NAMES_PAGES    size of the `names` ring buffer in pages (power of two)
 */
#include <uapi/linux/ptrace.h>
#include "events.h"

#ifndef GF_RINGBUF_PAGES
#define GF_RINGBUF_PAGES 8192
#endif
#ifndef GF_FILTER_PIDS
#define GF_FILTER_PIDS 0
#endif
#ifndef GF_FOLLOW_FORKS
#define GF_FOLLOW_FORKS 0
#endif
#ifndef GF_HOLD_ON_LOAD
#define GF_HOLD_ON_LOAD 0
#endif
#ifndef GF_WATCH_EXEC
#define GF_WATCH_EXEC 0
#endif

#ifndef GF_NAMES_PAGES
#define GF_NAMES_PAGES 256
#endif

#define GF_SIGSTOP 19

BPF_RINGBUF_OUTPUT(events, GF_RINGBUF_PAGES);
BPF_RINGBUF_OUTPUT(loader_events, 64);
/* Kernel names and handle aliases (struct gf_name_event): rare, and read before
 * the events ring is decoded. */
BPF_RINGBUF_OUTPUT(names, GF_NAMES_PAGES);

/* drops[0]: events lost because the ring buffer was full; drops[1]: loader
 * notifications lost; drops[2]: returns whose entry was never seen; drops[3]:
 * name records lost; [4] (not a loss): driver calls made by a probed runtime. */
BPF_PERCPU_ARRAY(drops, u64, 5);
BPF_HASH(drops_by_pid, u32, u64, 16384);
BPF_HASH(scope_pids, u32, u8, 65536);

struct gf_inflight_key {
	u64 pid_tgid;
	u32 api;
	u32 pad;
};

struct gf_inflight {
	struct gf_event ev;
	u64 out_ptr; /* where the call writes its result pointer (allocations) */
};

BPF_TABLE("lru_hash", struct gf_inflight_key, struct gf_inflight, inflight, 65536);

/* pid → the text of the runtime files it maps (filled by user space). */
BPF_HASH(runtime_text, u32, struct gf_text_ranges, 65536);

/* Parked name probes use inflight keys above every api id. */
#define GF_NAME_PROBE_KEY 0x10000

static __always_inline void gf_count_drop(u32 slot, u32 pid)
{
	u64 *n = drops.lookup(&slot);
	if (n)
		*n += 1;
	if (slot == 0) {
		u64 zero = 0;
		u64 *p = drops_by_pid.lookup_or_try_init(&pid, &zero);
		if (p)
			__sync_fetch_and_add(p, 1);
	}
}

static __always_inline int gf_in_scope(u32 pid)
{
#if GF_FILTER_PIDS
	return scope_pids.lookup(&pid) != 0;
#else
	return 1;
#endif
}

static __always_inline void gf_fill(struct gf_event *ev, u64 id, u16 api, u8 type)
{
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->ts_ns = bpf_ktime_get_ns();
	ev->pid = id >> 32;
	ev->tid = (u32)id;
	ev->api = api;
	ev->type = type;
}

/* Reserve an event for an entry-only probe, or NULL (out of scope or full). */
static __always_inline struct gf_event *gf_begin(u16 api, u8 type)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32;
	if (!gf_in_scope(pid))
		return 0;
	struct gf_event *ev = events.ringbuf_reserve(sizeof(struct gf_event));
	if (!ev) {
		gf_count_drop(0, pid);
		return 0;
	}
	gf_fill(ev, id, api, type);
	return ev;
}

static __always_inline void gf_commit(struct gf_event *ev)
{
	/* No wake-up: the reader drains on its own schedule, which keeps the
	 * per-call cost down to the reservation itself. */
	events.ringbuf_submit(ev, BPF_RB_NO_WAKEUP);
}

/* Entry half of a probe that completes at return: park the event per thread. */
static __always_inline int gf_park(struct gf_inflight *v, u32 api)
{
	struct gf_inflight_key key = {};
	key.pid_tgid = bpf_get_current_pid_tgid();
	key.api = api;
	inflight.update(&key, v);
	return 0;
}

static __always_inline struct gf_inflight *gf_park_begin(struct gf_inflight *v, u16 api, u8 type)
{
	u64 id = bpf_get_current_pid_tgid();
	if (!gf_in_scope(id >> 32))
		return 0;
	__builtin_memset(v, 0, sizeof(*v));
	v->ev.ts_ns = bpf_ktime_get_ns();
	v->ev.pid = id >> 32;
	v->ev.tid = (u32)id;
	v->ev.api = api;
	v->ev.type = type;
	return v;
}

static __always_inline int gf_finish(struct pt_regs *ctx, u16 api)
{
	u64 now = bpf_ktime_get_ns();
	struct gf_inflight_key key = {};
	key.pid_tgid = bpf_get_current_pid_tgid();
	key.api = api;
	struct gf_inflight *v = inflight.lookup(&key);
	if (!v)
		return 0; /* entered before we attached, or out of scope */
	struct gf_event *ev = events.ringbuf_reserve(sizeof(struct gf_event));
	if (!ev) {
		gf_count_drop(0, key.pid_tgid >> 32);
		inflight.delete(&key);
		return 0;
	}
	__builtin_memcpy(ev, &v->ev, sizeof(*ev));
	ev->result = (s32)PT_REGS_RC(ctx);
	ev->duration_ns = now - ev->ts_ns;
	ev->flags |= GF_F_HAS_RESULT;
	if (v->out_ptr && ev->result == 0) {
		u64 ptr = 0;
		bpf_probe_read_user(&ptr, sizeof(ptr), (void *)v->out_ptr);
		ev->handle = ptr;
	}
	inflight.delete(&key);
	gf_commit(ev);
	return 0;
}

static __always_inline u64 gf_stack_arg(struct pt_regs *ctx, int index)
{
	/* Arguments past the sixth integer one, and structs passed in memory, sit
	 * above the return address: [sp+8], [sp+16], ... */
	u64 value = 0;
	bpf_probe_read_user(&value, sizeof(value), (void *)(PT_REGS_SP(ctx) + 8 * (index + 1)));
	return value;
}

/* ---- launches ---------------------------------------------------------- */

/* cudaLaunchKernel(func, dim3 grid, dim3 block, args, sharedMem, stream):
 * grid.x|grid.y<<32 = rsi, grid.z = edx, block.x|block.y<<32 = rcx,
 * block.z = r8d, args = r9, sharedMem = [sp+8], stream = [sp+16]. */
static __always_inline int gf_launch(struct pt_regs *ctx, u16 api)
{
	struct gf_event *ev = gf_begin(api, GF_EV_LAUNCH);
	if (!ev)
		return 0;
	u64 grid_xy = PT_REGS_PARM2(ctx);
	u64 block_xy = PT_REGS_PARM4(ctx);
	ev->handle = PT_REGS_PARM1(ctx);
	ev->dim[0] = (u32)grid_xy;
	ev->dim[1] = grid_xy >> 32;
	ev->dim[2] = (u32)PT_REGS_PARM3(ctx);
	ev->dim[3] = (u32)block_xy;
	ev->dim[4] = block_xy >> 32;
	ev->dim[5] = (u32)PT_REGS_PARM5(ctx);
	u64 stacked[2] = {}; /* sharedMem, stream: one read, not two */
	bpf_probe_read_user(stacked, sizeof(stacked), (void *)(PT_REGS_SP(ctx) + 8));
	ev->bytes = stacked[0];
	ev->stream = stacked[1];
	gf_commit(ev);
	return 0;
}

/* cudaLaunchKernelExC(const cudaLaunchConfig_t *config, func, args):
 * gridDim@0, blockDim@12, dynamicSmemBytes@24, stream@32. */
struct gf_launch_config {
	u32 grid[3];
	u32 block[3];
	u64 dynamic_smem;
	u64 stream;
};

static __always_inline int gf_launch_ex(struct pt_regs *ctx, u16 api)
{
	struct gf_event *ev = gf_begin(api, GF_EV_LAUNCH);
	if (!ev)
		return 0;
	struct gf_launch_config cfg = {};
	bpf_probe_read_user(&cfg, sizeof(cfg), (void *)PT_REGS_PARM1(ctx));
	ev->handle = PT_REGS_PARM2(ctx);
	ev->dim[0] = cfg.grid[0];
	ev->dim[1] = cfg.grid[1];
	ev->dim[2] = cfg.grid[2];
	ev->dim[3] = cfg.block[0];
	ev->dim[4] = cfg.block[1];
	ev->dim[5] = cfg.block[2];
	ev->bytes = cfg.dynamic_smem;
	ev->stream = cfg.stream;
	gf_commit(ev);
	return 0;
}

#define GF_LAUNCH(name) \
	int name##_entry(struct pt_regs *ctx) { return gf_launch(ctx, GF_API_##name); }
#define GF_LAUNCH_EX(name) \
	int name##_entry(struct pt_regs *ctx) { return gf_launch_ex(ctx, GF_API_##name); }

GF_LAUNCH(cudaLaunchKernel)
GF_LAUNCH(cudaLaunchKernel_ptsz)
GF_LAUNCH(cudaLaunchCooperativeKernel)
GF_LAUNCH(cudaLaunchCooperativeKernel_ptsz)
GF_LAUNCH_EX(cudaLaunchKernelExC)
GF_LAUNCH_EX(cudaLaunchKernelExC_ptsz)

/* ---- copies ------------------------------------------------------------ */

/* Asynchronous copy: the event is complete at entry. */
static __always_inline int gf_copy_async(u16 api, u64 dst, u64 bytes, u32 kind, u64 stream)
{
	struct gf_event *ev = gf_begin(api, GF_EV_MEMCPY);
	if (!ev)
		return 0;
	ev->flags = GF_F_ASYNC;
	ev->handle = dst;
	ev->bytes = bytes;
	ev->dim[0] = kind;
	ev->stream = stream;
	gf_commit(ev);
	return 0;
}

/* Synchronous copy: parked at entry, completed with result and duration. */
static __always_inline int gf_copy_sync(u16 api, u64 dst, u64 bytes, u32 kind)
{
	struct gf_inflight v;
	if (!gf_park_begin(&v, api, GF_EV_MEMCPY))
		return 0;
	v.ev.handle = dst;
	v.ev.bytes = bytes;
	v.ev.dim[0] = kind;
	return gf_park(&v, api);
}

#define GF_RETURN(name) \
	int name##_return(struct pt_regs *ctx) { return gf_finish(ctx, GF_API_##name); }

/* cudaMemcpy(dst, src, count, kind) */
#define GF_MEMCPY(name)                                                          \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_copy_sync(GF_API_##name, PT_REGS_PARM1(ctx), PT_REGS_PARM3(ctx), \
				    (u32)PT_REGS_PARM4(ctx));                    \
	}                                                                        \
	GF_RETURN(name)
/* cudaMemcpyAsync(dst, src, count, kind, stream) */
#define GF_MEMCPY_ASYNC(name)                                                    \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_copy_async(GF_API_##name, PT_REGS_PARM1(ctx), PT_REGS_PARM3(ctx), \
				     (u32)PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx)); \
	}
/* cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind=[sp+8]) */
#define GF_MEMCPY_2D(name)                                                       \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_copy_sync(GF_API_##name, PT_REGS_PARM1(ctx),           \
				    PT_REGS_PARM5(ctx) * PT_REGS_PARM6(ctx),     \
				    (u32)gf_stack_arg(ctx, 0));                  \
	}                                                                        \
	GF_RETURN(name)
/* cudaMemcpy2DAsync(..., kind=[sp+8], stream=[sp+16]) */
#define GF_MEMCPY_2D_ASYNC(name)                                                 \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_copy_async(GF_API_##name, PT_REGS_PARM1(ctx),          \
				     PT_REGS_PARM5(ctx) * PT_REGS_PARM6(ctx),    \
				     (u32)gf_stack_arg(ctx, 0), gf_stack_arg(ctx, 1)); \
	}

GF_MEMCPY(cudaMemcpy)
GF_MEMCPY(cudaMemcpy_ptds)
GF_MEMCPY_ASYNC(cudaMemcpyAsync)
GF_MEMCPY_ASYNC(cudaMemcpyAsync_ptsz)
GF_MEMCPY_2D(cudaMemcpy2D)
GF_MEMCPY_2D(cudaMemcpy2D_ptds)
GF_MEMCPY_2D_ASYNC(cudaMemcpy2DAsync)
GF_MEMCPY_2D_ASYNC(cudaMemcpy2DAsync_ptsz)

/* cudaMemcpyPeer(dst, dstDevice, src, srcDevice, count) */
int cudaMemcpyPeer_entry(struct pt_regs *ctx)
{
	return gf_copy_sync(GF_API_cudaMemcpyPeer, PT_REGS_PARM1(ctx), PT_REGS_PARM5(ctx),
			    GF_COPY_D2D);
}
GF_RETURN(cudaMemcpyPeer)

/* cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream) */
int cudaMemcpyPeerAsync_entry(struct pt_regs *ctx)
{
	return gf_copy_async(GF_API_cudaMemcpyPeerAsync, PT_REGS_PARM1(ctx), PT_REGS_PARM5(ctx),
			     GF_COPY_D2D, PT_REGS_PARM6(ctx));
}

/* ---- memset ------------------------------------------------------------ */

static __always_inline int gf_memset(u16 api, u64 dst, u64 bytes, u64 stream, u8 async)
{
	struct gf_event *ev = gf_begin(api, GF_EV_MEMSET);
	if (!ev)
		return 0;
	ev->flags = async ? GF_F_ASYNC : 0;
	ev->handle = dst;
	ev->bytes = bytes;
	ev->stream = stream;
	gf_commit(ev);
	return 0;
}

/* cudaMemset(devPtr, value, count) / cudaMemsetAsync(..., stream) */
#define GF_MEMSET(name)                                                          \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_memset(GF_API_##name, PT_REGS_PARM1(ctx), PT_REGS_PARM3(ctx), 0, 0); \
	}
#define GF_MEMSET_ASYNC(name)                                                    \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_memset(GF_API_##name, PT_REGS_PARM1(ctx), PT_REGS_PARM3(ctx), \
				 PT_REGS_PARM4(ctx), 1);                         \
	}
/* cudaMemset2D(devPtr, pitch, value, width, height) / Async(..., stream) */
#define GF_MEMSET_2D(name)                                                       \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_memset(GF_API_##name, PT_REGS_PARM1(ctx),              \
				 PT_REGS_PARM4(ctx) * PT_REGS_PARM5(ctx), 0, 0); \
	}
#define GF_MEMSET_2D_ASYNC(name)                                                 \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_memset(GF_API_##name, PT_REGS_PARM1(ctx),              \
				 PT_REGS_PARM4(ctx) * PT_REGS_PARM5(ctx),        \
				 PT_REGS_PARM6(ctx), 1);                         \
	}

GF_MEMSET(cudaMemset)
GF_MEMSET(cudaMemset_ptds)
GF_MEMSET_ASYNC(cudaMemsetAsync)
GF_MEMSET_ASYNC(cudaMemsetAsync_ptsz)
GF_MEMSET_2D(cudaMemset2D)
GF_MEMSET_2D(cudaMemset2D_ptds)
GF_MEMSET_2D_ASYNC(cudaMemset2DAsync)
GF_MEMSET_2D_ASYNC(cudaMemset2DAsync_ptsz)

/* cudaMemset3D(cudaPitchedPtr, value, cudaExtent): both structs are larger
 * than 16 bytes, so they are passed in memory: pitchedDevPtr = [sp+8..40),
 * extent = [sp+40..64); value = edi; the Async form's stream = rsi. */
static __always_inline int gf_memset_3d(struct pt_regs *ctx, u16 api, u64 stream, u8 async)
{
	u64 extent[3] = {};
	bpf_probe_read_user(extent, sizeof(extent), (void *)(PT_REGS_SP(ctx) + 40));
	return gf_memset(api, gf_stack_arg(ctx, 0), extent[0] * extent[1] * extent[2], stream,
			 async);
}

int cudaMemset3D_entry(struct pt_regs *ctx) { return gf_memset_3d(ctx, GF_API_cudaMemset3D, 0, 0); }
int cudaMemset3D_ptds_entry(struct pt_regs *ctx)
{
	return gf_memset_3d(ctx, GF_API_cudaMemset3D_ptds, 0, 0);
}
int cudaMemset3DAsync_entry(struct pt_regs *ctx)
{
	return gf_memset_3d(ctx, GF_API_cudaMemset3DAsync, PT_REGS_PARM2(ctx), 1);
}
int cudaMemset3DAsync_ptsz_entry(struct pt_regs *ctx)
{
	return gf_memset_3d(ctx, GF_API_cudaMemset3DAsync_ptsz, PT_REGS_PARM2(ctx), 1);
}

/* ---- allocations ------------------------------------------------------- */

/* All allocators take (void **out, size_t size, ...); the pointer is read
 * from *out at return. */
static __always_inline int gf_alloc(struct pt_regs *ctx, u16 api, u32 kind, u64 stream)
{
	struct gf_inflight v;
	if (!gf_park_begin(&v, api, GF_EV_ALLOC))
		return 0;
	v.out_ptr = PT_REGS_PARM1(ctx);
	v.ev.bytes = PT_REGS_PARM2(ctx);
	v.ev.dim[0] = kind;
	v.ev.stream = stream;
	return gf_park(&v, api);
}

#define GF_ALLOC(name, kind)                                                     \
	int name##_entry(struct pt_regs *ctx) { return gf_alloc(ctx, GF_API_##name, kind, 0); } \
	GF_RETURN(name)
/* cudaMallocAsync(ptr, size, stream) */
#define GF_ALLOC_ASYNC(name, kind)                                               \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_alloc(ctx, GF_API_##name, kind, PT_REGS_PARM3(ctx));   \
	}                                                                        \
	GF_RETURN(name)
/* cudaMallocFromPoolAsync(ptr, size, pool, stream) */
#define GF_ALLOC_POOL(name)                                                      \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_alloc(ctx, GF_API_##name, GF_ALLOC_POOL_ASYNC, PT_REGS_PARM4(ctx)); \
	}                                                                        \
	GF_RETURN(name)

GF_ALLOC(cudaMalloc, GF_ALLOC_DEVICE)
GF_ALLOC_ASYNC(cudaMallocAsync, GF_ALLOC_DEVICE_ASYNC)
GF_ALLOC_ASYNC(cudaMallocAsync_ptsz, GF_ALLOC_DEVICE_ASYNC)
GF_ALLOC(cudaMallocManaged, GF_ALLOC_MANAGED)
GF_ALLOC(cudaMallocHost, GF_ALLOC_HOST_PINNED)
GF_ALLOC(cudaHostAlloc, GF_ALLOC_HOST_PINNED)
GF_ALLOC_POOL(cudaMallocFromPoolAsync)
GF_ALLOC_POOL(cudaMallocFromPoolAsync_ptsz)

/* cudaFree(ptr) / cudaFreeAsync(ptr, stream): the size is known to user space
 * from the allocation of the same pointer. */
static __always_inline int gf_free(u16 api, u64 ptr, u64 stream, u8 async)
{
	struct gf_inflight v;
	if (!gf_park_begin(&v, api, GF_EV_FREE))
		return 0;
	v.ev.handle = ptr;
	v.ev.stream = stream;
	v.ev.flags = async ? GF_F_ASYNC : 0;
	return gf_park(&v, api);
}

int cudaFree_entry(struct pt_regs *ctx) { return gf_free(GF_API_cudaFree, PT_REGS_PARM1(ctx), 0, 0); }
GF_RETURN(cudaFree)
int cudaFreeHost_entry(struct pt_regs *ctx)
{
	return gf_free(GF_API_cudaFreeHost, PT_REGS_PARM1(ctx), 0, 0);
}
GF_RETURN(cudaFreeHost)
int cudaFreeAsync_entry(struct pt_regs *ctx)
{
	return gf_free(GF_API_cudaFreeAsync, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 1);
}
GF_RETURN(cudaFreeAsync)
int cudaFreeAsync_ptsz_entry(struct pt_regs *ctx)
{
	return gf_free(GF_API_cudaFreeAsync_ptsz, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 1);
}
GF_RETURN(cudaFreeAsync_ptsz)

/* ---- waits: the CPU blocked on the GPU --------------------------------- */

static __always_inline int gf_sync(u16 api, u32 scope, u64 handle)
{
	struct gf_inflight v;
	if (!gf_park_begin(&v, api, GF_EV_SYNC))
		return 0;
	v.ev.dim[0] = scope;
	v.ev.handle = handle;
	if (scope == GF_SYNC_STREAM)
		v.ev.stream = handle;
	return gf_park(&v, api);
}

int cudaStreamSynchronize_entry(struct pt_regs *ctx)
{
	return gf_sync(GF_API_cudaStreamSynchronize, GF_SYNC_STREAM, PT_REGS_PARM1(ctx));
}
GF_RETURN(cudaStreamSynchronize)
int cudaStreamSynchronize_ptsz_entry(struct pt_regs *ctx)
{
	return gf_sync(GF_API_cudaStreamSynchronize_ptsz, GF_SYNC_STREAM, PT_REGS_PARM1(ctx));
}
GF_RETURN(cudaStreamSynchronize_ptsz)
int cudaDeviceSynchronize_entry(struct pt_regs *ctx)
{
	return gf_sync(GF_API_cudaDeviceSynchronize, GF_SYNC_DEVICE, 0);
}
GF_RETURN(cudaDeviceSynchronize)
int cudaEventSynchronize_entry(struct pt_regs *ctx)
{
	return gf_sync(GF_API_cudaEventSynchronize, GF_SYNC_EVENT, PT_REGS_PARM1(ctx));
}
GF_RETURN(cudaEventSynchronize)

/* ---- graphs ------------------------------------------------------------ */

/* cudaGraphLaunch(graphExec, stream) */
static __always_inline int gf_graph_launch(struct pt_regs *ctx, u16 api)
{
	struct gf_event *ev = gf_begin(api, GF_EV_GRAPH_LAUNCH);
	if (!ev)
		return 0;
	ev->flags = GF_F_ASYNC;
	ev->handle = PT_REGS_PARM1(ctx);
	ev->stream = PT_REGS_PARM2(ctx);
	gf_commit(ev);
	return 0;
}

int cudaGraphLaunch_entry(struct pt_regs *ctx) { return gf_graph_launch(ctx, GF_API_cudaGraphLaunch); }
int cudaGraphLaunch_ptsz_entry(struct pt_regs *ctx)
{
	return gf_graph_launch(ctx, GF_API_cudaGraphLaunch_ptsz);
}

/* Stream capture and instantiation: user space counts the launches captured on a
 * stream (F_CAPTURED) into the graph, then the exec instantiated from it, so that
 * graph launches can be expanded to kernel launches. Same shapes in the driver. */

/* cudaStreamBeginCapture(stream, mode) */
static __always_inline int gf_capture_begin(u16 api, u64 stream)
{
	struct gf_event *ev = gf_begin(api, GF_EV_GRAPH_CAPTURE);
	if (!ev)
		return 0;
	ev->stream = stream;
	ev->dim[0] = GF_CAPTURE_BEGIN;
	gf_commit(ev);
	return 0;
}

/* cudaStreamEndCapture(stream, cudaGraph_t *graph): the graph is read at return. */
static __always_inline int gf_capture_end(u16 api, u64 stream, u64 graph_out)
{
	struct gf_inflight v;
	if (!gf_park_begin(&v, api, GF_EV_GRAPH_CAPTURE))
		return 0;
	v.ev.stream = stream;
	v.ev.dim[0] = GF_CAPTURE_END;
	v.out_ptr = graph_out;
	return gf_park(&v, api);
}

/* cudaGraphInstantiate*(cudaGraphExec_t *exec, cudaGraph_t graph, ...) */
static __always_inline int gf_instantiate(u16 api, u64 exec_out, u64 graph)
{
	struct gf_inflight v;
	if (!gf_park_begin(&v, api, GF_EV_GRAPH_INSTANTIATE))
		return 0;
	v.ev.bytes = graph;
	v.out_ptr = exec_out;
	return gf_park(&v, api);
}

#define GF_CAPTURE_BEGIN_PROBE(name)                                             \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_capture_begin(GF_API_##name, PT_REGS_PARM1(ctx));      \
	}
#define GF_CAPTURE_END_PROBE(name)                                               \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_capture_end(GF_API_##name, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx)); \
	}                                                                        \
	GF_RETURN(name)
#define GF_INSTANTIATE_PROBE(name)                                               \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_instantiate(GF_API_##name, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx)); \
	}                                                                        \
	GF_RETURN(name)

GF_CAPTURE_BEGIN_PROBE(cudaStreamBeginCapture)
GF_CAPTURE_BEGIN_PROBE(cudaStreamBeginCapture_ptsz)
GF_CAPTURE_END_PROBE(cudaStreamEndCapture)
GF_CAPTURE_END_PROBE(cudaStreamEndCapture_ptsz)
GF_INSTANTIATE_PROBE(cudaGraphInstantiate)
GF_INSTANTIATE_PROBE(cudaGraphInstantiateWithFlags)
GF_INSTANTIATE_PROBE(cudaGraphInstantiateWithParams)
GF_INSTANTIATE_PROBE(cudaGraphInstantiateWithParams_ptsz)

/* ---- kernel names ------------------------------------------------------ */

/* A name record with its string read from user memory; entry-only or at return.
 * Not filtered by the runtime-text check: names the runtime asks the driver for
 * (cuLibraryGetKernel at registration) are the names of runtime launches too. */
static __always_inline int gf_name(u16 kind, u64 handle, u64 aux, u64 name_ptr)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32;
	if (!gf_in_scope(pid))
		return 0;
	struct gf_name_event *ne = names.ringbuf_reserve(sizeof(struct gf_name_event));
	if (!ne) {
		gf_count_drop(3, pid);
		return 0;
	}
	ne->ts_ns = bpf_ktime_get_ns();
	ne->pid = pid;
	ne->kind = kind;
	ne->flags = 0;
	ne->handle = handle;
	ne->aux = aux;
	ne->name[0] = 0;
	if (name_ptr) {
		long n = bpf_probe_read_user_str(ne->name, sizeof(ne->name), (void *)name_ptr);
		if (n == sizeof(ne->name))
			ne->flags |= GF_NAME_F_TRUNCATED;
		if (n < 0)
			ne->name[0] = 0;
	}
	names.ringbuf_submit(ne, 0);
	return 0;
}

/* Entry half of a name probe whose handle is an out-parameter: park the pointers. */
static __always_inline int gf_name_park(u16 kind, u64 out, u64 aux, u64 name_ptr)
{
	u64 id = bpf_get_current_pid_tgid();
	if (!gf_in_scope(id >> 32))
		return 0;
	struct gf_inflight v;
	__builtin_memset(&v, 0, sizeof(v));
	v.out_ptr = out;
	v.ev.handle = aux;
	v.ev.bytes = name_ptr;
	return gf_park(&v, GF_NAME_PROBE_KEY + kind);
}

static __always_inline int gf_name_finish(struct pt_regs *ctx, u16 kind)
{
	struct gf_inflight_key key = {};
	key.pid_tgid = bpf_get_current_pid_tgid();
	key.api = GF_NAME_PROBE_KEY + kind;
	struct gf_inflight *v = inflight.lookup(&key);
	if (!v)
		return 0;
	u64 out = v->out_ptr, aux = v->ev.handle, name_ptr = v->ev.bytes;
	inflight.delete(&key);
	if ((s32)PT_REGS_RC(ctx) != 0 || !out)
		return 0; /* failed: no handle was made */
	u64 handle = 0;
	bpf_probe_read_user(&handle, sizeof(handle), (void *)out);
	if (!handle)
		return 0;
	return gf_name(kind, handle, aux, name_ptr);
}

/* __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun, ...):
 * nvcc's module constructor registers each kernel's host stub and mangled name. */
int __cudaRegisterFunction_entry(struct pt_regs *ctx)
{
	return gf_name(GF_NAME_RUNTIME_FUNCTION, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx),
		       PT_REGS_PARM3(ctx));
}

/* __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun): nvcc 12.4+ stubs launch
 * by this handle, not by the stub's address. */
int __cudaGetKernel_entry(struct pt_regs *ctx)
{
	return gf_name_park(GF_NAME_RUNTIME_KERNEL, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0);
}
int __cudaGetKernel_return(struct pt_regs *ctx)
{
	return gf_name_finish(ctx, GF_NAME_RUNTIME_KERNEL);
}

/* ==== the driver API (libcuda.so.1) ====================================
 *
 * Same rings, maps and event layout; api ids from 200 up (layer "driver").
 *
 * No double counting: the runtime implements its calls with the driver, by
 * exported symbol or through pointers from cuGetProcAddress. Either way the call
 * instruction lies in the runtime's text, so each driver probe reads its return
 * address ([sp] at entry) and leaves the call out (counted in drops[4]) when it
 * lies in the text of a runtime file the process maps (`runtime_text`, filled
 * by user space per process). A runtime linked statically into a library whose
 * symbols we cannot see (cuBLAS) is not probed, so its driver calls are counted
 * here, once.
 */

/* 1 when a call with return address `ret` came from a probed runtime of `pid`. */
static __always_inline int gf_from_runtime(u32 pid, u64 ret)
{
	struct gf_text_ranges *r = runtime_text.lookup(&pid);
	if (!r)
		return 0;
#pragma unroll
	for (int i = 0; i < GF_MAX_RUNTIME_RANGES; i++) {
		if (ret >= r->start[i] && ret < r->end[i])
			return 1;
	}
	return 0;
}

static __always_inline void gf_count_forwarded(void)
{
	u32 slot = 4;
	u64 *n = drops.lookup(&slot);
	if (n)
		*n += 1;
}

static __always_inline u64 gf_return_address(struct pt_regs *ctx)
{
	u64 ret = 0;
	bpf_probe_read_user(&ret, sizeof(ret), (void *)PT_REGS_SP(ctx));
	return ret;
}

/* 1 when the call is the driver half of a runtime call already recorded. */
static __always_inline int gf_forwarded(u32 pid, u64 ret)
{
	if (!gf_from_runtime(pid, ret))
		return 0;
	gf_count_forwarded();
	return 1;
}

/* gf_begin for a driver call: NULL also when a probed runtime made the call. */
static __always_inline struct gf_event *gf_driver_begin(u64 ret, u16 api, u8 type)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32;
	if (!gf_in_scope(pid) || gf_forwarded(pid, ret))
		return 0;
	struct gf_event *ev = events.ringbuf_reserve(sizeof(struct gf_event));
	if (!ev) {
		gf_count_drop(0, pid);
		return 0;
	}
	gf_fill(ev, id, api, type);
	return ev;
}


/* gf_park_begin for a driver call. */
static __always_inline struct gf_inflight *gf_driver_park_begin(struct pt_regs *ctx,
								struct gf_inflight *v, u16 api,
								u8 type)
{
	u32 pid = bpf_get_current_pid_tgid() >> 32;
	if (gf_in_scope(pid) && gf_forwarded(pid, gf_return_address(ctx)))
		return 0;
	return gf_park_begin(v, api, type);
}

/* ---- launches ---------------------------------------------------------- */

/* cuLaunchKernel(f, gx, gy, gz, bx, by, bz=[sp+8], sharedMem=[sp+16], stream=[sp+24],
 * params, extra): one read of [sp, sp+32) gives the return address too. */
static __always_inline int gf_cu_launch(struct pt_regs *ctx, u16 api)
{
	u64 stacked[4] = {}; /* return address, bz, sharedMem, stream */
	bpf_probe_read_user(stacked, sizeof(stacked), (void *)PT_REGS_SP(ctx));
	struct gf_event *ev = gf_driver_begin(stacked[0], api, GF_EV_LAUNCH);
	if (!ev)
		return 0;
	ev->handle = PT_REGS_PARM1(ctx);
	ev->dim[0] = (u32)PT_REGS_PARM2(ctx);
	ev->dim[1] = (u32)PT_REGS_PARM3(ctx);
	ev->dim[2] = (u32)PT_REGS_PARM4(ctx);
	ev->dim[3] = (u32)PT_REGS_PARM5(ctx);
	ev->dim[4] = (u32)PT_REGS_PARM6(ctx);
	ev->dim[5] = (u32)stacked[1];
	ev->bytes = (u32)stacked[2];
	ev->stream = stacked[3];
	gf_commit(ev);
	return 0;
}

/* cuLaunchKernelEx(const CUlaunchConfig *config, f, params, extra): the runtime's
 * cudaLaunchConfig_t offsets, with a 32-bit sharedMemBytes at 24, stream at 32. */
struct gf_cu_launch_config {
	u32 grid[3];
	u32 block[3];
	u32 shared_mem;
	u32 pad;
	u64 stream;
};

static __always_inline int gf_cu_launch_ex(struct pt_regs *ctx, u16 api)
{
	struct gf_event *ev = gf_driver_begin(gf_return_address(ctx), api, GF_EV_LAUNCH);
	if (!ev)
		return 0;
	struct gf_cu_launch_config cfg = {};
	bpf_probe_read_user(&cfg, sizeof(cfg), (void *)PT_REGS_PARM1(ctx));
	ev->handle = PT_REGS_PARM2(ctx);
	ev->dim[0] = cfg.grid[0];
	ev->dim[1] = cfg.grid[1];
	ev->dim[2] = cfg.grid[2];
	ev->dim[3] = cfg.block[0];
	ev->dim[4] = cfg.block[1];
	ev->dim[5] = cfg.block[2];
	ev->bytes = cfg.shared_mem;
	ev->stream = cfg.stream;
	gf_commit(ev);
	return 0;
}

#define GF_CU_LAUNCH(name) \
	int name##_entry(struct pt_regs *ctx) { return gf_cu_launch(ctx, GF_API_##name); }
#define GF_CU_LAUNCH_EX(name) \
	int name##_entry(struct pt_regs *ctx) { return gf_cu_launch_ex(ctx, GF_API_##name); }

GF_CU_LAUNCH(cuLaunchKernel)
GF_CU_LAUNCH(cuLaunchKernel_ptsz)
GF_CU_LAUNCH(cuLaunchCooperativeKernel)
GF_CU_LAUNCH(cuLaunchCooperativeKernel_ptsz)
GF_CU_LAUNCH_EX(cuLaunchKernelEx)
GF_CU_LAUNCH_EX(cuLaunchKernelEx_ptsz)

/* ---- copies ------------------------------------------------------------ */

static __always_inline int gf_cu_copy_async(struct pt_regs *ctx, u16 api, u64 dst, u64 bytes,
					    u32 kind, u64 stream)
{
	struct gf_event *ev = gf_driver_begin(gf_return_address(ctx), api, GF_EV_MEMCPY);
	if (!ev)
		return 0;
	ev->flags = GF_F_ASYNC;
	ev->handle = dst;
	ev->bytes = bytes;
	ev->dim[0] = kind;
	ev->stream = stream;
	gf_commit(ev);
	return 0;
}

static __always_inline int gf_cu_copy_sync(struct pt_regs *ctx, u16 api, u64 dst, u64 bytes,
					   u32 kind)
{
	struct gf_inflight v;
	if (!gf_driver_park_begin(ctx, &v, api, GF_EV_MEMCPY))
		return 0;
	v.ev.handle = dst;
	v.ev.bytes = bytes;
	v.ev.dim[0] = kind;
	return gf_park(&v, api);
}

/* cuMemcpyHtoD_v2(dst, src, bytes) and the other directed copies */
#define GF_CU_COPY(name, kind)                                                   \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_cu_copy_sync(ctx, GF_API_##name, PT_REGS_PARM1(ctx),   \
				       PT_REGS_PARM3(ctx), kind);                \
	}                                                                        \
	GF_RETURN(name)
/* cuMemcpyHtoDAsync_v2(dst, src, bytes, stream) */
#define GF_CU_COPY_ASYNC(name, kind)                                             \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_cu_copy_async(ctx, GF_API_##name, PT_REGS_PARM1(ctx),  \
					PT_REGS_PARM3(ctx), kind, PT_REGS_PARM4(ctx)); \
	}
/* cuMemcpyPeer(dst, dstCtx, src, srcCtx, bytes) */
#define GF_CU_COPY_PEER(name)                                                    \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_cu_copy_sync(ctx, GF_API_##name, PT_REGS_PARM1(ctx),   \
				       PT_REGS_PARM5(ctx), GF_COPY_D2D);         \
	}                                                                        \
	GF_RETURN(name)
/* cuMemcpyPeerAsync(dst, dstCtx, src, srcCtx, bytes, stream) */
#define GF_CU_COPY_PEER_ASYNC(name)                                              \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_cu_copy_async(ctx, GF_API_##name, PT_REGS_PARM1(ctx),  \
					PT_REGS_PARM5(ctx), GF_COPY_D2D, PT_REGS_PARM6(ctx)); \
	}

GF_CU_COPY(cuMemcpyHtoD_v2, GF_COPY_H2D)
GF_CU_COPY(cuMemcpyHtoD_v2_ptds, GF_COPY_H2D)
GF_CU_COPY(cuMemcpyDtoH_v2, GF_COPY_D2H)
GF_CU_COPY(cuMemcpyDtoH_v2_ptds, GF_COPY_D2H)
GF_CU_COPY(cuMemcpyDtoD_v2, GF_COPY_D2D)
GF_CU_COPY(cuMemcpyDtoD_v2_ptds, GF_COPY_D2D)
GF_CU_COPY_ASYNC(cuMemcpyHtoDAsync_v2, GF_COPY_H2D)
GF_CU_COPY_ASYNC(cuMemcpyHtoDAsync_v2_ptsz, GF_COPY_H2D)
GF_CU_COPY_ASYNC(cuMemcpyDtoHAsync_v2, GF_COPY_D2H)
GF_CU_COPY_ASYNC(cuMemcpyDtoHAsync_v2_ptsz, GF_COPY_D2H)
GF_CU_COPY_ASYNC(cuMemcpyDtoDAsync_v2, GF_COPY_D2D)
GF_CU_COPY_ASYNC(cuMemcpyDtoDAsync_v2_ptsz, GF_COPY_D2D)
/* cuMemcpy(dst, src, bytes): unified addressing, direction from the pointers. */
GF_CU_COPY(cuMemcpy, GF_COPY_DEFAULT)
GF_CU_COPY(cuMemcpy_ptds, GF_COPY_DEFAULT)
GF_CU_COPY_ASYNC(cuMemcpyAsync, GF_COPY_DEFAULT)
GF_CU_COPY_ASYNC(cuMemcpyAsync_ptsz, GF_COPY_DEFAULT)
GF_CU_COPY_PEER(cuMemcpyPeer)
GF_CU_COPY_PEER(cuMemcpyPeer_ptds)
GF_CU_COPY_PEER_ASYNC(cuMemcpyPeerAsync)
GF_CU_COPY_PEER_ASYNC(cuMemcpyPeerAsync_ptsz)

/* ---- memset ------------------------------------------------------------ */

static __always_inline int gf_cu_memset(struct pt_regs *ctx, u16 api, u64 bytes, u64 stream,
					u8 async)
{
	struct gf_event *ev = gf_driver_begin(gf_return_address(ctx), api, GF_EV_MEMSET);
	if (!ev)
		return 0;
	ev->flags = async ? GF_F_ASYNC : 0;
	ev->handle = PT_REGS_PARM1(ctx);
	ev->bytes = bytes;
	ev->stream = stream;
	gf_commit(ev);
	return 0;
}

/* cuMemsetD8_v2(dst, value, N): N elements of 1, 2 or 4 bytes; Async(..., stream) */
#define GF_CU_MEMSET(name, width)                                                \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_cu_memset(ctx, GF_API_##name, PT_REGS_PARM3(ctx) * width, 0, 0); \
	}
#define GF_CU_MEMSET_ASYNC(name, width)                                          \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_cu_memset(ctx, GF_API_##name, PT_REGS_PARM3(ctx) * width, \
				    PT_REGS_PARM4(ctx), 1);                      \
	}

GF_CU_MEMSET(cuMemsetD8_v2, 1)
GF_CU_MEMSET(cuMemsetD8_v2_ptds, 1)
GF_CU_MEMSET(cuMemsetD16_v2, 2)
GF_CU_MEMSET(cuMemsetD16_v2_ptds, 2)
GF_CU_MEMSET(cuMemsetD32_v2, 4)
GF_CU_MEMSET(cuMemsetD32_v2_ptds, 4)
GF_CU_MEMSET_ASYNC(cuMemsetD8Async, 1)
GF_CU_MEMSET_ASYNC(cuMemsetD8Async_ptsz, 1)
GF_CU_MEMSET_ASYNC(cuMemsetD16Async, 2)
GF_CU_MEMSET_ASYNC(cuMemsetD16Async_ptsz, 2)
GF_CU_MEMSET_ASYNC(cuMemsetD32Async, 4)
GF_CU_MEMSET_ASYNC(cuMemsetD32Async_ptsz, 4)

/* ---- allocations ------------------------------------------------------- */

/* cuMemAlloc_v2(CUdeviceptr *out, size_t bytes, ...): the pointer is read at return. */
static __always_inline int gf_cu_alloc(struct pt_regs *ctx, u16 api, u32 kind, u64 stream)
{
	struct gf_inflight v;
	if (!gf_driver_park_begin(ctx, &v, api, GF_EV_ALLOC))
		return 0;
	v.out_ptr = PT_REGS_PARM1(ctx);
	v.ev.bytes = PT_REGS_PARM2(ctx);
	v.ev.dim[0] = kind;
	v.ev.stream = stream;
	return gf_park(&v, api);
}

#define GF_CU_ALLOC(name, kind)                                                  \
	int name##_entry(struct pt_regs *ctx) { return gf_cu_alloc(ctx, GF_API_##name, kind, 0); } \
	GF_RETURN(name)
/* cuMemAllocAsync(out, bytes, stream) */
#define GF_CU_ALLOC_ASYNC(name)                                                  \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_cu_alloc(ctx, GF_API_##name, GF_ALLOC_DEVICE_ASYNC, PT_REGS_PARM3(ctx)); \
	}                                                                        \
	GF_RETURN(name)

GF_CU_ALLOC(cuMemAlloc_v2, GF_ALLOC_DEVICE)
GF_CU_ALLOC_ASYNC(cuMemAllocAsync)
GF_CU_ALLOC_ASYNC(cuMemAllocAsync_ptsz)
GF_CU_ALLOC(cuMemAllocManaged, GF_ALLOC_MANAGED)
GF_CU_ALLOC(cuMemAllocHost_v2, GF_ALLOC_HOST_PINNED)
GF_CU_ALLOC(cuMemHostAlloc, GF_ALLOC_HOST_PINNED)

/* cuMemFree_v2(ptr) / cuMemFreeAsync(ptr, stream) / cuMemFreeHost(ptr) */
static __always_inline int gf_cu_free(struct pt_regs *ctx, u16 api, u64 stream, u8 async)
{
	struct gf_inflight v;
	if (!gf_driver_park_begin(ctx, &v, api, GF_EV_FREE))
		return 0;
	v.ev.handle = PT_REGS_PARM1(ctx);
	v.ev.stream = stream;
	v.ev.flags = async ? GF_F_ASYNC : 0;
	return gf_park(&v, api);
}

#define GF_CU_FREE(name)                                                         \
	int name##_entry(struct pt_regs *ctx) { return gf_cu_free(ctx, GF_API_##name, 0, 0); } \
	GF_RETURN(name)
#define GF_CU_FREE_ASYNC(name)                                                   \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_cu_free(ctx, GF_API_##name, PT_REGS_PARM2(ctx), 1);    \
	}                                                                        \
	GF_RETURN(name)

GF_CU_FREE(cuMemFree_v2)
GF_CU_FREE_ASYNC(cuMemFreeAsync)
GF_CU_FREE_ASYNC(cuMemFreeAsync_ptsz)
GF_CU_FREE(cuMemFreeHost)

/* ---- waits ------------------------------------------------------------- */

static __always_inline int gf_cu_sync(struct pt_regs *ctx, u16 api, u32 scope, u64 handle)
{
	struct gf_inflight v;
	if (!gf_driver_park_begin(ctx, &v, api, GF_EV_SYNC))
		return 0;
	v.ev.dim[0] = scope;
	v.ev.handle = handle;
	if (scope == GF_SYNC_STREAM)
		v.ev.stream = handle;
	return gf_park(&v, api);
}

#define GF_CU_SYNC(name, scope, handle)                                          \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_cu_sync(ctx, GF_API_##name, scope, handle);            \
	}                                                                        \
	GF_RETURN(name)

GF_CU_SYNC(cuStreamSynchronize, GF_SYNC_STREAM, PT_REGS_PARM1(ctx))
GF_CU_SYNC(cuStreamSynchronize_ptsz, GF_SYNC_STREAM, PT_REGS_PARM1(ctx))
GF_CU_SYNC(cuCtxSynchronize, GF_SYNC_DEVICE, 0)
GF_CU_SYNC(cuEventSynchronize, GF_SYNC_EVENT, PT_REGS_PARM1(ctx))

/* ---- graphs ------------------------------------------------------------ */

/* cuGraphLaunch(exec, stream) */
static __always_inline int gf_cu_graph_launch(struct pt_regs *ctx, u16 api)
{
	struct gf_event *ev = gf_driver_begin(gf_return_address(ctx), api, GF_EV_GRAPH_LAUNCH);
	if (!ev)
		return 0;
	ev->flags = GF_F_ASYNC;
	ev->handle = PT_REGS_PARM1(ctx);
	ev->stream = PT_REGS_PARM2(ctx);
	gf_commit(ev);
	return 0;
}

int cuGraphLaunch_entry(struct pt_regs *ctx) { return gf_cu_graph_launch(ctx, GF_API_cuGraphLaunch); }
int cuGraphLaunch_ptsz_entry(struct pt_regs *ctx)
{
	return gf_cu_graph_launch(ctx, GF_API_cuGraphLaunch_ptsz);
}

/* cuStreamBeginCapture_v2(stream, mode), cuStreamEndCapture(stream, CUgraph *),
 * cuGraphInstantiateWithFlags(CUgraphExec *, graph, flags): the runtime's shapes. */
#define GF_CU_CAPTURE_BEGIN(name)                                                \
	int name##_entry(struct pt_regs *ctx) {                                  \
		u32 pid = bpf_get_current_pid_tgid() >> 32;                      \
		if (gf_forwarded(pid, gf_return_address(ctx)))                   \
			return 0;                                                \
		return gf_capture_begin(GF_API_##name, PT_REGS_PARM1(ctx));      \
	}
#define GF_CU_CAPTURE_END(name)                                                  \
	int name##_entry(struct pt_regs *ctx) {                                  \
		u32 pid = bpf_get_current_pid_tgid() >> 32;                      \
		if (gf_forwarded(pid, gf_return_address(ctx)))                   \
			return 0;                                                \
		return gf_capture_end(GF_API_##name, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx)); \
	}                                                                        \
	GF_RETURN(name)
#define GF_CU_INSTANTIATE(name)                                                  \
	int name##_entry(struct pt_regs *ctx) {                                  \
		u32 pid = bpf_get_current_pid_tgid() >> 32;                      \
		if (gf_forwarded(pid, gf_return_address(ctx)))                   \
			return 0;                                                \
		return gf_instantiate(GF_API_##name, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx)); \
	}                                                                        \
	GF_RETURN(name)

GF_CU_CAPTURE_BEGIN(cuStreamBeginCapture_v2)
GF_CU_CAPTURE_BEGIN(cuStreamBeginCapture_v2_ptsz)
GF_CU_CAPTURE_END(cuStreamEndCapture)
GF_CU_CAPTURE_END(cuStreamEndCapture_ptsz)
GF_CU_INSTANTIATE(cuGraphInstantiateWithFlags)
GF_CU_INSTANTIATE(cuGraphInstantiateWithParams)
GF_CU_INSTANTIATE(cuGraphInstantiateWithParams_ptsz)

/* ---- kernel names and module identity ---------------------------------- */

/* cuModuleGetFunction(CUfunction *out, CUmodule module, const char *name) */
int cuModuleGetFunction_entry(struct pt_regs *ctx)
{
	return gf_name_park(GF_NAME_DRIVER_FUNCTION, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
			    PT_REGS_PARM3(ctx));
}
int cuModuleGetFunction_return(struct pt_regs *ctx)
{
	return gf_name_finish(ctx, GF_NAME_DRIVER_FUNCTION);
}

/* cuLibraryGetKernel(CUkernel *out, CUlibrary library, const char *name) */
int cuLibraryGetKernel_entry(struct pt_regs *ctx)
{
	return gf_name_park(GF_NAME_DRIVER_KERNEL, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
			    PT_REGS_PARM3(ctx));
}
int cuLibraryGetKernel_return(struct pt_regs *ctx)
{
	return gf_name_finish(ctx, GF_NAME_DRIVER_KERNEL);
}

/* cuKernelGetFunction(CUfunction *out, CUkernel kernel) */
int cuKernelGetFunction_entry(struct pt_regs *ctx)
{
	return gf_name_park(GF_NAME_KERNEL_FUNCTION, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0);
}
int cuKernelGetFunction_return(struct pt_regs *ctx)
{
	return gf_name_finish(ctx, GF_NAME_KERNEL_FUNCTION);
}

/* cuModuleLoadData(CUmodule *out, const void *image, ...), cuModuleLoadDataEx and
 * cuLibraryLoadData(CUlibrary *out, const void *code, ...): the module's handle and
 * image address (which file it came from, or the heap for JIT-built code). */
#define GF_CU_MODULE(name)                                                       \
	int name##_entry(struct pt_regs *ctx) {                                  \
		return gf_name_park(GF_NAME_MODULE, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0); \
	}                                                                        \
	int name##_return(struct pt_regs *ctx) { return gf_name_finish(ctx, GF_NAME_MODULE); }

GF_CU_MODULE(cuModuleLoadData)
GF_CU_MODULE(cuModuleLoadDataEx)
GF_CU_MODULE(cuLibraryLoadData)

/* ---- the dynamic loader ------------------------------------------------ */

/* ld.so calls _dl_debug_state() whenever its link map changes (start-up,
 * dlopen, dlclose), after mapping a library and before running any of its
 * code. User space rescans the process then; a process in scope is also held
 * (SIGSTOP) until that rescan has attached to what it mapped, so not even its
 * first call is missed. The stop is sent only once the notification is
 * queued, so a held process is always released. */
static __always_inline int gf_loader_notify(void)
{
	u32 pid = bpf_get_current_pid_tgid() >> 32;
	u32 held = 0;
#if GF_FILTER_PIDS
	if (!gf_in_scope(pid))
		return 0;
#if GF_HOLD_ON_LOAD
	held = 1;
#endif
#endif
	struct gf_loader_event *e = loader_events.ringbuf_reserve(sizeof(struct gf_loader_event));
	if (!e) {
		gf_count_drop(1, pid);
		return 0;
	}
	e->pid = pid;
	e->held = held;
	if (held)
		bpf_send_signal(GF_SIGSTOP);
	loader_events.ringbuf_submit(e, 0);
	return 0;
}

int on_loader_change(struct pt_regs *ctx) { return gf_loader_notify(); }

#if GF_WATCH_EXEC
/* A new image: its own loader (a container's, say) or a static runtime in the
 * executable is mapped before any of its code runs. */
TRACEPOINT_PROBE(sched, sched_process_exec) { return gf_loader_notify(); }
#endif

#if GF_FOLLOW_FORKS
/* Children of processes in scope are in scope from their first instruction. */
TRACEPOINT_PROBE(sched, sched_process_fork)
{
	u32 parent = bpf_get_current_pid_tgid() >> 32;
	if (!scope_pids.lookup(&parent))
		return 0;
	u32 child = args->child_pid;
	u8 one = 1;
	scope_pids.update(&child, &one);
	return 0;
}
#endif
