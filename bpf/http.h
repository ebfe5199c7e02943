/* gpuflight: the contract of the HTTP capture (bpf/http.bpf.h) with user space.
 *
 * One record per accepted connection, per read or write on it, and per close, on the
 * `http_events` ring buffer: a fixed part, then `head_len` bytes of data (records are as long
 * as what they carry). producer/http/abi.py mirrors this file; tests/system/test_http_capture.py
 * checks that the mirror matches.
 */
#ifndef GPUFLIGHT_HTTP_H
#define GPUFLIGHT_HTTP_H

/* The syscall a record comes from. Values are part of the contract: append only. */
enum gf_http_op {
	GF_HTTP_ACCEPT = 1,   /* a server-side TCP connection: ret is its fd */
	GF_HTTP_CLOSE = 2,    /* close() of a tracked fd */
	GF_HTTP_READ = 3,
	GF_HTTP_RECVFROM = 4,
	GF_HTTP_RECVMSG = 5,
	GF_HTTP_READV = 6,
	GF_HTTP_WRITE = 7,
	GF_HTTP_SENDTO = 8,
	GF_HTTP_SENDMSG = 9,
	GF_HTTP_WRITEV = 10,
	GF_HTTP_SENDFILE = 11, /* bytes only: the data is in a file */
	GF_HTTP_UNIX = 12,     /* an accepted unix socket: not tracked, reported once per process */
};

/* Ops from GF_HTTP_READ to GF_HTTP_READV carry data in (the request side), from
 * GF_HTTP_WRITE to GF_HTTP_SENDFILE data out. */

/* gf_http_event.flags */
#define GF_HTTP_F_FAULT 0x1       /* the data could not be read from the process: head is short */
#define GF_HTTP_F_MORE_IOV 0x2    /* the data spans more iovecs than are read: no tail */
#define GF_HTTP_F_NO_WALK 0x4     /* accept: the socket could not be inspected (family from the
				     address the caller passed, or 0 when it passed none) */

/* What each record may carry: the first GF_HTTP_HEAD bytes (a cflag, a power of two), and the
 * last GF_HTTP_TAIL bytes when the data is longer than the head (a chunked body's end). */
#define GF_HTTP_TAIL 16
#define GF_HTTP_MAX_IOV 8

struct gf_http_event {
	__u64 ts_enter_ns; /* CLOCK_MONOTONIC at the syscall's entry */
	__u64 ts_exit_ns;  /* and at its return */
	__u64 conn_id;     /* the connection: ts_exit_ns of its accept (unique per host) */
	__u64 offset;      /* bytes of this direction before this record's */
	__s64 ret;         /* the syscall's return: bytes moved; accept: the new fd */
	__u32 pid;         /* tgid */
	__u32 tid;
	__s32 fd;
	__u16 op;          /* enum gf_http_op */
	__u16 flags;       /* GF_HTTP_F_* */
	__u16 head_len;    /* bytes of data after this struct */
	__u16 tail_len;    /* bytes of tail[] that are valid */
	__u16 family;      /* accept: AF_INET, AF_INET6 (AF_UNIX for GF_HTTP_UNIX) */
	__u16 lport;       /* accept: the server's port */
	__u16 rport;       /* accept: the peer's port */
	__u16 pad;
	__u8 raddr[16];    /* accept: the peer's address (IPv4 in the first 4 bytes) */
	__u8 tail[GF_HTTP_TAIL];
	/* __u8 head[head_len] follows */
};

/* A tracked connection (the `http_conns` map, keyed by struct gf_http_conn_key). User space may
 * add connections accepted before the program was loaded (GF_HTTP_C_SEEDED); their byte counts
 * start at GF_HTTP_SEED_OFFSET, so that their records say they join a stream mid-way. */
#define GF_HTTP_C_SEEDED 0x1
#define GF_HTTP_SEED_OFFSET (1ULL << 62)

struct gf_http_conn_key {
	__u32 pid;
	__s32 fd;
};

struct gf_http_conn {
	__u64 conn_id;
	__u64 bytes_in;   /* offsets of the next record, by direction */
	__u64 bytes_out;
	__u16 family;
	__u16 lport;
	__u16 flags;      /* GF_HTTP_C_* */
	__u16 pad;
};

/* Slots of the `http_drops` per-CPU array. */
#define GF_HTTP_DROP_RING 0     /* a record lost: the ring buffer was full */
#define GF_HTTP_DROP_CONNS 1    /* an accepted connection not tracked: the table was full */
#define GF_HTTP_DROP_FAULT 2    /* data that could not be read (the record has GF_HTTP_F_FAULT) */
#define GF_HTTP_NO_WALK 3       /* not a loss: accepts whose socket could not be inspected */
#define GF_HTTP_SLOTS 4

#endif
