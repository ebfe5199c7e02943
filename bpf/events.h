/* gpuflight: the one contract between the BPF programs and user space.
 *
 * Every event is one fixed-size `struct gf_event`, so a span of the ring buffer
 * is a regular array that user space decodes in bulk (producer/records.py mirrors
 * this file; tests/test_records.py checks that the mirror matches).
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

/* The function that was called. Values are part of the contract: append only. */
enum gf_api {
	GF_API_cudaLaunchKernel = 1,
	GF_API_cudaLaunchKernel_ptsz = 2,
	GF_API_cudaLaunchKernelExC = 3,
	GF_API_cudaLaunchKernelExC_ptsz = 4,
	GF_API_cudaLaunchCooperativeKernel = 5,
	GF_API_cudaLaunchCooperativeKernel_ptsz = 6,

	GF_API_cudaMemcpy = 20,
	GF_API_cudaMemcpy_ptds = 21,
	GF_API_cudaMemcpyAsync = 22,
	GF_API_cudaMemcpyAsync_ptsz = 23,
	GF_API_cudaMemcpyPeer = 24,
	GF_API_cudaMemcpyPeerAsync = 25,
	GF_API_cudaMemcpy2D = 26,
	GF_API_cudaMemcpy2D_ptds = 27,
	GF_API_cudaMemcpy2DAsync = 28,
	GF_API_cudaMemcpy2DAsync_ptsz = 29,

	GF_API_cudaMemset = 40,
	GF_API_cudaMemset_ptds = 41,
	GF_API_cudaMemsetAsync = 42,
	GF_API_cudaMemsetAsync_ptsz = 43,
	GF_API_cudaMemset2D = 44,
	GF_API_cudaMemset2D_ptds = 45,
	GF_API_cudaMemset2DAsync = 46,
	GF_API_cudaMemset2DAsync_ptsz = 47,
	GF_API_cudaMemset3D = 48,
	GF_API_cudaMemset3D_ptds = 49,
	GF_API_cudaMemset3DAsync = 50,
	GF_API_cudaMemset3DAsync_ptsz = 51,

	GF_API_cudaMalloc = 60,
	GF_API_cudaMallocAsync = 61,
	GF_API_cudaMallocAsync_ptsz = 62,
	GF_API_cudaMallocManaged = 63,
	GF_API_cudaMallocHost = 64,
	GF_API_cudaHostAlloc = 65,
	GF_API_cudaMallocFromPoolAsync = 66,
	GF_API_cudaMallocFromPoolAsync_ptsz = 67,

	GF_API_cudaFree = 80,
	GF_API_cudaFreeAsync = 81,
	GF_API_cudaFreeAsync_ptsz = 82,
	GF_API_cudaFreeHost = 83,

	GF_API_cudaStreamSynchronize = 100,
	GF_API_cudaStreamSynchronize_ptsz = 101,
	GF_API_cudaDeviceSynchronize = 102,
	GF_API_cudaEventSynchronize = 103,

	GF_API_cudaGraphLaunch = 120,
	GF_API_cudaGraphLaunch_ptsz = 121,

	GF_API_cudaStreamBeginCapture = 130,
	GF_API_cudaStreamBeginCapture_ptsz = 131,
	GF_API_cudaStreamEndCapture = 132,
	GF_API_cudaStreamEndCapture_ptsz = 133,
	GF_API_cudaGraphInstantiate = 134,
	GF_API_cudaGraphInstantiateWithFlags = 135,
	GF_API_cudaGraphInstantiateWithParams = 136,
	GF_API_cudaGraphInstantiateWithParams_ptsz = 137,

	/* The driver API (libcuda): ids from 200 up (records.DRIVER_API_BASE). */
	GF_API_cuLaunchKernel = 200,
	GF_API_cuLaunchKernel_ptsz = 201,
	GF_API_cuLaunchKernelEx = 202,
	GF_API_cuLaunchKernelEx_ptsz = 203,
	GF_API_cuLaunchCooperativeKernel = 204,
	GF_API_cuLaunchCooperativeKernel_ptsz = 205,

	GF_API_cuMemcpyHtoD_v2 = 220,
	GF_API_cuMemcpyHtoD_v2_ptds = 221,
	GF_API_cuMemcpyDtoH_v2 = 222,
	GF_API_cuMemcpyDtoH_v2_ptds = 223,
	GF_API_cuMemcpyDtoD_v2 = 224,
	GF_API_cuMemcpyDtoD_v2_ptds = 225,
	GF_API_cuMemcpyHtoDAsync_v2 = 226,
	GF_API_cuMemcpyHtoDAsync_v2_ptsz = 227,
	GF_API_cuMemcpyDtoHAsync_v2 = 228,
	GF_API_cuMemcpyDtoHAsync_v2_ptsz = 229,
	GF_API_cuMemcpyDtoDAsync_v2 = 230,
	GF_API_cuMemcpyDtoDAsync_v2_ptsz = 231,
	GF_API_cuMemcpy = 232,
	GF_API_cuMemcpy_ptds = 233,
	GF_API_cuMemcpyAsync = 234,
	GF_API_cuMemcpyAsync_ptsz = 235,
	GF_API_cuMemcpyPeer = 236,
	GF_API_cuMemcpyPeer_ptds = 237,
	GF_API_cuMemcpyPeerAsync = 238,
	GF_API_cuMemcpyPeerAsync_ptsz = 239,

	GF_API_cuMemsetD8_v2 = 250,
	GF_API_cuMemsetD8_v2_ptds = 251,
	GF_API_cuMemsetD16_v2 = 252,
	GF_API_cuMemsetD16_v2_ptds = 253,
	GF_API_cuMemsetD32_v2 = 254,
	GF_API_cuMemsetD32_v2_ptds = 255,
	GF_API_cuMemsetD8Async = 256,
	GF_API_cuMemsetD8Async_ptsz = 257,
	GF_API_cuMemsetD16Async = 258,
	GF_API_cuMemsetD16Async_ptsz = 259,
	GF_API_cuMemsetD32Async = 260,
	GF_API_cuMemsetD32Async_ptsz = 261,

	GF_API_cuMemAlloc_v2 = 280,
	GF_API_cuMemAllocAsync = 281,
	GF_API_cuMemAllocAsync_ptsz = 282,
	GF_API_cuMemAllocManaged = 283,
	GF_API_cuMemAllocHost_v2 = 284,
	GF_API_cuMemHostAlloc = 285,
	GF_API_cuMemFree_v2 = 290,
	GF_API_cuMemFreeAsync = 291,
	GF_API_cuMemFreeAsync_ptsz = 292,
	GF_API_cuMemFreeHost = 293,

	GF_API_cuStreamSynchronize = 300,
	GF_API_cuStreamSynchronize_ptsz = 301,
	GF_API_cuCtxSynchronize = 302,
	GF_API_cuEventSynchronize = 303,

	GF_API_cuGraphLaunch = 320,
	GF_API_cuGraphLaunch_ptsz = 321,
	GF_API_cuStreamBeginCapture_v2 = 330,
	GF_API_cuStreamBeginCapture_v2_ptsz = 331,
	GF_API_cuStreamEndCapture = 332,
	GF_API_cuStreamEndCapture_ptsz = 333,
	GF_API_cuGraphInstantiateWithFlags = 334,
	GF_API_cuGraphInstantiateWithParams = 335,
	GF_API_cuGraphInstantiateWithParams_ptsz = 336,
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

/* A process whose dynamic loader changed its link map (dlopen, start-up). */
struct gf_loader_event {
	__u32 pid;
	__u32 held; /* 1 when the probe stopped the process (SIGSTOP) for us */
};

#endif
