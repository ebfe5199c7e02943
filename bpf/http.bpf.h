/* gpuflight: HTTP/1.1 requests seen from the kernel's side, on syscall tracepoints.
 *
 * Which fds are server-side TCP connections: the fds that accept()/accept4() returns to a
 * process in scope, when the socket is TCP (the fd is walked to its struct sock with offsets
 * user space reads from the kernel's BTF; without them, the address family the caller got
 * back decides). For those fds every read and write that moved bytes is one record on the
 * `http_events` ring: pid, tid, fd, the connection, entry and exit times, the bytes moved, the
 * stream offset, the first GF_HTTP_HEAD bytes and the last GF_HTTP_TAIL bytes (bpf/http.h).
 * user space (producer/http/parser.py) turns them into requests.
 *
 * Scope: with GF_FILTER_PIDS, the CUDA probes' `scope_pids`; node-wide, `http_pids`, which
 * user space fills with the processes that map a CUDA library. Scope is checked at accept;
 * reads and writes look up their (pid, fd) in `http_conns` only, so user space removes the
 * connections of a process it takes out of scope.
 *
 * This file is meant to be part of the program bcc compiles (bpf/cudart.bpf.c, or
 * bpf/http_proto.bpf.c on its own). bcc rewrites map calls and tracepoint arguments only in
 * the file it compiles, not in what that file #includes: producer/probe/bpfsource.py inlines this
 * header into the source before bcc sees it. The includer defines `scope_pids` and
 * GF_FILTER_PIDS.
 *
 * Build-time parameters (cflags):
 *   GF_HTTP_HEAD           bytes of data kept from each read or write (a power of two)
 *   GF_HTTP_RINGBUF_PAGES  size of `http_events` in pages (a power of two)
 *   GF_HTTP_MAX_CONNS      connections tracked at once (least recently used go first)
 *   GF_HTTP_MAX_CALLS      syscalls on tracked fds in progress at once (threads blocked in
 *                          a read count); past it the oldest are forgotten and their data lost
 *                          unseen (the stream offsets do not show it)
 *   GF_HTTP_OFF_*          struct offsets for the fd → socket walk (producer/probe/btf.py)
 */
#include "http.h"

#ifndef GF_HTTP_HEAD
#define GF_HTTP_HEAD 1024
#endif
#ifndef GF_HTTP_RINGBUF_PAGES
#define GF_HTTP_RINGBUF_PAGES 1024
#endif
#ifndef GF_HTTP_MAX_CONNS
#define GF_HTTP_MAX_CONNS 65536
#endif
#ifndef GF_HTTP_MAX_CALLS
#define GF_HTTP_MAX_CALLS 65536
#endif

#if (GF_HTTP_HEAD & (GF_HTTP_HEAD - 1)) || GF_HTTP_HEAD < 64 || GF_HTTP_HEAD > 8192
#error "GF_HTTP_HEAD must be a power of two from 64 to 8192"
#endif

#define GF_AF_UNIX 1
#define GF_AF_INET 2
#define GF_AF_INET6 10
#define GF_IPPROTO_TCP 6
#define GF_IPPROTO_MPTCP 262
#define GF_SOCK_STREAM 1
#define GF_S_IFMT 00170000
#define GF_S_IFSOCK 0140000
#define GF_MSG_PEEK 2

BPF_RINGBUF_OUTPUT(http_events, GF_HTTP_RINGBUF_PAGES);
BPF_PERCPU_ARRAY(http_drops, u64, GF_HTTP_SLOTS);
/* Node-wide scope: the processes that map a CUDA library (filled by user space). */
BPF_HASH(http_pids, u32, u8, 65536);
BPF_TABLE("lru_hash", struct gf_http_conn_key, struct gf_http_conn, http_conns,
	  GF_HTTP_MAX_CONNS);
/* Processes whose unix-socket accept was reported already (once per process). */
BPF_TABLE("lru_hash", u32, u8, http_unix_seen, 4096);

/* A syscall on a tracked fd, between its entry and its exit (per thread). */
struct gf_http_call {
	u64 ts;
	u64 buf; /* the buffer; readv/writev: the iovec array; recvmsg/sendmsg: the msghdr;
		    accept: the address the caller passed */
	u64 aux; /* readv/writev: the iovec count */
	s32 fd;
	u16 op;
	u16 pad;
};
/* A thread blocked in a read of a tracked connection holds an entry for as long as it waits
 * (an idle keep-alive connection of a thread-per-connection server): sized for that. */
BPF_TABLE("lru_hash", u64, struct gf_http_call, http_calls, GF_HTTP_MAX_CALLS);

/* A record is built here, then copied to the ring at its real length. The head has twice the
 * room it uses so that the verifier sees every copy in bounds. */
struct gf_http_scratch {
	struct gf_http_event ev;
	u8 head[2 * GF_HTTP_HEAD];
};
BPF_PERCPU_ARRAY(http_scratch, struct gf_http_scratch, 1);

struct gf_iovec {
	u64 base;
	u64 len;
};

/* Keeps the compiler from folding a bound the verifier has to see (libbpf's barrier_var). */
#define gf_http_barrier(var) asm volatile("" : "+r"(var))

static __always_inline void gf_http_count(u32 slot)
{
	u64 *n = http_drops.lookup(&slot);
	if (n)
		*n += 1;
}

static __always_inline int gf_http_in_scope(u32 pid)
{
#if GF_FILTER_PIDS
	return scope_pids.lookup(&pid) != 0;
#else
	return http_pids.lookup(&pid) != 0;
#endif
}

static __always_inline int gf_http_enter(u16 op, s32 fd, u64 buf, u64 aux)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32;
	if (op == GF_HTTP_ACCEPT) {
		if (!gf_http_in_scope(pid))
			return 0;
	} else {
		/* One lookup for every process: only processes in scope have tracked fds (user
		 * space drops a process's connections when it leaves the scope). */
		struct gf_http_conn_key key = {};
		key.pid = pid;
		key.fd = fd;
		if (!http_conns.lookup(&key))
			return 0;
	}
	struct gf_http_call call = {};
	call.ts = bpf_ktime_get_ns();
	call.buf = buf;
	call.aux = aux;
	call.fd = fd;
	call.op = op;
	http_calls.update(&id, &call);
	return 0;
}

static __always_inline struct gf_http_scratch *gf_http_record(u64 id, s32 fd, u16 op)
{
	u32 zero = 0;
	struct gf_http_scratch *s = http_scratch.lookup(&zero);
	if (!s)
		return 0;
	__builtin_memset(&s->ev, 0, sizeof(s->ev));
	s->ev.pid = id >> 32;
	s->ev.tid = (u32)id;
	s->ev.fd = fd;
	s->ev.op = op;
	return s;
}

static __always_inline void gf_http_submit(struct gf_http_scratch *s, u64 head_len)
{
	gf_http_barrier(head_len);
	if (head_len > GF_HTTP_HEAD)
		head_len = GF_HTTP_HEAD;
	s->ev.head_len = head_len;
	/* No wake-up: the reader drains on its own schedule. */
	if (http_events.ringbuf_output(s, sizeof(struct gf_http_event) + head_len,
				       BPF_RB_NO_WAKEUP))
		gf_http_count(GF_HTTP_DROP_RING);
}

/* ---- accept: which fds are server-side TCP connections ------------------ */

struct gf_http_peer {
	u16 family;
	u16 lport;
	u16 rport;
	u16 protocol;
	u16 type;
	u16 walked;
	u8 raddr[16];
};

static __always_inline void gf_http_walk(s32 fd, struct gf_http_peer *p)
{
#ifdef GF_HTTP_OFF_TASK_FILES
	/* task->files->fdt->fd[fd] → file; a socket's inode, then file->private_data → socket,
	 * socket->sk → the struct sock (whose first member is its sock_common). */
	u8 *task = (u8 *)bpf_get_current_task();
	u8 *files = 0, *fdt = 0, *fds = 0, *file = 0, *inode = 0, *sock = 0, *sk = 0;
	u32 max_fds = 0;
	u16 mode = 0, dport = 0;
	if (bpf_probe_read_kernel(&files, sizeof(files), task + GF_HTTP_OFF_TASK_FILES) || !files)
		return;
	if (bpf_probe_read_kernel(&fdt, sizeof(fdt), files + GF_HTTP_OFF_FILES_FDT) || !fdt)
		return;
	if (bpf_probe_read_kernel(&max_fds, sizeof(max_fds), fdt + GF_HTTP_OFF_FDT_MAX_FDS) ||
	    fd < 0 || (u32)fd >= max_fds)
		return;
	if (bpf_probe_read_kernel(&fds, sizeof(fds), fdt + GF_HTTP_OFF_FDT_FD) || !fds)
		return;
	if (bpf_probe_read_kernel(&file, sizeof(file), fds + 8 * (u64)(u32)fd) || !file)
		return;
	if (bpf_probe_read_kernel(&inode, sizeof(inode), file + GF_HTTP_OFF_FILE_INODE) || !inode)
		return;
	if (bpf_probe_read_kernel(&mode, sizeof(mode), inode + GF_HTTP_OFF_INODE_MODE) ||
	    (mode & GF_S_IFMT) != GF_S_IFSOCK)
		return;
	if (bpf_probe_read_kernel(&sock, sizeof(sock), file + GF_HTTP_OFF_FILE_PRIVATE) || !sock)
		return;
	if (bpf_probe_read_kernel(&sk, sizeof(sk), sock + GF_HTTP_OFF_SOCKET_SK) || !sk)
		return;
	if (bpf_probe_read_kernel(&p->family, 2, sk + GF_HTTP_OFF_SK_FAMILY) ||
	    bpf_probe_read_kernel(&p->type, 2, sk + GF_HTTP_OFF_SK_TYPE) ||
	    bpf_probe_read_kernel(&p->protocol, 2, sk + GF_HTTP_OFF_SK_PROTOCOL) ||
	    bpf_probe_read_kernel(&p->lport, 2, sk + GF_HTTP_OFF_SK_NUM) ||
	    bpf_probe_read_kernel(&dport, 2, sk + GF_HTTP_OFF_SK_DPORT))
		return;
	p->rport = (dport >> 8) | (dport << 8);
	if (p->family == GF_AF_INET)
		bpf_probe_read_kernel(p->raddr, 4, sk + GF_HTTP_OFF_SK_DADDR);
	else if (p->family == GF_AF_INET6)
		bpf_probe_read_kernel(p->raddr, 16, sk + GF_HTTP_OFF_SK_V6_DADDR);
	p->walked = 1;
#endif
}

/* Without the walk: the address accept() wrote back, when the caller passed a buffer. */
static __always_inline void gf_http_peer_from_address(u64 addr, struct gf_http_peer *p)
{
	u16 family = 0, port = 0;
	if (!addr || bpf_probe_read_user(&family, sizeof(family), (void *)addr))
		return;
	p->family = family;
	if (family == GF_AF_INET || family == GF_AF_INET6) {
		p->type = GF_SOCK_STREAM;
		p->protocol = GF_IPPROTO_TCP; /* accept() on an inet socket: TCP (or MPTCP) */
		bpf_probe_read_user(&port, sizeof(port), (void *)(addr + 2));
		p->rport = (port >> 8) | (port << 8);
		if (family == GF_AF_INET)
			bpf_probe_read_user(p->raddr, 4, (void *)(addr + 4));
		else
			bpf_probe_read_user(p->raddr, 16, (void *)(addr + 8));
	}
}

static __always_inline int gf_http_accepted(u64 id, struct gf_http_call *c, long ret)
{
	if (ret < 0)
		return 0;
	u32 pid = id >> 32;
	s32 fd = ret;
	struct gf_http_peer peer = {};
	gf_http_walk(fd, &peer);
	if (!peer.walked) {
		gf_http_count(GF_HTTP_NO_WALK);
		gf_http_peer_from_address(c->buf, &peer);
	}
	if (peer.family == GF_AF_UNIX) {
		u8 one = 1;
		if (http_unix_seen.lookup(&pid))
			return 0;
		http_unix_seen.update(&pid, &one);
	} else if (peer.family == GF_AF_INET || peer.family == GF_AF_INET6) {
		if (peer.type != GF_SOCK_STREAM ||
		    (peer.protocol != GF_IPPROTO_TCP && peer.protocol != GF_IPPROTO_MPTCP))
			return 0;
	} else if (peer.walked || peer.family != 0) {
		return 0; /* another family: not ours */
	}
	/* family 0: neither walk nor address said; tracked, and user space decides. */
	struct gf_http_scratch *s = gf_http_record(id, fd, GF_HTTP_ACCEPT);
	if (!s)
		return 0;
	s->ev.ts_enter_ns = c->ts;
	s->ev.ts_exit_ns = bpf_ktime_get_ns();
	s->ev.ret = ret;
	s->ev.family = peer.family;
	s->ev.lport = peer.lport;
	s->ev.rport = peer.rport;
	s->ev.flags = peer.walked ? 0 : GF_HTTP_F_NO_WALK;
	__builtin_memcpy(s->ev.raddr, peer.raddr, sizeof(peer.raddr));
	if (peer.family == GF_AF_UNIX) {
		s->ev.op = GF_HTTP_UNIX;
		gf_http_submit(s, 0);
		return 0;
	}
	s->ev.conn_id = s->ev.ts_exit_ns;
	struct gf_http_conn_key key = {};
	key.pid = pid;
	key.fd = fd;
	struct gf_http_conn conn = {};
	conn.conn_id = s->ev.conn_id;
	conn.family = peer.family;
	conn.lport = peer.lport;
	if (http_conns.update(&key, &conn)) {
		gf_http_count(GF_HTTP_DROP_CONNS);
		return 0;
	}
	gf_http_submit(s, 0);
	return 0;
}

/* ---- reads and writes --------------------------------------------------- */

/* The data of a plain buffer: its head, and its tail when it is longer. */
static __always_inline u32 gf_http_copy_buf(struct gf_http_scratch *s, u64 buf, s64 ret)
{
	u64 n = ret > GF_HTTP_HEAD ? GF_HTTP_HEAD : (u64)ret;
	gf_http_barrier(n);
	if (n > GF_HTTP_HEAD)
		n = GF_HTTP_HEAD;
	if (bpf_probe_read_user(s->head, n, (void *)buf)) {
		s->ev.flags |= GF_HTTP_F_FAULT;
		gf_http_count(GF_HTTP_DROP_FAULT);
		return 0;
	}
	if (ret > GF_HTTP_HEAD &&
	    !bpf_probe_read_user(s->ev.tail, GF_HTTP_TAIL, (void *)(buf + ret - GF_HTTP_TAIL)))
		s->ev.tail_len = GF_HTTP_TAIL;
	return n;
}

/* The data of an iovec array: the head from the first iovecs, the tail from the iovec where
 * the data ends (what of the last GF_HTTP_TAIL bytes lies in it). */
static __always_inline u32 gf_http_copy_iov(struct gf_http_scratch *s, u64 iov, u64 count,
					    s64 ret)
{
	u32 off = 0;
	u64 seen = 0;
#pragma unroll
	for (int i = 0; i < GF_HTTP_MAX_IOV; i++) {
		if (i >= count || seen >= (u64)ret)
			break;
		struct gf_iovec v = {};
		if (bpf_probe_read_user(&v, sizeof(v), (void *)(iov + 16 * i))) {
			s->ev.flags |= GF_HTTP_F_FAULT;
			gf_http_count(GF_HTTP_DROP_FAULT);
			return off;
		}
		u64 len = v.len;
		if (len > (u64)ret - seen)
			len = (u64)ret - seen;
		if (off < GF_HTTP_HEAD) {
			u64 n = GF_HTTP_HEAD - off;
			if (n > len)
				n = len;
			gf_http_barrier(n);
			if (n > GF_HTTP_HEAD)
				n = GF_HTTP_HEAD;
			u64 at = off;
			gf_http_barrier(at);
			at &= GF_HTTP_HEAD - 1;
			if (bpf_probe_read_user(s->head + at, n, (void *)v.base)) {
				s->ev.flags |= GF_HTTP_F_FAULT;
				gf_http_count(GF_HTTP_DROP_FAULT);
				return off;
			}
			off += n;
		}
		seen += len;
		if (seen >= (u64)ret && ret > GF_HTTP_HEAD) {
			u64 t = len < GF_HTTP_TAIL ? len : GF_HTTP_TAIL;
			gf_http_barrier(t);
			if (t > GF_HTTP_TAIL)
				t = GF_HTTP_TAIL;
			if (!bpf_probe_read_user(s->ev.tail, t, (void *)(v.base + len - t)))
				s->ev.tail_len = t;
		}
	}
	if (seen < (u64)ret)
		s->ev.flags |= GF_HTTP_F_MORE_IOV;
	return off;
}

static __always_inline int gf_http_exit(long ret)
{
	u64 id = bpf_get_current_pid_tgid();
	struct gf_http_call *found = http_calls.lookup(&id);
	if (!found)
		return 0;
	struct gf_http_call c = *found;
	http_calls.delete(&id);
	if (c.op == GF_HTTP_ACCEPT)
		return gf_http_accepted(id, &c, ret);
	/* Errors (EAGAIN above all) moved nothing; a read of 0 is the peer's end of stream. */
	if (ret < 0 || (ret == 0 && c.op >= GF_HTTP_WRITE))
		return 0;
	struct gf_http_conn_key key = {};
	key.pid = id >> 32;
	key.fd = c.fd;
	struct gf_http_conn *conn = http_conns.lookup(&key);
	if (!conn)
		return 0; /* closed by another thread meanwhile */
	struct gf_http_scratch *s = gf_http_record(id, c.fd, c.op);
	if (!s)
		return 0;
	s->ev.ts_enter_ns = c.ts;
	s->ev.ts_exit_ns = bpf_ktime_get_ns();
	s->ev.conn_id = conn->conn_id;
	s->ev.ret = ret;
	/* Offsets advance even when the record is lost, so user space sees the gap. */
	if (c.op <= GF_HTTP_READV)
		s->ev.offset = __sync_fetch_and_add(&conn->bytes_in, ret);
	else
		s->ev.offset = __sync_fetch_and_add(&conn->bytes_out, ret);
	u32 head = 0;
	if (c.op == GF_HTTP_READ || c.op == GF_HTTP_RECVFROM || c.op == GF_HTTP_WRITE ||
	    c.op == GF_HTTP_SENDTO) {
		head = gf_http_copy_buf(s, c.buf, ret);
	} else if (c.op == GF_HTTP_READV || c.op == GF_HTTP_WRITEV) {
		head = gf_http_copy_iov(s, c.buf, c.aux, ret);
	} else if (c.op == GF_HTTP_RECVMSG || c.op == GF_HTTP_SENDMSG) {
		struct gf_iovec msg_iov = {}; /* msghdr: msg_iov at 16, msg_iovlen at 24 */
		if (bpf_probe_read_user(&msg_iov, sizeof(msg_iov), (void *)(c.buf + 16)))
			s->ev.flags |= GF_HTTP_F_FAULT;
		else
			head = gf_http_copy_iov(s, msg_iov.base, msg_iov.len, ret);
	}
	gf_http_submit(s, head);
	return 0;
}

static __always_inline int gf_http_close(s32 fd)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32;
	struct gf_http_conn_key key = {};
	key.pid = pid;
	key.fd = fd;
	struct gf_http_conn *conn = http_conns.lookup(&key);
	if (!conn)
		return 0;
	struct gf_http_scratch *s = gf_http_record(id, fd, GF_HTTP_CLOSE);
	if (s) {
		s->ev.ts_enter_ns = bpf_ktime_get_ns();
		s->ev.ts_exit_ns = s->ev.ts_enter_ns;
		s->ev.conn_id = conn->conn_id;
		s->ev.offset = conn->bytes_in;
		s->ev.ret = conn->bytes_out;
		gf_http_submit(s, 0);
	}
	http_conns.delete(&key);
	return 0;
}

/* ---- the tracepoints ---------------------------------------------------- */

TRACEPOINT_PROBE(syscalls, sys_enter_accept4)
{
	return gf_http_enter(GF_HTTP_ACCEPT, args->fd, (u64)args->upeer_sockaddr, 0);
}
TRACEPOINT_PROBE(syscalls, sys_exit_accept4) { return gf_http_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_accept)
{
	return gf_http_enter(GF_HTTP_ACCEPT, args->fd, (u64)args->upeer_sockaddr, 0);
}
TRACEPOINT_PROBE(syscalls, sys_exit_accept) { return gf_http_exit(args->ret); }

TRACEPOINT_PROBE(syscalls, sys_enter_read)
{
	return gf_http_enter(GF_HTTP_READ, args->fd, (u64)args->buf, 0);
}
TRACEPOINT_PROBE(syscalls, sys_exit_read) { return gf_http_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_recvfrom)
{
	if (args->flags & GF_MSG_PEEK)
		return 0; /* the bytes stay queued: the next read returns them again */
	return gf_http_enter(GF_HTTP_RECVFROM, args->fd, (u64)args->ubuf, 0);
}
TRACEPOINT_PROBE(syscalls, sys_exit_recvfrom) { return gf_http_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_recvmsg)
{
	if (args->flags & GF_MSG_PEEK)
		return 0;
	return gf_http_enter(GF_HTTP_RECVMSG, args->fd, (u64)args->msg, 0);
}
TRACEPOINT_PROBE(syscalls, sys_exit_recvmsg) { return gf_http_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_readv)
{
	return gf_http_enter(GF_HTTP_READV, args->fd, (u64)args->vec, args->vlen);
}
TRACEPOINT_PROBE(syscalls, sys_exit_readv) { return gf_http_exit(args->ret); }

TRACEPOINT_PROBE(syscalls, sys_enter_write)
{
	return gf_http_enter(GF_HTTP_WRITE, args->fd, (u64)args->buf, 0);
}
TRACEPOINT_PROBE(syscalls, sys_exit_write) { return gf_http_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_sendto)
{
	return gf_http_enter(GF_HTTP_SENDTO, args->fd, (u64)args->buff, 0);
}
TRACEPOINT_PROBE(syscalls, sys_exit_sendto) { return gf_http_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_sendmsg)
{
	return gf_http_enter(GF_HTTP_SENDMSG, args->fd, (u64)args->msg, 0);
}
TRACEPOINT_PROBE(syscalls, sys_exit_sendmsg) { return gf_http_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_writev)
{
	return gf_http_enter(GF_HTTP_WRITEV, args->fd, (u64)args->vec, args->vlen);
}
TRACEPOINT_PROBE(syscalls, sys_exit_writev) { return gf_http_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_sendfile64)
{
	return gf_http_enter(GF_HTTP_SENDFILE, args->out_fd, 0, 0);
}
TRACEPOINT_PROBE(syscalls, sys_exit_sendfile64) { return gf_http_exit(args->ret); }

TRACEPOINT_PROBE(syscalls, sys_enter_close) { return gf_http_close(args->fd); }
