/* gpuflight: the one contract between the BPF programs and user space.
 *
 * Every event is one fixed-size `struct gf_event`, so a span of the ring buffer
 * is a regular array that user space decodes in bulk (producer/contract/abi.py mirrors
 * this file; tests/unit/producer/contract/test_abi.py checks that the mirror matches).
 */
#ifndef GPUFLIGHT_EVENTS_H
#define GPUFLIGHT_EVENTS_H

enum gf_event_type {
	GF_EV_LAUNCH = 1,
	GF_EV_MEMCPY = 2,
	GF_EV_MEMSET = 3,
	GF_EV_ALLOC = 4,
	GF_EV_FREE = 5,
	GF_EV_SYNC = 6,
	GF_EV_GRAPH_LAUNCH = 7,
	GF_EV_GRAPH_CAPTURE = 8,     /* stream capture began (dim[0] 1) or ended (2) */
	GF_EV_GRAPH_INSTANTIATE = 9, /* a graph became an executable graph */
};

/* The probe table: one row per probed CUDA function,
 *
 *   X(name, api id, layer, family, argument)
 *
 * layer: RUNTIME (libcudart) or DRIVER (libcuda); family: how bpf/cudart.bpf.c decodes the
 * call and records it (GF_PROBE_<family>: `<name>_entry`, and `<name>_return` for the families
 * that complete at return); argument: the family's constant (copy direction, allocation kind,
 * memset element width, sync scope; 0 where it has none).
 *
 * It makes enum gf_api (below) and every probe program (cudart.bpf.c); producer/contract/abi.py
 * mirrors it (PROBES), and tests/unit/producer/contract/test_abi.py checks the mirror against the compiled
 * header and the programs against the preprocessed source. Ids are part of the contract:
 * append only.
 */
#define GF_API_PROBES(X) \
	X(cudaLaunchKernel, 1, RUNTIME, LAUNCH, 0) \
	X(cudaLaunchKernel_ptsz, 2, RUNTIME, LAUNCH, 0) \
	X(cudaLaunchKernelExC, 3, RUNTIME, LAUNCH_EX, 0) \
	X(cudaLaunchKernelExC_ptsz, 4, RUNTIME, LAUNCH_EX, 0) \
	X(cudaLaunchCooperativeKernel, 5, RUNTIME, LAUNCH, 0) \
	X(cudaLaunchCooperativeKernel_ptsz, 6, RUNTIME, LAUNCH, 0) \
	\
	X(cudaMemcpy, 20, RUNTIME, MEMCPY, 0) \
	X(cudaMemcpy_ptds, 21, RUNTIME, MEMCPY, 0) \
	X(cudaMemcpyAsync, 22, RUNTIME, MEMCPY_ASYNC, 0) \
	X(cudaMemcpyAsync_ptsz, 23, RUNTIME, MEMCPY_ASYNC, 0) \
	X(cudaMemcpyPeer, 24, RUNTIME, COPY_PEER, 0) \
	X(cudaMemcpyPeerAsync, 25, RUNTIME, COPY_PEER_ASYNC, 0) \
	X(cudaMemcpy2D, 26, RUNTIME, MEMCPY_2D, 0) \
	X(cudaMemcpy2D_ptds, 27, RUNTIME, MEMCPY_2D, 0) \
	X(cudaMemcpy2DAsync, 28, RUNTIME, MEMCPY_2D_ASYNC, 0) \
	X(cudaMemcpy2DAsync_ptsz, 29, RUNTIME, MEMCPY_2D_ASYNC, 0) \
	\
	X(cudaMemset, 40, RUNTIME, MEMSET, 1) \
	X(cudaMemset_ptds, 41, RUNTIME, MEMSET, 1) \
	X(cudaMemsetAsync, 42, RUNTIME, MEMSET_ASYNC, 1) \
	X(cudaMemsetAsync_ptsz, 43, RUNTIME, MEMSET_ASYNC, 1) \
	X(cudaMemset2D, 44, RUNTIME, MEMSET_2D, 0) \
	X(cudaMemset2D_ptds, 45, RUNTIME, MEMSET_2D, 0) \
	X(cudaMemset2DAsync, 46, RUNTIME, MEMSET_2D_ASYNC, 0) \
	X(cudaMemset2DAsync_ptsz, 47, RUNTIME, MEMSET_2D_ASYNC, 0) \
	X(cudaMemset3D, 48, RUNTIME, MEMSET_3D, 0) \
	X(cudaMemset3D_ptds, 49, RUNTIME, MEMSET_3D, 0) \
	X(cudaMemset3DAsync, 50, RUNTIME, MEMSET_3D_ASYNC, 0) \
	X(cudaMemset3DAsync_ptsz, 51, RUNTIME, MEMSET_3D_ASYNC, 0) \
	\
	X(cudaMalloc, 60, RUNTIME, ALLOC, GF_ALLOC_DEVICE) \
	X(cudaMallocAsync, 61, RUNTIME, ALLOC_ASYNC, 0) \
	X(cudaMallocAsync_ptsz, 62, RUNTIME, ALLOC_ASYNC, 0) \
	X(cudaMallocManaged, 63, RUNTIME, ALLOC, GF_ALLOC_MANAGED) \
	X(cudaMallocHost, 64, RUNTIME, ALLOC, GF_ALLOC_HOST_PINNED) \
	X(cudaHostAlloc, 65, RUNTIME, ALLOC, GF_ALLOC_HOST_PINNED) \
	X(cudaMallocFromPoolAsync, 66, RUNTIME, ALLOC_POOL, 0) \
	X(cudaMallocFromPoolAsync_ptsz, 67, RUNTIME, ALLOC_POOL, 0) \
	\
	X(cudaFree, 80, RUNTIME, FREE, 0) \
	X(cudaFreeAsync, 81, RUNTIME, FREE_ASYNC, 0) \
	X(cudaFreeAsync_ptsz, 82, RUNTIME, FREE_ASYNC, 0) \
	X(cudaFreeHost, 83, RUNTIME, FREE, 0) \
	\
	X(cudaStreamSynchronize, 100, RUNTIME, SYNC, GF_SYNC_STREAM) \
	X(cudaStreamSynchronize_ptsz, 101, RUNTIME, SYNC, GF_SYNC_STREAM) \
	X(cudaDeviceSynchronize, 102, RUNTIME, SYNC, GF_SYNC_DEVICE) \
	X(cudaEventSynchronize, 103, RUNTIME, SYNC, GF_SYNC_EVENT) \
	\
	X(cudaGraphLaunch, 120, RUNTIME, GRAPH_LAUNCH, 0) \
	X(cudaGraphLaunch_ptsz, 121, RUNTIME, GRAPH_LAUNCH, 0) \
	\
	X(cudaStreamBeginCapture, 130, RUNTIME, CAPTURE_BEGIN, 0) \
	X(cudaStreamBeginCapture_ptsz, 131, RUNTIME, CAPTURE_BEGIN, 0) \
	X(cudaStreamEndCapture, 132, RUNTIME, CAPTURE_END, 0) \
	X(cudaStreamEndCapture_ptsz, 133, RUNTIME, CAPTURE_END, 0) \
	X(cudaGraphInstantiate, 134, RUNTIME, INSTANTIATE, 0) \
	X(cudaGraphInstantiateWithFlags, 135, RUNTIME, INSTANTIATE, 0) \
	X(cudaGraphInstantiateWithParams, 136, RUNTIME, INSTANTIATE, 0) \
	X(cudaGraphInstantiateWithParams_ptsz, 137, RUNTIME, INSTANTIATE, 0) \
	/* the driver API (libcuda): ids from 200 up (records.DRIVER_API_BASE) */ \
	X(cuLaunchKernel, 200, DRIVER, LAUNCH, 0) \
	X(cuLaunchKernel_ptsz, 201, DRIVER, LAUNCH, 0) \
	X(cuLaunchKernelEx, 202, DRIVER, LAUNCH_EX, 0) \
	X(cuLaunchKernelEx_ptsz, 203, DRIVER, LAUNCH_EX, 0) \
	X(cuLaunchCooperativeKernel, 204, DRIVER, LAUNCH, 0) \
	X(cuLaunchCooperativeKernel_ptsz, 205, DRIVER, LAUNCH, 0) \
	\
	X(cuMemcpyHtoD_v2, 220, DRIVER, COPY, GF_COPY_H2D) \
	X(cuMemcpyHtoD_v2_ptds, 221, DRIVER, COPY, GF_COPY_H2D) \
	X(cuMemcpyDtoH_v2, 222, DRIVER, COPY, GF_COPY_D2H) \
	X(cuMemcpyDtoH_v2_ptds, 223, DRIVER, COPY, GF_COPY_D2H) \
	X(cuMemcpyDtoD_v2, 224, DRIVER, COPY, GF_COPY_D2D) \
	X(cuMemcpyDtoD_v2_ptds, 225, DRIVER, COPY, GF_COPY_D2D) \
	X(cuMemcpyHtoDAsync_v2, 226, DRIVER, COPY_ASYNC, GF_COPY_H2D) \
	X(cuMemcpyHtoDAsync_v2_ptsz, 227, DRIVER, COPY_ASYNC, GF_COPY_H2D) \
	X(cuMemcpyDtoHAsync_v2, 228, DRIVER, COPY_ASYNC, GF_COPY_D2H) \
	X(cuMemcpyDtoHAsync_v2_ptsz, 229, DRIVER, COPY_ASYNC, GF_COPY_D2H) \
	X(cuMemcpyDtoDAsync_v2, 230, DRIVER, COPY_ASYNC, GF_COPY_D2D) \
	X(cuMemcpyDtoDAsync_v2_ptsz, 231, DRIVER, COPY_ASYNC, GF_COPY_D2D) \
	X(cuMemcpy, 232, DRIVER, COPY, GF_COPY_DEFAULT) \
	X(cuMemcpy_ptds, 233, DRIVER, COPY, GF_COPY_DEFAULT) \
	X(cuMemcpyAsync, 234, DRIVER, COPY_ASYNC, GF_COPY_DEFAULT) \
	X(cuMemcpyAsync_ptsz, 235, DRIVER, COPY_ASYNC, GF_COPY_DEFAULT) \
	X(cuMemcpyPeer, 236, DRIVER, COPY_PEER, 0) \
	X(cuMemcpyPeer_ptds, 237, DRIVER, COPY_PEER, 0) \
	X(cuMemcpyPeerAsync, 238, DRIVER, COPY_PEER_ASYNC, 0) \
	X(cuMemcpyPeerAsync_ptsz, 239, DRIVER, COPY_PEER_ASYNC, 0) \
	\
	X(cuMemsetD8_v2, 250, DRIVER, MEMSET, 1) \
	X(cuMemsetD8_v2_ptds, 251, DRIVER, MEMSET, 1) \
	X(cuMemsetD16_v2, 252, DRIVER, MEMSET, 2) \
	X(cuMemsetD16_v2_ptds, 253, DRIVER, MEMSET, 2) \
	X(cuMemsetD32_v2, 254, DRIVER, MEMSET, 4) \
	X(cuMemsetD32_v2_ptds, 255, DRIVER, MEMSET, 4) \
	X(cuMemsetD8Async, 256, DRIVER, MEMSET_ASYNC, 1) \
	X(cuMemsetD8Async_ptsz, 257, DRIVER, MEMSET_ASYNC, 1) \
	X(cuMemsetD16Async, 258, DRIVER, MEMSET_ASYNC, 2) \
	X(cuMemsetD16Async_ptsz, 259, DRIVER, MEMSET_ASYNC, 2) \
	X(cuMemsetD32Async, 260, DRIVER, MEMSET_ASYNC, 4) \
	X(cuMemsetD32Async_ptsz, 261, DRIVER, MEMSET_ASYNC, 4) \
	\
	X(cuMemAlloc_v2, 280, DRIVER, ALLOC, GF_ALLOC_DEVICE) \
	X(cuMemAllocAsync, 281, DRIVER, ALLOC_ASYNC, 0) \
	X(cuMemAllocAsync_ptsz, 282, DRIVER, ALLOC_ASYNC, 0) \
	X(cuMemAllocManaged, 283, DRIVER, ALLOC, GF_ALLOC_MANAGED) \
	X(cuMemAllocHost_v2, 284, DRIVER, ALLOC, GF_ALLOC_HOST_PINNED) \
	X(cuMemHostAlloc, 285, DRIVER, ALLOC, GF_ALLOC_HOST_PINNED) \
	X(cuMemFree_v2, 290, DRIVER, FREE, 0) \
	X(cuMemFreeAsync, 291, DRIVER, FREE_ASYNC, 0) \
	X(cuMemFreeAsync_ptsz, 292, DRIVER, FREE_ASYNC, 0) \
	X(cuMemFreeHost, 293, DRIVER, FREE, 0) \
	\
	X(cuStreamSynchronize, 300, DRIVER, SYNC, GF_SYNC_STREAM) \
	X(cuStreamSynchronize_ptsz, 301, DRIVER, SYNC, GF_SYNC_STREAM) \
	X(cuCtxSynchronize, 302, DRIVER, SYNC, GF_SYNC_DEVICE) \
	X(cuEventSynchronize, 303, DRIVER, SYNC, GF_SYNC_EVENT) \
	\
	X(cuGraphLaunch, 320, DRIVER, GRAPH_LAUNCH, 0) \
	X(cuGraphLaunch_ptsz, 321, DRIVER, GRAPH_LAUNCH, 0) \
	X(cuStreamBeginCapture_v2, 330, DRIVER, CAPTURE_BEGIN, 0) \
	X(cuStreamBeginCapture_v2_ptsz, 331, DRIVER, CAPTURE_BEGIN, 0) \
	X(cuStreamEndCapture, 332, DRIVER, CAPTURE_END, 0) \
	X(cuStreamEndCapture_ptsz, 333, DRIVER, CAPTURE_END, 0) \
	X(cuGraphInstantiateWithFlags, 334, DRIVER, INSTANTIATE, 0) \
	X(cuGraphInstantiateWithParams, 335, DRIVER, INSTANTIATE, 0) \
	X(cuGraphInstantiateWithParams_ptsz, 336, DRIVER, INSTANTIATE, 0)

/* The function that was called: GF_API_<name> = its id in GF_API_PROBES. */
#define GF_API_ENUM(name, id, layer, family, arg) GF_API_##name = id,
enum gf_api { GF_API_PROBES(GF_API_ENUM) };
#undef GF_API_ENUM

/* Functions probed with no api id (they make no gf_event): X(name, layer, family, argument).
 *
 * Kernel names and handle identities (struct gf_name_event); argument: enum gf_name_kind.
 * NAME: a handle and its name, at entry; HANDLE: a handle the call makes (read at return),
 * NAMED_HANDLE: one and its name.
 *
 * The calling thread's CUDA device (the `thread_device` map, gf_event.device); argument: the
 * position (1-based) of the call's CUdevice parameter, 0 where it has none. Each takes effect
 * at return, and only when the call returned 0. SET_DEVICE: cudaSetDevice(device);
 * CTX_RETAIN: a context of a device (ctx → device, `ctx_device`), not made current;
 * CTX_CREATE: a new context of a device, pushed as the thread's current one; CTX_SET:
 * cuCtxSetCurrent(ctx) replaces the current context; CTX_PUSH / CTX_POP: the context stack. */
/* The families of GF_API_PROBES, each once: with attach cookies (Linux 5.15+), one program per
 * family serves all its rows (bpf/cudart.bpf.c); tests/unit/producer/contract/test_abi.py checks this list against
 * the table. */
#define GF_API_FAMILIES(X) \
	X(LAUNCH) X(LAUNCH_EX) \
	X(MEMCPY) X(MEMCPY_ASYNC) X(MEMCPY_2D) X(MEMCPY_2D_ASYNC) \
	X(COPY) X(COPY_ASYNC) X(COPY_PEER) X(COPY_PEER_ASYNC) \
	X(MEMSET) X(MEMSET_ASYNC) X(MEMSET_2D) X(MEMSET_2D_ASYNC) X(MEMSET_3D) X(MEMSET_3D_ASYNC) \
	X(ALLOC) X(ALLOC_ASYNC) X(ALLOC_POOL) X(FREE) X(FREE_ASYNC) \
	X(SYNC) X(GRAPH_LAUNCH) X(CAPTURE_BEGIN) X(CAPTURE_END) X(INSTANTIATE)

/* The first api id of the driver layer (records.DRIVER_API_BASE). */
#define GF_DRIVER_API_BASE 200

#define GF_NAME_PROBES(X) \
	X(__cudaRegisterFunction, RUNTIME, NAME, GF_NAME_RUNTIME_FUNCTION) \
	X(__cudaGetKernel, RUNTIME, HANDLE, GF_NAME_RUNTIME_KERNEL) \
	X(cuModuleGetFunction, DRIVER, NAMED_HANDLE, GF_NAME_DRIVER_FUNCTION) \
	X(cuLibraryGetKernel, DRIVER, NAMED_HANDLE, GF_NAME_DRIVER_KERNEL) \
	X(cuKernelGetFunction, DRIVER, HANDLE, GF_NAME_KERNEL_FUNCTION) \
	X(cuModuleLoadData, DRIVER, HANDLE, GF_NAME_MODULE) \
	X(cuModuleLoadDataEx, DRIVER, HANDLE, GF_NAME_MODULE) \
	X(cuLibraryLoadData, DRIVER, HANDLE, GF_NAME_MODULE) \
	X(cudaSetDevice, RUNTIME, SET_DEVICE, 1) \
	X(cuDevicePrimaryCtxRetain, DRIVER, CTX_RETAIN, 2) \
	X(cuCtxCreate_v2, DRIVER, CTX_CREATE, 3) \
	X(cuCtxCreate_v3, DRIVER, CTX_CREATE, 5) \
	X(cuCtxCreate_v4, DRIVER, CTX_CREATE, 4) \
	X(cuCtxSetCurrent, DRIVER, CTX_SET, 0) \
	X(cuCtxPushCurrent_v2, DRIVER, CTX_PUSH, 0) \
	X(cuCtxPopCurrent_v2, DRIVER, CTX_POP, 0)

/* How many devices below the current one `thread_device` remembers per thread (a power of two;
 * pushes not yet popped); a pop deeper than that leaves the thread's device as it is. */
#define GF_CTX_STACK 4

/* The value of `thread_device` (key: pid_tgid): the thread's current device, and the devices
 * current before each cuCtxPushCurrent / cuCtxCreate not yet popped; and the thread's latest
 * call of a probed runtime, by its entry probe (bpf/cudart.bpf.c, "tail calls"): the stack
 * pointer at its entry (0: none to match), and its return address, or GF_RT_IN_FLIGHT while a
 * call with a return probe has not returned. */
struct gf_thread_device {
	__s32 device;
	__u32 depth;
	__s32 below[GF_CTX_STACK];
	__u64 rt_sp;
	__u64 rt_ret;
};

/* gf_thread_device.rt_ret of a runtime call whose return probe has not run yet. */
#define GF_RT_IN_FLIGHT 1

/* The value of the pinned `settled` map (key: pid; producer/contract/abi.py SETTLED_DTYPE), written
 * only by the node agent: of the events the kernel committed for the pid (the pinned
 * `committed` map, key: pid, value: u64), how many the agent saw delivered to Kafka, and how
 * many it dropped and said so in a metrics record Kafka acknowledged. A restarted agent reads a
 * dead one's pair: committed − delivered − dropped is what the dead one never published nor
 * counted (producer/publish/deadagents.py). */
struct gf_settled {
	__u64 delivered;
	__u64 dropped;
};

/* Slots of the `drops` per-CPU array (producer/contract/abi.py: DropSlot). */
enum gf_drop_slot {
	GF_DROP_EVENTS = 0,    /* events lost: not in the `events` ring buffer (full) nor counted
				  in `aggregates` (full too) */
	GF_DROP_LOADER = 1,    /* loader notifications lost */
	GF_DROP_RESERVED = 2,  /* never counted (returns without an entry are not losses) */
	GF_DROP_NAMES = 3,     /* name records lost: the `names` ring buffer was full */
	GF_DROP_FORWARDED = 4, /* not a loss: driver calls a probed runtime made, recorded once */
	GF_DROP_QUIET_LOADS = 5, /* not a loss: dlopens in scope that mapped only quiet files */
	GF_DROP_AGGREGATED = 6, /* not a loss: events counted in `aggregates` instead of recorded
				   in the ring (under pressure over their process's share, or full) */
	GF_DROP_STEPPED = 7,   /* not a loss: calls in scope whose probe the kernel single-steps
				  (attached with GF_COOKIE_STEPPED) */
	GF_DROP_PY_SAMPLES = 8, /* code paths: samples (or a new stack's frames) lost, their
				   ring (`py_samples`, `py_frames`) full */
	GF_DROP_SLOTS = 9,
};

/* In a probe's attach cookie (above the api id and argument: records.Probe.cookie): the probe
 * is at an instruction the kernel single-steps (producer/discover/entrypoint.py), each hit ~15 us on a
 * VM; its calls are counted in drops[GF_DROP_STEPPED]. */
#define GF_COOKIE_STEPPED (1ULL << 63)

/* Under overload (bpf/cudart.bpf.c, "overload"): an event whose details must be shed is
 * counted, exactly, in the `aggregates` table instead, by what every figure of the trace
 * summary and the stream windows is counted by (producer/contract/counting.py): its process, api,
 * kernel (launches: the function handle; graph launches: the exec), shape (launches: grid and
 * block), copy kind / allocation kind / sync scope (dim[0]), device, whether it failed, and the
 * wall-clock slot of GF_AGG_SLOT_NS it was made in. User space reads the entries of the
 * generation (`gen`) the kernel no longer writes, and deletes them (producer/probe/probes.py). */
#define GF_AGG_SLOT_NS 100000000ULL /* 100 ms: a stream window of whole 100 ms holds each slot */
#define GF_AGG_F_FAILED 0x4 /* gf_agg_key.flags: the call returned an error */

struct gf_agg_key {
	__u64 handle; /* launch: function / kernel; graph launch: the exec; free: 1 when the pointer
			 was not null; else 0 */
	__u64 slot;   /* (ts_ns + agg_state.wall_offset_ns) / GF_AGG_SLOT_NS */
	__u32 pid;
	__u16 api;
	__u8 type;    /* enum gf_event_type */
	__u8 flags;   /* GF_F_ASYNC, GF_F_HAS_RESULT, GF_AGG_F_FAILED */
	__u32 dim[6]; /* launch: grid, block; else dim[0] as gf_event has it */
	__s32 device;
	__u32 gen;    /* agg_state.gen when it was counted */
};

struct gf_agg_value {
	__u64 count;
	__u64 bytes;       /* Σ gf_event.bytes (launches, copies, memsets, allocations) */
	__u64 duration_ns; /* Σ gf_event.duration_ns (calls timed at return) */
	__u64 first_ts_ns; /* CLOCK_MONOTONIC, the earliest and latest event's */
	__u64 last_ts_ns;
};

/* The one value of `agg_state` (written by user space): what turns CLOCK_MONOTONIC into the
 * wall clock of the events it writes (the slot), and the generation the kernel counts into. */
struct gf_agg_state {
	__u64 wall_offset_ns;
	__u32 gen;
	__u32 pad;
};

/* What a record of the `names` ring buffer says (struct gf_name_event). */
enum gf_name_kind {
	GF_NAME_RUNTIME_FUNCTION = 1, /* __cudaRegisterFunction: host stub → device name */
	GF_NAME_RUNTIME_KERNEL = 2,   /* __cudaGetKernel: cudaKernel_t handle → host stub (aux) */
	GF_NAME_DRIVER_FUNCTION = 3,  /* cuModuleGetFunction: CUfunction → name; aux: module */
	GF_NAME_DRIVER_KERNEL = 4,    /* cuLibraryGetKernel: CUkernel → name; aux: library */
	GF_NAME_KERNEL_FUNCTION = 5,  /* cuKernelGetFunction: CUfunction → CUkernel (aux) */
	GF_NAME_MODULE = 6,           /* cuModuleLoadData(Ex)/cuLibraryLoadData: handle; aux: image */
};

/* cudaMemcpyKind values, as the runtime defines them. */
enum gf_copy_kind {
	GF_COPY_H2H = 0,
	GF_COPY_H2D = 1,
	GF_COPY_D2H = 2,
	GF_COPY_D2D = 3,
	GF_COPY_DEFAULT = 4,
};

enum gf_alloc_kind {
	GF_ALLOC_DEVICE = 1,
	GF_ALLOC_DEVICE_ASYNC = 2,
	GF_ALLOC_MANAGED = 3,
	GF_ALLOC_HOST_PINNED = 4,
	GF_ALLOC_POOL_ASYNC = 5,
};

enum gf_sync_scope {
	GF_SYNC_STREAM = 1,
	GF_SYNC_DEVICE = 2,
	GF_SYNC_EVENT = 3,
};

/* gf_event.flags */
#define GF_F_HAS_RESULT 0x1 /* result and duration_ns were taken at return */
#define GF_F_ASYNC 0x2      /* the call only enqueued work */
/* 0x40 (F_CAPTURED) and 0x80 (F_BYTES_KNOWN) are set by user space only. */

/* graph_capture: dim[0] */
#define GF_CAPTURE_BEGIN 1
#define GF_CAPTURE_END 2

struct gf_event {
	__u64 ts_ns;       /* CLOCK_MONOTONIC at entry (bpf_ktime_get_ns) */
	__u32 pid;         /* tgid */
	__u32 tid;
	__u16 api;         /* enum gf_api */
	__u8 type;         /* enum gf_event_type */
	__u8 flags;        /* GF_F_* */
	__s32 result;      /* cudaError_t, valid with GF_F_HAS_RESULT */
	__u64 duration_ns; /* entry to return, valid with GF_F_HAS_RESULT */
	__u64 handle;      /* launch: function/kernel handle; memcpy/memset: dst;
			      alloc/free: pointer; sync: stream or event;
			      graph_launch, graph_instantiate: graph exec;
			      graph_capture: the graph (at the end) */
	__u64 stream;
	__u64 bytes;       /* memcpy/memset/alloc: bytes; launch: dynamic shared memory;
			      graph_instantiate: the graph */
	__u32 dim[6];      /* launch: grid x,y,z, block x,y,z;
			      memcpy: [0] enum gf_copy_kind; alloc: [0] enum gf_alloc_kind;
			      sync: [0] enum gf_sync_scope */
	__s32 device;      /* the calling thread's CUDA device (ordinal in its process; 0 until
			      it sets one: thread_device) */
	__u32 reserved;
};

/* A slot of a CPU's event buffer (bpf/cudart.bpf.c GF_CPU_SLOTS; user space maps the buffers:
 * producer/probe/cpubuffers.py). `committed`: the slot's position (slots taken on its CPU
 * before it) + 1 once `ev` is whole, with GF_SLOT_DISCARDED where it was freed empty. */
#define GF_SLOT_DISCARDED (1ULL << 63)
struct gf_slot {
	__u64 committed;
	struct gf_event ev;
};

/* A CPU's buffer's positions: `head`, slots taken by programs; `tail`, slots freed by the
 * reader (the only field user space writes), on a cache line of its own. */
struct gf_cpu_head {
	__u64 head;
	__u64 pad0[7];
	__u64 tail;
	__u64 pad1[7];
};

/* A kernel name or a handle alias, from the `names` ring buffer (strings do not fit
 * in gf_event). Read by user space before the events that use it are decoded. */
#define GF_NAME_MAX 512
#define GF_NAME_F_TRUNCATED 0x1 /* the name filled the buffer: it was cut */

struct gf_name_event {
	__u64 ts_ns;
	__u32 pid;
	__u16 kind;  /* enum gf_name_kind */
	__u16 flags; /* GF_NAME_F_* */
	__u64 handle;
	__u64 aux;
	char name[GF_NAME_MAX]; /* NUL-terminated; empty for aliases */
};

/* Text ranges of the runtime files a process maps (user space fills `runtime_text`): a
 * driver call whose return address lies in one was made by a probed runtime for an
 * operation already recorded, and is not recorded again. */
#define GF_MAX_RUNTIME_RANGES 8

struct gf_text_ranges {
	__u64 start[GF_MAX_RUNTIME_RANGES];
	__u64 end[GF_MAX_RUNTIME_RANGES];
};

/* The key of the `quiet_files` map (producer/contract/abi.py FILE_ID_DTYPE): a library file as the
 * kernel knows it — its superblock's dev_t (MAJOR << 20 | MINOR), inode number, size and change
 * time (what stat(2) says; a file written since is another key) — that user space found to
 * define nothing gpuflight probes. A dlopen whose new executable mappings are all of such
 * files is neither held nor notified (bpf/cudart.bpf.c, GF_QUIET_LOADS). */
struct gf_file_id {
	__u64 dev;
	__u64 ino;
	__s64 size;
	__s64 ctime_ns;
};

/* A process whose dynamic loader changed its link map (dlopen, start-up). */
/* Why a loader event was sent (gf_loader_event.reason). */
enum gf_loader_reason {
	GF_LOADER_MAPPED = 0, /* the link map changed, or an exec: rescan the process */
	GF_LOADER_LISTEN = 1, /* a first listen(2) in scope: the HTTP capture is wanted */
	GF_LOADER_EXIT = 2,   /* a walked Python process exits: its new stacks are to be read */
};

struct gf_loader_event {
	__u32 pid;
	__u16 held;   /* 1 when the probe stopped the process (SIGSTOP) for us */
	__u16 reason; /* enum gf_loader_reason */
	__u64 ts_ns;  /* CLOCK_MONOTONIC when it did: how long a hold lasts is measured from it */
};

#endif
