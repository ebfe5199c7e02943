/* gpuflight: uprobes on the CUDA runtime API (libcudart, shared or static).
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

#define GF_SIGSTOP 19

BPF_RINGBUF_OUTPUT(events, GF_RINGBUF_PAGES);
BPF_RINGBUF_OUTPUT(loader_events, 64);

/* drops[0]: events lost because the ring buffer was full; drops[1]: loader
 * notifications lost; drops[2]: returns whose entry was never seen. */
BPF_PERCPU_ARRAY(drops, u64, 3);
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
static __always_inline int gf_park(struct gf_inflight *v, u16 api)
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
