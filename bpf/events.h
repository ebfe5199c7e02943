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
			      graph_launch: graph exec */
	__u64 stream;
	__u64 bytes;       /* memcpy/memset/alloc: bytes; launch: dynamic shared memory */
	__u32 dim[6];      /* launch: grid x,y,z, block x,y,z;
			      memcpy: [0] enum gf_copy_kind; alloc: [0] enum gf_alloc_kind;
			      sync: [0] enum gf_sync_scope */
};

/* A process whose dynamic loader changed its link map (dlopen, start-up). */
struct gf_loader_event {
	__u32 pid;
	__u32 held; /* 1 when the probe stopped the process (SIGSTOP) for us */
};

#endif
