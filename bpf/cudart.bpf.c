/* gpuflight: uprobes on the CUDA runtime API (libcudart, shared or static) and on
 * the driver API (libcuda). One file: bcc rewrites map calls, and makes loadable
 * programs, only in the file it compiles, not in files it includes.
 *
 * Each row of the probe table (GF_API_PROBES and GF_NAME_PROBES in events.h) makes
 * `<name>_entry` (and `<name>_return` where a result or a duration is needed) from its
 * family's macro, written once for both layers; producer/probe/probes.py attaches them by
 * these names.
 * Events go to one ring buffer as fixed-size records (events.h) that user
 * space maps and decodes in bulk; under overload (a process over its share of a
 * ring under pressure, or a full ring) an event is counted exactly in the
 * `aggregates` table instead ("overload" below), and one that fits in neither
 * is counted lost, never silent. Each carries the calling thread's CUDA device,
 * from one lookup of the
 * `thread_device` map that the device probes (cudaSetDevice, the driver's context
 * calls: rows of GF_NAME_PROBES) keep; see "the calling thread's device" below.
 *
 * Build-time parameters (cflags):
 *   GF_RINGBUF_PAGES  size of the event ring buffer in pages (power of two)
 *   GF_FILTER_PIDS    1: only processes in `scope_pids` are captured
 *   GF_FOLLOW_FORKS   1: children of scoped processes join the scope
 *   GF_HOLD_ON_LOAD   1: a scoped process that execs or changes its link map is
 *                     stopped (SIGSTOP) until user space has attached to what
 *                     it mapped
 *   GF_WATCH_EXEC     1: exec is reported like a link-map change
 *   GF_HOLD_ON_LISTEN 1: a listen(2) in scope is reported, and held
 *   GF_ATTACH_COOKIE  1: the kernel has bpf_get_attach_cookie (5.15)
 *   GF_NAMES_PAGES    size of the `names` ring buffer in pages (power of two)
 *   GF_TALLY_DIR_SET  1: keep the tally, pinned in the bpffs directory GF_TALLY_DIR (a string),
 *                     for up to GF_TALLY_PIDS processes
 *   GF_QUIET_LOADS    1: a dlopen that mapped only files in `quiet_files` is neither notified
 *                     nor held; needs the walk's offsets, GF_FILE_OFF_* (the running kernel's)
 *   GF_TASK_OFF_PID   where task_struct keeps `pid` in the running kernel (its BTF): forks are
 *                     followed on the raw tracepoint then, else on the tracepoint perf event
 *   GF_PRESSURE_BYTES, GF_SHARE_EVENTS, GF_AGGREGATES_MAX
 *                     overload (below): half the ring, an eighth of it, 16384 entries
 *
 * Tracepoints are raw ones (BPF_RAW_TRACEPOINT_OPEN) wherever the program can read what it
 * needs from the raw arguments. A tracepoint perf event, once closed, is released by the
 * kernel with two RCU grace periods waited for under its event_mutex, which opening any
 * tracepoint perf event takes too: the five this program had took ~0.37 s to release, and a
 * trace started meanwhile waited 0.12-0.18 s for its first. A raw tracepoint's release waits
 * for nothing (~1 ms for four).
 */
#include <uapi/linux/ptrace.h>
#include <asm/unistd.h>
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
#ifndef GF_HOLD_ON_LISTEN
#define GF_HOLD_ON_LISTEN 0
#endif
#ifndef GF_TALLY_DIR_SET
#define GF_TALLY_DIR_SET 0
#endif
#ifndef GF_ATTACH_COOKIE
#define GF_ATTACH_COOKIE 0
#endif
#ifndef GF_QUIET_LOADS
#define GF_QUIET_LOADS 0
#endif

/* 16 MiB: PyTorch registers ~25,000 kernels at import, a 552-byte record each (13.6 MB),
 * in ~25 ms where the function's first instruction is emulated (NVIDIA's `push %rbp`):
 * faster than any reader, so the ring holds a whole burst (producer/probe/probes.py moves the
 * records out on a thread of their own meanwhile). */
#ifndef GF_NAMES_PAGES
#define GF_NAMES_PAGES 4096
#endif

#define GF_SIGSTOP 19

BPF_RINGBUF_OUTPUT(events, GF_RINGBUF_PAGES);
BPF_RINGBUF_OUTPUT(loader_events, 64);
/* Kernel names and handle aliases (struct gf_name_event): in bursts (registration at
 * load), and read before the events ring is decoded. */
BPF_RINGBUF_OUTPUT(names, GF_NAMES_PAGES);

/* Counters by enum gf_drop_slot (events.h): what was lost, and driver calls left out. */
BPF_PERCPU_ARRAY(drops, u64, GF_DROP_SLOTS);
BPF_HASH(drops_by_pid, u32, u64, 16384);

/* ---- overload: a fair share of the ring, and exact counts of what it cannot hold --------
 *
 * Under pressure (more than GF_PRESSURE_BYTES of the ring not read yet), a process may add
 * GF_SHARE_EVENTS events before the reader has taken every one it added (`ring_share`); past
 * that, its events of the kinds that carry no state user space follows (launches, graph
 * launches, copies, memsets, syncs) are shed: counted in `aggregates` (events.h struct
 * gf_agg_key) instead of recorded, so that one process flooding the ring cannot leave a
 * small one unseen. An event the ring has no room for at all is counted there too; only
 * when that table is full as well is it lost (GF_DROP_EVENTS, drops_by_pid). Without
 * pressure this costs one bpf_ringbuf_query per event. */
#define GF_RING_BYTES ((u64)GF_RINGBUF_PAGES * PAGE_SIZE)
/* A record of `events`: the kernel's 8-byte header, then one gf_event. */
#define GF_RECORD_BYTES (8 + sizeof(struct gf_event))
#ifndef GF_PRESSURE_BYTES
#define GF_PRESSURE_BYTES (GF_RING_BYTES / 2)
#endif
#ifndef GF_SHARE_EVENTS
#define GF_SHARE_EVENTS (GF_RING_BYTES / GF_RECORD_BYTES / 8)
#endif
#ifndef GF_AGGREGATES_MAX
#define GF_AGGREGATES_MAX 16384
#endif
/* bcc (0.26) has no method for bpf_ringbuf_query: the helper is given the `events` ring by the
 * placeholder bcc gives each table, -1 for the first one declared (above; bcc puts the map's
 * fd in its place, as it does for its own methods). tests/unit/producer/contract/test_abi.py checks it is first. */
#define GF_EVENTS_RING ((void *)bpf_pseudo_fd(1, -1))

BPF_HASH(aggregates, struct gf_agg_key, struct gf_agg_value, GF_AGGREGATES_MAX);

/* ---- per-CPU event buffers (issue 26) ----------------------------------------------------
 *
 * GF_CPU_SLOTS > 0: an event is written into a slot of its CPU's buffer (events.h struct
 * gf_slot), which user space maps (BPF_F_MMAPABLE), rather than reserved in `events`: no
 * helper call, and a few hundred KiB a CPU stay in its caches where a 32 MiB ring's lines have
 * left them by the time they are written again (35-60 ns a call, bench/results/overhead.md).
 * A program takes the slot `head` names by compare-and-swap (two programs can share a CPU on
 * a preemptible kernel), fills it and stamps its `committed` with its position + 1 last; the
 * reader takes the slots so stamped and moves `tail` past them, and writes nothing else (a
 * slot's lines go back to the program's CPU with no change of the reader's to fetch). A full
 * buffer (the reader behind) or a lost race sends the event to the ring as before. The reader
 * puts the two sources back in each thread's order (producer/probe/cpubuffers.py). */
#ifndef GF_CPU_SLOTS
#define GF_CPU_SLOTS 0
#endif
#ifndef GF_NCPUS
#define GF_NCPUS 1
#endif
#if GF_CPU_SLOTS
BPF_F_TABLE("array", u32, struct gf_slot, cpu_events, GF_NCPUS * GF_CPU_SLOTS, BPF_F_MMAPABLE);
BPF_F_TABLE("array", u32, struct gf_cpu_head, cpu_heads, GF_NCPUS, BPF_F_MMAPABLE);

/* gf_start's `*ring` for an event in a slot: the slot's stamp, above this tag. */
#define GF_WHERE_SLOT 2

/* A slot of this CPU's buffer for an event, or NULL (full, or another program took it first);
 * `*where`: what gf_emit needs to commit it. */
static __always_inline struct gf_event *gf_cpu_reserve(u64 *where)
{
	u32 cpu = bpf_get_smp_processor_id();
	struct gf_cpu_head *h = cpu_heads.lookup(&cpu);
	if (!h)
		return 0;
	u64 head = h->head;
	if (head - h->tail >= GF_CPU_SLOTS)
		return 0;
	if (__sync_val_compare_and_swap(&h->head, head, head + 1) != head)
		return 0;
	u32 index = cpu * GF_CPU_SLOTS + (u32)(head & (GF_CPU_SLOTS - 1));
	struct gf_slot *s = cpu_events.lookup(&index);
	if (!s)
		return 0;
	*where = (head + 1) << 2 | GF_WHERE_SLOT;
	return &s->ev;
}

/* The event of the slot gf_cpu_reserve gave (`where`) is whole: its stamp, written last. */
static __always_inline void gf_cpu_commit(struct gf_event *ev, u64 where)
{
	asm volatile("" ::: "memory");
	*(u64 *)((char *)ev - sizeof(u64)) = where >> 2;
}

static __always_inline void gf_cpu_discard(struct gf_event *ev, u64 where)
{
	*(u64 *)((char *)ev - sizeof(u64)) = (where >> 2) | GF_SLOT_DISCARDED;
}
#endif
BPF_ARRAY(agg_state, struct gf_agg_state, 1);

/* pid → the producer position past its latest event admitted under pressure, and how many it
 * was admitted since the reader last took everything it had added. */
struct gf_share {
	u64 until;
	u64 admitted;
};
BPF_TABLE("lru_hash", u32, struct gf_share, ring_share, 16384);

/* The tally (node agent with Kafka only): events committed to `events` per pid, and what the
 * agent says became of them (struct gf_settled), both pinned in GF_TALLY_DIR so that they
 * outlive an agent killed with SIGKILL; the next agent reports what it never published. */
#if GF_TALLY_DIR_SET
BPF_TABLE_PINNED("hash", u32, u64, committed, GF_TALLY_PIDS, GF_TALLY_DIR "/committed");
BPF_TABLE_PINNED("hash", u32, struct gf_settled, settled, GF_TALLY_PIDS, GF_TALLY_DIR "/settled");
/* Set when the agent stops: what is committed after it was never going to be read. */
BPF_ARRAY(tally_frozen, u32, 1);
#endif
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

/* Parked name probes use inflight keys above every api id; device probes above those. */
#define GF_NAME_PROBE_KEY 0x10000
#define GF_DEVICE_PROBE_KEY 0x20000

/* The calling thread's CUDA device (gf_event.device), kept by the device probes of both
 * layers (GF_NAME_PROBES: SET_DEVICE, CTX_*), read once per event. A thread not in it has
 * device 0 (the runtime's default). */
BPF_TABLE("lru_hash", u64, struct gf_thread_device, thread_device, 65536);

/* (pid, CUcontext) → its device: from cuDevicePrimaryCtxRetain and cuCtxCreate. */
struct gf_ctx_key {
	u64 ctx;
	u32 pid;
	u32 pad;
};
BPF_TABLE("lru_hash", struct gf_ctx_key, s32, ctx_device, 16384);

static __always_inline void gf_count_drop(u32 slot, u32 pid)
{
	u64 *n = drops.lookup(&slot);
	if (n)
		*n += 1;
	if (slot == GF_DROP_EVENTS) {
		u64 zero = 0;
		u64 *p = drops_by_pid.lookup_or_try_init(&pid, &zero);
		if (p)
			__sync_fetch_and_add(p, 1);
	}
}

/* ---- code paths (issue 28): the caller's Python stack, sampled ------------------------
 *
 * GF_PY_STACKS 1: a per-CPU countdown (gaps uniform on [1, 2p-1], p the period in force,
 * py_rate: every call has the same chance, whatever its thread or stack, so a sample weighted
 * p is an unbiased estimate) marks a recorded call; its program then ends in a tail call to
 * gf_py_walker, which walks the caller's Python stack (bpf/pywalk.bpf.h; py_procs: the
 * process's layout, from producer/discover/pythons.py) and sends the sample's head on
 * `py_samples` with the event's (pid, tid, ts_ns), the call's return address (its native
 * caller), its weight and its stack's id; a stack's frames go on `py_frames` before its first
 * sample's head, and only then (py_seen). Each ring's records are of one size, for the bulk
 * reader (producer/probe/ringbuf.py). A process with no
 * layout gets its native caller alone. A call not sampled pays four array lookups (its
 * CPU's sampler, the period asked for, the bound, the budget) and a countdown.
 */
#ifndef GF_PY_STACKS
#define GF_PY_STACKS 0
#endif
#if GF_PY_STACKS
#ifndef GF_PY_STACKS_PAGES
#define GF_PY_STACKS_PAGES 1024
#endif
#include "pywalk.bpf.h"
BPF_HASH(py_procs, u32, struct gf_py_offsets, 65536);
/* py_config[0]: the least period (the one asked for); [1]: the most walks a CPU makes in a
 * window (0: no bound); [2]: the cost budget, in ns a recorded call, that the walks may add on
 * average (0: none, the period is the one asked for). */
BPF_ARRAY(py_config, u32, 3);
/* Each CPU's sampler. The period in force starts at the least one. Within a window (2^30 ns)
 * it doubles, up to GF_PY_MAX_PERIOD, each time the CPU has walked its bound (py_config[1])
 * since the window began or the period last changed, and, with a budget, each time the walks
 * timed since then (8 or more) took more than the budget a recorded call. When a window
 * ends, the period becomes the least one that would have kept that window within both: its
 * recorded calls over the bound, its walks' mean time over the budget (the period asked for
 * at least). A gap is drawn with the period in force, and the sample that ends it weighs that
 * period (`drawn`): every estimate stays unbiased, whatever the rate did. */
struct gf_py_rate {
	u32 left;   /* calls until the next sample */
	u32 drawn;  /* the period the gap being counted down was drawn with */
	u32 period; /* the period in force */
	u32 walks;  /* walks since the window began or the bound last doubled the period */
	u64 window; /* ktime >> 30 of this window */
	u32 peak;   /* the highest period this CPU came to */
	u32 raised; /* times the period doubled */
	u64 spent;  /* ns the walks timed since the window began or the budget last doubled it */
	u32 timed;  /* those walks */
	u32 calls;  /* recorded calls since the window began */
	u64 spent_total; /* ns every walk took: the summary's */
	u64 calls_total; /* recorded calls (every one, sampled or not) */
	u64 walks_total; /* walks */
	u64 window_calls; /* recorded calls since the window began (not reset by the budget) */
	u64 window_spent; /* ns of this window's walks of known stacks (not reset by the budget) */
	u64 window_walks; /* those walks */
	u64 fresh_spent_total; /* ns the walks of new stacks took (in spent_total, not timed) */
	u64 fresh_walks_total; /* those walks */
};
#define GF_PY_MAX_PERIOD (1u << 20)
#define GF_PY_MIN_TIMED 8

/* The least period that keeps `walks` walks of `spent` ns in all, over `calls` recorded calls,
 * within the bound (`bound` walks a window) and the budget (`budget` ns a call). */
static __always_inline u32 gf_py_period_for(u32 asked, u32 bound, u32 budget, u64 calls,
					    u64 walks, u64 spent)
{
	u64 period = asked;
	if (bound && calls > bound) {
		u64 need = (calls + bound - 1) / bound;
		if (need > period)
			period = need;
	}
	if (budget && walks) {
		u64 per_walk = spent / walks;
		u64 need = (per_walk + budget - 1) / budget;
		if (need > period)
			period = need;
	}
	return period > GF_PY_MAX_PERIOD ? GF_PY_MAX_PERIOD : (u32)period;
}
BPF_PERCPU_ARRAY(py_rate, struct gf_py_rate, 1);
BPF_PERCPU_ARRAY(py_scratch, struct gf_py_stack, 1);
BPF_TABLE("lru_hash", u64, u8, py_seen, 65536);
BPF_RINGBUF_OUTPUT(py_samples, GF_PY_STACKS_PAGES);
BPF_RINGBUF_OUTPUT(py_frames, GF_PY_STACKS_PAGES);
BPF_PROG_ARRAY(py_walker, 1);

/* Backward passes (PyTorch's autograd): a process's entry to the autograd engine
 * (gf_backward_enter, on torch::autograd::Engine::execute): the thread that entered it, that
 * thread's thread pointer and state, and its innermost frame and instruction then. The thread
 * waits inside the engine (the GIL released) while the engine's device threads run the pass;
 * they have no Python frames. A call sampled on such a thread is walked from that frame
 * (GF_PY_BACKWARD) if the entering thread is still at it, at the same instruction: still in
 * the engine (gf_py_inside). Once it has left, the entry is stale and matches nothing; no
 * return probe (a uretprobe breaks the C++ exceptions the engine may throw through it). An
 * entry still inside is kept when another thread enters: a reentrant pass (checkpointing)
 * enters from a device thread, which has its own frames, and the outer pass goes on after it;
 * of two passes at once from two threads, the first is the one known. */
struct gf_py_backward {
	u32 tid;
	u32 pad;
	u64 fsbase;
	u64 tstate;
	u64 frame;
	u64 instr;
};
BPF_TABLE("lru_hash", u32, struct gf_py_backward, py_backward, 16384);
/* The processes that sent a new stack's frames since their last hold at an exit (below). */
BPF_TABLE("lru_hash", u32, u8, py_fresh, 65536);

/* The innermost frame of the thread that entered the engine, if it is still inside: 0 if not. */
static __always_inline u64 gf_py_inside(const struct gf_py_offsets *o,
					const struct gf_py_backward *b, u64 *tstate)
{
	*tstate = gf_py_thread_state(o, b->tid, b->fsbase, b->tstate);
	u64 top = gf_py_top(o, *tstate);
	if (!top || top != b->frame || gf_py_instr(o, top) != b->instr)
		return 0;
	return top;
}

int gf_backward_enter(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32;
	struct gf_py_offsets *o = py_procs.lookup(&pid);
	if (!o)
		return 0;
	struct gf_py_backward *known = py_backward.lookup(&pid);
	u64 ignored;
	if (known && known->tid != (u32)id && gf_py_inside(o, known, &ignored))
		return 0; /* reentrant, or another thread's pass still running */
	struct gf_py_backward b = {};
	b.tid = (u32)id;
	b.fsbase = gf_py_fsbase();
	b.tstate = gf_py_thread_state(o, b.tid, b.fsbase, 0);
	b.frame = gf_py_top(o, b.tstate);
	if (!b.frame) { /* entered from C++ alone: no stack to give its threads' calls */
		py_backward.delete(&pid);
		return 0;
	}
	b.instr = gf_py_instr(o, b.frame);
	py_backward.update(&pid, &b);
	return 0;
}

/* The thread state and innermost frame to walk for a call on thread `tid` of `pid`: its own;
 * or, on a thread with no Python frame while another thread of the process is inside the
 * autograd engine, that thread's (`*flags` GF_PY_BACKWARD). */
static __always_inline u64 gf_py_walked(const struct gf_py_offsets *o, u32 pid, u32 tid,
					u64 *frame, u32 *flags)
{
	u64 tstate = gf_py_thread_state(o, tid, gf_py_fsbase(), 0);
	*frame = gf_py_top(o, tstate);
	*flags = 0;
	if (*frame)
		return tstate;
	struct gf_py_backward *b = py_backward.lookup(&pid);
	if (!b || b->tid == tid)
		return tstate;
	u64 other = 0;
	u64 top = gf_py_inside(o, b, &other);
	if (!top)
		return tstate;
	*frame = top;
	*flags = GF_PY_BACKWARD;
	return other;
}

/* The call being recorded (`ts_ns`: its event's) is sampled or not; if it is, its key waits
 * in the CPU's scratch for gf_py_follow, at the end of the program. `caller`: the call's
 * return address where the probe read it already, else 0: read here, for sampled calls only
 * (the probe fires where %rsp is the entry's: it points at the return address). */
static __always_inline void gf_py_mark(struct pt_regs *ctx, u64 id, u64 ts_ns, u64 caller)
{
	u32 zero = 0, one = 1, two = 2;
	struct gf_py_rate *r = py_rate.lookup(&zero);
	u32 *asked = py_config.lookup(&zero);
	u32 *bound = py_config.lookup(&one);
	u32 *budget = py_config.lookup(&two);
	if (!r || !asked || !*asked || !bound || !budget)
		return;
	u64 window = ts_ns >> 30;
	if (r->window != window) {
		if (r->window_calls) {
			int timed = r->window_walks >= GF_PY_MIN_TIMED;
			u32 next = gf_py_period_for(*asked, *bound, *budget, r->window_calls,
						    timed ? r->window_walks : 0, r->window_spent);
			/* Too few walks in that window to time (a process's first, cold ones): its
			 * period is kept, not moved by them. */
			if (!*budget || timed || next > r->period)
				r->period = next;
		}
		if (r->period < *asked)
			r->period = *asked;
		if (r->period > r->peak)
			r->peak = r->period;
		r->window = window;
		r->walks = 0;
		r->spent = 0;
		r->timed = 0;
		r->calls = 0;
		r->window_calls = 0;
		r->window_spent = 0;
		r->window_walks = 0;
	}
	r->calls += 1;
	r->window_calls += 1;
	r->calls_total += 1;
	/* The gap being counted down ends here or not; whatever the period now, the sample that
	 * ends it weighs the period it was drawn with (a CPU's first call: a gap of 1), and the
	 * next is drawn with the period in force (1: every call). */
	if (r->left > 1) {
		r->left -= 1;
		return;
	}
	u32 weight = r->drawn ? r->drawn : 1;
	r->drawn = r->period;
	r->left = r->period > 1 ? 1 + bpf_get_prandom_u32() % (2 * r->period - 1) : 1;
	r->walks += 1;
	if (*bound && r->walks >= *bound && r->period < GF_PY_MAX_PERIOD) {
		r->period *= 2; /* from the next gap on */
		r->walks = 0;
		r->raised += 1;
		if (r->period > r->peak)
			r->peak = r->period;
	}
	struct gf_py_stack *s = py_scratch.lookup(&zero);
	if (!s)
		return;
	if (!caller)
		bpf_probe_read_user(&caller, sizeof(caller), (void *)PT_REGS_SP(ctx));
	s->ts_ns = ts_ns;
	s->pid = id >> 32;
	s->tid = (u32)id;
	s->caller = caller;
	s->weight = weight;
	s->pending = 1;
}

/* The last thing a probe does: a marked call's walk (a tail call: it does not return). */
static __always_inline void gf_py_follow(struct pt_regs *ctx)
{
	u32 zero = 0;
	struct gf_py_stack *s = py_scratch.lookup(&zero);
	if (!s || !s->pending)
		return;
	s->pending = 0;
	py_walker.call(ctx, 0);
}

/* A walk took `spent` ns: counted, and with a budget (py_config[2]), a CPU whose timed walks
 * take more than the budget a recorded call doubles its period at once. The walk of a new
 * stack (`fresh`: its frames sent too, once) is counted, not timed: the rate follows what the
 * walks cost once a process's stacks are known, not its first, cold ones. */
static __always_inline void gf_py_timed(u64 spent, int fresh)
{
	u32 zero = 0, two = 2;
	struct gf_py_rate *r = py_rate.lookup(&zero);
	u32 *budget = py_config.lookup(&two);
	if (!r || !budget)
		return;
	r->spent_total += spent;
	r->walks_total += 1;
	if (fresh) {
		r->fresh_spent_total += spent;
		r->fresh_walks_total += 1;
		return;
	}
	r->spent += spent;
	r->timed += 1;
	r->window_spent += spent;
	r->window_walks += 1;
	if (*budget && r->timed >= GF_PY_MIN_TIMED && r->spent > (u64)*budget * r->calls &&
	    r->period < GF_PY_MAX_PERIOD) {
		r->period *= 2; /* from the next gap on */
		r->raised += 1;
		if (r->period > r->peak)
			r->peak = r->period;
		r->spent = 0;
		r->timed = 0;
		r->calls = 0;
	}
}

int gf_py_walker(struct pt_regs *ctx)
{
	u64 began = bpf_ktime_get_ns();
	u32 zero = 0;
	struct gf_py_stack *s = py_scratch.lookup(&zero);
	if (!s)
		return 0;
	u32 pid = s->pid;
	struct gf_py_offsets *o = py_procs.lookup(&pid);
	if (o) {
		u64 frame = 0;
		u32 flags = 0;
		u64 tstate = gf_py_walked(o, pid, s->tid, &frame, &flags);
		gf_py_walk(o, tstate, frame, s);
		s->flags |= flags;
	} else {
		s->tstate = 0;
		s->depth = 0;
		s->flags = GF_PY_NO_PYTHON;
	}
	s->stack_id = gf_py_hash(s);
	u8 one = 1;
	if (!py_seen.lookup(&s->stack_id)) {
		s->flags |= GF_PY_NEW;
		/* A new stack wakes its reader (once caught up): its code objects are read while
		 * the process lives (producer/decode/pycapture.py). New stacks are rare. */
		if (py_frames.ringbuf_output(s, offsetof(struct gf_py_stack, frame), 0) == 0) {
			py_seen.update(&s->stack_id, &one); /* else sent again with the next */
			py_fresh.update(&pid, &one);
		} else
			gf_count_drop(GF_DROP_PY_SAMPLES, pid);
	}
	if (py_samples.ringbuf_output(s, offsetof(struct gf_py_stack, code), BPF_RB_NO_WAKEUP))
		gf_count_drop(GF_DROP_PY_SAMPLES, pid);
	gf_py_timed(bpf_ktime_get_ns() - began, s->flags & GF_PY_NEW);
	return 0;
}
#else
#define gf_py_mark(ctx, id, ts_ns, caller) do { } while (0)
#define gf_py_follow(ctx) do { } while (0)
#endif

static __always_inline int gf_in_scope(u32 pid)
{
#if GF_FILTER_PIDS
	return scope_pids.lookup(&pid) != 0;
#else
	return 1;
#endif
}

static __always_inline s32 gf_device_of(u64 pid_tgid)
{
	struct gf_thread_device *t = thread_device.lookup(&pid_tgid);
	return t ? t->device : 0;
}

/* `t`: the thread's entry of `thread_device`, if it has one. */
static __always_inline void gf_fill(struct gf_event *ev, u64 id, u16 api, u8 type,
				    struct gf_thread_device *t)
{
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->ts_ns = bpf_ktime_get_ns();
	ev->pid = id >> 32;
	ev->tid = (u32)id;
	ev->api = api;
	ev->type = type;
	ev->device = t ? t->device : 0;
}

/* ---- the two layers ------------------------------------------------------
 *
 * Every family below is written once, with the layer (the probe table's third column) as
 * a parameter (a constant per row, or from the api id with attach cookies): GF_LAYER_RUNTIME
 * for libcudart, api ids below GF_DRIVER_API_BASE (200), and GF_LAYER_DRIVER for libcuda.
 * The one difference between the layers' records is the driver's check below; where the
 * layers' signatures differ (launches), the family decodes both.
 *
 * No double counting: the runtime implements its calls with the driver, by exported
 * symbol or through pointers from cuGetProcAddress. Either way the call instruction lies
 * in the runtime's text, so each driver probe reads its return address ([sp] at entry)
 * and leaves the call out (counted in drops[GF_DROP_FORWARDED]) when it lies in the text
 * of a runtime file the process maps (`runtime_text`, filled by user space per process).
 * A runtime linked statically into a library whose symbols we cannot see (cuBLAS) is not
 * probed, so its driver calls are counted here, once.
 *
 * Tail calls: a runtime function may end in a jump to the driver (`jmp *ptr`, a sibling call)
 * rather than call it; the driver then returns straight to the runtime's caller, so its return
 * address is the caller's, outside the runtime. Each runtime probe therefore notes, in the
 * thread's `thread_device` entry, the stack pointer at its entry and its return address
 * (GF_RT_IN_FLIGHT instead, until its return probe, where it has one: the return address is
 * then the kernel's trampoline); a driver call entered at that same stack pointer, with that
 * return address (or while that runtime call is in flight), is the runtime's tail call. A call
 * the application makes itself has another return address, or a deeper stack.
 */
#define GF_LAYER_RUNTIME 0
#define GF_LAYER_DRIVER 1

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
	u32 slot = GF_DROP_FORWARDED;
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

/* 1 when a call of `layer` is not recorded: the driver half of a runtime call already
 * recorded (`ret`: its return address, `sp` the stack pointer at its entry, `t` the thread's
 * `thread_device` entry). Free for the runtime (`layer` is a constant). */
static __always_inline int gf_forwarded(int layer, u32 pid, u64 ret, u64 sp,
					struct gf_thread_device *t)
{
	if (layer != GF_LAYER_DRIVER)
		return 0;
	if (!gf_from_runtime(pid, ret)) {
		if (!t || !sp || t->rt_sp != sp ||
		    (t->rt_ret != ret && t->rt_ret != GF_RT_IN_FLIGHT))
			return 0;
		t->rt_sp = 0; /* a runtime call makes one tail call */
	}
	gf_count_forwarded();
	return 1;
}

/* A runtime probe's entry (see "Tail calls" above): the thread's call, by `sp` and `ret`. */
static __always_inline void gf_runtime_entered(u64 id, struct gf_thread_device *t, u64 sp,
					       u64 ret)
{
	if (t) {
		t->rt_sp = sp;
		t->rt_ret = ret;
		return;
	}
	struct gf_thread_device fresh = {};
	fresh.rt_sp = sp;
	fresh.rt_ret = ret;
	thread_device.update(&id, &fresh);
}

/* A runtime probe's return: nothing of the thread's is in flight any more. */
static __always_inline void gf_runtime_returned(u64 id)
{
	struct gf_thread_device *t = thread_device.lookup(&id);
	if (t)
		t->rt_sp = 0;
}

/* The return address where a probe with a return half needs it (the driver), else 0. */
static __always_inline u64 gf_caller(struct pt_regs *ctx, int layer)
{
	return layer == GF_LAYER_DRIVER ? gf_return_address(ctx) : 0;
}

/* ---- overload: fair share and aggregates (above) ---------------------------- */

/* The kinds of event that may be shed under pressure: user space follows no state through
 * them (allocations, frees, stream capture and instantiation it does: those are kept). */
static __always_inline int gf_sheddable(u8 type)
{
	return type == GF_EV_LAUNCH || type == GF_EV_MEMCPY || type == GF_EV_MEMSET ||
	       type == GF_EV_SYNC || type == GF_EV_GRAPH_LAUNCH;
}

/* 1 when the ring is under pressure and `pid` has had its share of it. */
static __always_inline int gf_over_share(u32 pid)
{
	if (bpf_ringbuf_query(GF_EVENTS_RING, BPF_RB_AVAIL_DATA) < GF_PRESSURE_BYTES)
		return 0;
	u64 consumed = bpf_ringbuf_query(GF_EVENTS_RING, BPF_RB_CONS_POS);
	u64 produced = bpf_ringbuf_query(GF_EVENTS_RING, BPF_RB_PROD_POS);
	struct gf_share *share = ring_share.lookup(&pid);
	if (!share) {
		struct gf_share fresh = {};
		fresh.until = produced + GF_RECORD_BYTES;
		fresh.admitted = 1;
		ring_share.update(&pid, &fresh);
		return 0;
	}
	if (consumed >= share->until)
		share->admitted = 0; /* the reader has taken all it added */
	if (share->admitted >= GF_SHARE_EVENTS)
		return 1;
	share->admitted += 1;
	share->until = produced + GF_RECORD_BYTES;
	return 0;
}

/* Count `ev` in `aggregates` (events.h struct gf_agg_key); lost only when the table is full. */
static __always_inline void gf_aggregate(struct gf_event *ev)
{
	u32 first = 0;
	struct gf_agg_state *state = agg_state.lookup(&first);
	struct gf_agg_key key;
	__builtin_memset(&key, 0, sizeof(key));
	key.pid = ev->pid;
	key.api = ev->api;
	key.type = ev->type;
	key.flags = ev->flags & (GF_F_ASYNC | GF_F_HAS_RESULT);
	if ((ev->flags & GF_F_HAS_RESULT) && ev->result != 0)
		key.flags |= GF_AGG_F_FAILED;
	key.device = ev->device;
	u64 bytes = 0;
	if (ev->type == GF_EV_LAUNCH) {
		key.handle = ev->handle;
		key.dim[0] = ev->dim[0];
		key.dim[1] = ev->dim[1];
		key.dim[2] = ev->dim[2];
		key.dim[3] = ev->dim[3];
		key.dim[4] = ev->dim[4];
		key.dim[5] = ev->dim[5];
		bytes = ev->bytes;
	} else if (ev->type == GF_EV_GRAPH_LAUNCH) {
		key.handle = ev->handle;
	} else if (ev->type == GF_EV_FREE) {
		key.handle = ev->handle != 0;
	} else {
		key.dim[0] = ev->dim[0];
		if (ev->type == GF_EV_MEMCPY || ev->type == GF_EV_MEMSET || ev->type == GF_EV_ALLOC)
			bytes = ev->bytes;
	}
	if (state) {
		key.gen = state->gen;
		key.slot = (ev->ts_ns + state->wall_offset_ns) / GF_AGG_SLOT_NS;
	}
	struct gf_agg_value *v = aggregates.lookup(&key);
	if (!v) {
		struct gf_agg_value fresh = {};
		fresh.first_ts_ns = ev->ts_ns;
		fresh.last_ts_ns = ev->ts_ns;
		aggregates.insert(&key, &fresh); /* another CPU's may be first: then it is added to */
		v = aggregates.lookup(&key);
		if (!v) {
			gf_count_drop(GF_DROP_EVENTS, ev->pid);
			return;
		}
	}
	__sync_fetch_and_add(&v->count, 1);
	if (bytes)
		__sync_fetch_and_add(&v->bytes, bytes);
	if (ev->flags & GF_F_HAS_RESULT)
		__sync_fetch_and_add(&v->duration_ns, ev->duration_ns);
	if (ev->ts_ns < v->first_ts_ns)
		v->first_ts_ns = ev->ts_ns;
	if (ev->ts_ns > v->last_ts_ns)
		v->last_ts_ns = ev->ts_ns;
	u32 slot = GF_DROP_AGGREGATED;
	u64 *n = drops.lookup(&slot);
	if (n)
		*n += 1;
}

/* ---- events: entry-only, or parked at entry and completed at return ---- */

/* Begin an entry-only event: in a slot of its CPU's buffer (`*ring` the slot's stamp and
 * GF_WHERE_SLOT), in a reservation of the ring (`*ring` 1), or in `spare`, the
 * probe's own on its stack, when it is to be counted rather than recorded (`*ring` 0: under
 * pressure over its process's share, or the ring full); NULL when it is not to be recorded at
 * all: out of scope, or the driver half of a runtime call (`ret`: the call's return address,
 * [sp] at entry). */
static __always_inline struct gf_event *gf_start(struct pt_regs *ctx, int layer, u64 ret,
						 u16 api, u8 type, struct gf_event *spare,
						 u64 *ring)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32;
	if (!gf_in_scope(pid))
		return 0;
	u64 sp = PT_REGS_SP(ctx);
	struct gf_thread_device *t = thread_device.lookup(&id);
	if (gf_forwarded(layer, pid, ret, sp, t))
		return 0;
	if (layer == GF_LAYER_RUNTIME)
		gf_runtime_entered(id, t, sp, ret);
	struct gf_event *ev = 0;
#if GF_CPU_SLOTS
	u64 slot = 0;
	ev = gf_cpu_reserve(&slot);
	if (ev)
		*ring = slot;
	else
#endif
	if (!gf_sheddable(type) || !gf_over_share(pid))
		ev = events.ringbuf_reserve(sizeof(struct gf_event));
	if (ev) {
		if (!*ring)
			*ring = 1;
	} else {
		*ring = 0;
		ev = spare;
	}
	gf_fill(ev, id, api, type, t);
	if (*ring) /* a call only counted under overload has no event to join its sample to */
		gf_py_mark(ctx, id, ev->ts_ns, ret);
	return ev;
}

static __always_inline struct gf_event *gf_begin(struct pt_regs *ctx, int layer, u16 api,
						 u8 type, struct gf_event *spare, u64 *ring)
{
	return gf_start(ctx, layer, gf_return_address(ctx), api, type, spare, ring);
}

/* Record a complete event made by gf_start: commit its reservation (`ring` 1) or its CPU
 * buffer's slot (GF_WHERE_SLOT), or count it in `aggregates` (0). */
static __always_inline void gf_emit(struct gf_event *ev, u64 ring)
{
	if (!ring) {
		gf_aggregate(ev);
		return;
	}
#if GF_TALLY_DIR_SET
	u32 first = 0;
	u32 *frozen = tally_frozen.lookup(&first);
	if (!frozen || !*frozen) {
		u32 pid = ev->pid;
		u64 zero = 0;
		u64 *n = committed.lookup_or_try_init(&pid, &zero);
		if (!n) {
			/* The tally is full: not committed (counted here, not unknown later). */
			gf_aggregate(ev);
#if GF_CPU_SLOTS
			if ((ring & 3) == GF_WHERE_SLOT) {
				gf_cpu_discard(ev, ring);
				return;
			}
#endif
			events.ringbuf_discard(ev, BPF_RB_NO_WAKEUP);
			return;
		}
		__sync_fetch_and_add(n, 1);
	}
#endif
#if GF_CPU_SLOTS
	if ((ring & 3) == GF_WHERE_SLOT) {
		gf_cpu_commit(ev, ring);
		return;
	}
#endif
	/* No wake-up: the reader drains on its own schedule, which keeps the
	 * per-call cost down to the reservation itself. */
	events.ringbuf_submit(ev, BPF_RB_NO_WAKEUP);
}

/* Record an event completed at return (`ev`: in the `inflight` entry): into its CPU's buffer
 * or the ring, or counted in `aggregates` (under pressure over its process's share, or the
 * ring full). */
static __always_inline void gf_emit_parked(struct gf_event *ev)
{
#if GF_CPU_SLOTS
	u64 slot = 0;
	struct gf_event *into = gf_cpu_reserve(&slot);
	if (into) {
		__builtin_memcpy(into, ev, sizeof(*into));
		gf_emit(into, slot);
		return;
	}
#endif
	if (gf_sheddable(ev->type) && gf_over_share(ev->pid)) {
		gf_aggregate(ev);
		return;
	}
	struct gf_event *out = events.ringbuf_reserve(sizeof(struct gf_event));
	if (!out) {
		gf_aggregate(ev); /* the ring is full */
		return;
	}
	__builtin_memcpy(out, ev, sizeof(*out));
	gf_emit(out, 1);
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

static __always_inline struct gf_inflight *gf_park_begin(struct pt_regs *ctx, int layer,
							 struct gf_inflight *v, u16 api, u8 type)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32;
	if (!gf_in_scope(pid))
		return 0;
	u64 sp = PT_REGS_SP(ctx);
	struct gf_thread_device *t = thread_device.lookup(&id);
	if (gf_forwarded(layer, pid, gf_caller(ctx, layer), sp, t))
		return 0;
	if (layer == GF_LAYER_RUNTIME)
		gf_runtime_entered(id, t, sp, GF_RT_IN_FLIGHT);
	__builtin_memset(v, 0, sizeof(*v));
	v->ev.ts_ns = bpf_ktime_get_ns();
	v->ev.pid = pid;
	v->ev.tid = (u32)id;
	v->ev.api = api;
	v->ev.type = type;
	v->ev.device = t ? t->device : 0;
	gf_py_mark(ctx, id, v->ev.ts_ns, gf_caller(ctx, layer));
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
		return 0; /* entered before we attached, out of scope, or forwarded */
	if (api < GF_DRIVER_API_BASE)
		gf_runtime_returned(key.pid_tgid);
	struct gf_event *ev = &v->ev;
	ev->result = (s32)PT_REGS_RC(ctx);
	ev->duration_ns = now - ev->ts_ns;
	ev->flags |= GF_F_HAS_RESULT;
	if (v->out_ptr && ev->result == 0) {
		u64 ptr = 0;
		bpf_probe_read_user(&ptr, sizeof(ptr), (void *)v->out_ptr);
		ev->handle = ptr;
	}
	gf_emit_parked(ev);
	inflight.delete(&key);
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
 *   grid.x|grid.y<<32 = rsi, grid.z = edx, block.x|block.y<<32 = rcx, block.z = r8d,
 *   args = r9, sharedMem = [sp+8], stream = [sp+16].
 * cuLaunchKernel(f, gx, gy, gz, bx, by, bz=[sp+8], sharedMem=[sp+16] (32 bits),
 *   stream=[sp+24], params, extra): one read of [sp, sp+32) gives the return address too. */
static __always_inline int gf_launch(struct pt_regs *ctx, int layer, u16 api)
{
	struct gf_event spare;
	u64 ring = 0;
	struct gf_event *ev;
	if (layer == GF_LAYER_DRIVER) {
		u64 stacked[4] = {}; /* return address, bz, sharedMem, stream */
		bpf_probe_read_user(stacked, sizeof(stacked), (void *)PT_REGS_SP(ctx));
		ev = gf_start(ctx, layer, stacked[0], api, GF_EV_LAUNCH, &spare, &ring);
		if (!ev)
			return 0;
		ev->dim[0] = (u32)PT_REGS_PARM2(ctx);
		ev->dim[1] = (u32)PT_REGS_PARM3(ctx);
		ev->dim[2] = (u32)PT_REGS_PARM4(ctx);
		ev->dim[3] = (u32)PT_REGS_PARM5(ctx);
		ev->dim[4] = (u32)PT_REGS_PARM6(ctx);
		ev->dim[5] = (u32)stacked[1];
		ev->bytes = (u32)stacked[2];
		ev->stream = stacked[3];
	} else {
		u64 stacked[3] = {}; /* return address, sharedMem, stream: one read, not two */
		bpf_probe_read_user(stacked, sizeof(stacked), (void *)PT_REGS_SP(ctx));
		ev = gf_start(ctx, layer, stacked[0], api, GF_EV_LAUNCH, &spare, &ring);
		if (!ev)
			return 0;
		u64 grid_xy = PT_REGS_PARM2(ctx);
		u64 block_xy = PT_REGS_PARM4(ctx);
		ev->dim[0] = (u32)grid_xy;
		ev->dim[1] = grid_xy >> 32;
		ev->dim[2] = (u32)PT_REGS_PARM3(ctx);
		ev->dim[3] = (u32)block_xy;
		ev->dim[4] = block_xy >> 32;
		ev->dim[5] = (u32)PT_REGS_PARM5(ctx);
		ev->bytes = stacked[1];
		ev->stream = stacked[2];
	}
	ev->handle = PT_REGS_PARM1(ctx);
	gf_emit(ev, ring);
	return 0;
}

/* cudaLaunchKernelExC(const cudaLaunchConfig_t *config, func, args) and
 * cuLaunchKernelEx(const CUlaunchConfig *config, f, params, extra): gridDim@0,
 * blockDim@12, the dynamic shared memory@24 (64 bits in the runtime's, 32 in the
 * driver's), stream@32. */
struct gf_launch_config {
	u32 grid[3];
	u32 block[3];
	union {
		u64 runtime;
		u32 driver;
	} dynamic_smem;
	u64 stream;
};

static __always_inline int gf_launch_ex(struct pt_regs *ctx, int layer, u16 api)
{
	struct gf_event spare;
	u64 ring = 0;
	struct gf_event *ev = gf_begin(ctx, layer, api, GF_EV_LAUNCH, &spare, &ring);
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
	ev->bytes = layer == GF_LAYER_DRIVER ? cfg.dynamic_smem.driver : cfg.dynamic_smem.runtime;
	ev->stream = cfg.stream;
	gf_emit(ev, ring);
	return 0;
}

/* ---- copies ------------------------------------------------------------ */

/* Asynchronous copy: the event is complete at entry. */
static __always_inline int gf_copy_async(struct pt_regs *ctx, int layer, u16 api, u64 dst,
					 u64 bytes, u32 kind, u64 stream)
{
	struct gf_event spare;
	u64 ring = 0;
	struct gf_event *ev = gf_begin(ctx, layer, api, GF_EV_MEMCPY, &spare, &ring);
	if (!ev)
		return 0;
	ev->flags = GF_F_ASYNC;
	ev->handle = dst;
	ev->bytes = bytes;
	ev->dim[0] = kind;
	ev->stream = stream;
	gf_emit(ev, ring);
	return 0;
}

/* Synchronous copy: parked at entry, completed with result and duration. */
static __always_inline int gf_copy_sync(struct pt_regs *ctx, int layer, u16 api, u64 dst,
					u64 bytes, u32 kind)
{
	struct gf_inflight v;
	if (!gf_park_begin(ctx, layer, &v, api, GF_EV_MEMCPY))
		return 0;
	v.ev.handle = dst;
	v.ev.bytes = bytes;
	v.ev.dim[0] = kind;
	return gf_park(&v, api);
}

/* ---- memset ------------------------------------------------------------ */

static __always_inline int gf_memset(struct pt_regs *ctx, int layer, u16 api, u64 dst,
				     u64 bytes, u64 stream, u8 async)
{
	struct gf_event spare;
	u64 ring = 0;
	struct gf_event *ev = gf_begin(ctx, layer, api, GF_EV_MEMSET, &spare, &ring);
	if (!ev)
		return 0;
	ev->flags = async ? GF_F_ASYNC : 0;
	ev->handle = dst;
	ev->bytes = bytes;
	ev->stream = stream;
	gf_emit(ev, ring);
	return 0;
}

/* cudaMemset3D(cudaPitchedPtr, value, cudaExtent): both structs are larger
 * than 16 bytes, so they are passed in memory: pitchedDevPtr = [sp+8..40),
 * extent = [sp+40..64); value = edi; the Async form's stream = rsi. */
static __always_inline int gf_memset_3d(struct pt_regs *ctx, int layer, u16 api, u64 stream,
					u8 async)
{
	u64 extent[3] = {};
	bpf_probe_read_user(extent, sizeof(extent), (void *)(PT_REGS_SP(ctx) + 40));
	return gf_memset(ctx, layer, api, gf_stack_arg(ctx, 0),
			 extent[0] * extent[1] * extent[2], stream, async);
}

/* ---- allocations ------------------------------------------------------- */

/* All allocators take (void **out, size_t size, ...); the pointer is read
 * from *out at return. */
static __always_inline int gf_alloc(struct pt_regs *ctx, int layer, u16 api, u32 kind,
				    u64 stream)
{
	struct gf_inflight v;
	if (!gf_park_begin(ctx, layer, &v, api, GF_EV_ALLOC))
		return 0;
	v.out_ptr = PT_REGS_PARM1(ctx);
	v.ev.bytes = PT_REGS_PARM2(ctx);
	v.ev.dim[0] = kind;
	v.ev.stream = stream;
	return gf_park(&v, api);
}

/* cudaFree(ptr) / cudaFreeAsync(ptr, stream), cuMemFree_v2 / cuMemFreeAsync: the size is
 * known to user space from the allocation of the same pointer. */
static __always_inline int gf_free(struct pt_regs *ctx, int layer, u16 api, u64 ptr,
				   u64 stream, u8 async)
{
	struct gf_inflight v;
	if (!gf_park_begin(ctx, layer, &v, api, GF_EV_FREE))
		return 0;
	v.ev.handle = ptr;
	v.ev.stream = stream;
	v.ev.flags = async ? GF_F_ASYNC : 0;
	return gf_park(&v, api);
}

/* ---- waits: the CPU blocked on the GPU --------------------------------- */

static __always_inline int gf_sync(struct pt_regs *ctx, int layer, u16 api, u32 scope,
				   u64 handle)
{
	struct gf_inflight v;
	if (!gf_park_begin(ctx, layer, &v, api, GF_EV_SYNC))
		return 0;
	v.ev.dim[0] = scope;
	v.ev.handle = handle;
	if (scope == GF_SYNC_STREAM)
		v.ev.stream = handle;
	return gf_park(&v, api);
}

/* ---- graphs ------------------------------------------------------------ */

/* cudaGraphLaunch(graphExec, stream) */
static __always_inline int gf_graph_launch(struct pt_regs *ctx, int layer, u16 api)
{
	struct gf_event spare;
	u64 ring = 0;
	struct gf_event *ev = gf_begin(ctx, layer, api, GF_EV_GRAPH_LAUNCH, &spare, &ring);
	if (!ev)
		return 0;
	ev->flags = GF_F_ASYNC;
	ev->handle = PT_REGS_PARM1(ctx);
	ev->stream = PT_REGS_PARM2(ctx);
	gf_emit(ev, ring);
	return 0;
}

/* Stream capture and instantiation: user space counts the launches captured on a
 * stream (F_CAPTURED) into the graph, then the exec instantiated from it, so that
 * graph launches can be expanded to kernel launches. */

/* cudaStreamBeginCapture(stream, mode) */
static __always_inline int gf_capture_begin(struct pt_regs *ctx, int layer, u16 api,
					    u64 stream)
{
	struct gf_event spare;
	u64 ring = 0;
	struct gf_event *ev = gf_begin(ctx, layer, api, GF_EV_GRAPH_CAPTURE, &spare, &ring);
	if (!ev)
		return 0;
	ev->stream = stream;
	ev->dim[0] = GF_CAPTURE_BEGIN;
	gf_emit(ev, ring);
	return 0;
}

/* cudaStreamEndCapture(stream, cudaGraph_t *graph): the graph is read at return. */
static __always_inline int gf_capture_end(struct pt_regs *ctx, int layer, u16 api, u64 stream,
					  u64 graph_out)
{
	struct gf_inflight v;
	if (!gf_park_begin(ctx, layer, &v, api, GF_EV_GRAPH_CAPTURE))
		return 0;
	v.ev.stream = stream;
	v.ev.dim[0] = GF_CAPTURE_END;
	v.out_ptr = graph_out;
	return gf_park(&v, api);
}

/* cudaGraphInstantiate*(cudaGraphExec_t *exec, cudaGraph_t graph, ...) */
static __always_inline int gf_instantiate(struct pt_regs *ctx, int layer, u16 api,
					  u64 exec_out, u64 graph)
{
	struct gf_inflight v;
	if (!gf_park_begin(ctx, layer, &v, api, GF_EV_GRAPH_INSTANTIATE))
		return 0;
	v.ev.bytes = graph;
	v.out_ptr = exec_out;
	return gf_park(&v, api);
}

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
		gf_count_drop(GF_DROP_NAMES, pid);
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

/* ---- the calling thread's device ---------------------------------------
 *
 * Both layers keep one map, `thread_device` (pid_tgid → struct gf_thread_device): the runtime's
 * cudaSetDevice, and the driver's context calls (the runtime makes them too: cudaSetDevice
 * retains the device's primary context and makes it current), so they agree. A context's
 * device is learnt where it is made (cuDevicePrimaryCtxRetain, cuCtxCreate*: `ctx_device`).
 * Every call takes effect at return, and only when it returned 0; none is filtered as
 * forwarded (they record no event). Approximate: a thread that set its device before we
 * attached is on device 0 until it sets one again; a context made before then has
 * no known device (making it current leaves the thread's device as it was); a pop deeper
 * than GF_CTX_STACK pushes leaves it as it is; without tracefs (GF_WATCH_EXEC 0) an entry
 * outlives its thread (a later thread given the same tid within the LRU's life starts on that
 * device, not on 0). */
enum gf_device_op {
	GF_DEV_SET_DEVICE = 1,
	GF_DEV_CTX_RETAIN = 2,
	GF_DEV_CTX_CREATE = 3,
	GF_DEV_CTX_SET = 4,
	GF_DEV_CTX_PUSH = 5,
	GF_DEV_CTX_POP = 6,
};

/* Integer argument `n` (1-based; a constant) of the probed call. */
static __always_inline u64 gf_arg(struct pt_regs *ctx, int n)
{
	switch (n) {
	case 1: return PT_REGS_PARM1(ctx);
	case 2: return PT_REGS_PARM2(ctx);
	case 3: return PT_REGS_PARM3(ctx);
	case 4: return PT_REGS_PARM4(ctx);
	case 5: return PT_REGS_PARM5(ctx);
	case 6: return PT_REGS_PARM6(ctx);
	default: return n > 6 ? gf_stack_arg(ctx, n - 7) : 0;
	}
}

/* Entry half: park the call's first argument (a context, or where one is written) and its
 * device (`dev_arg`: the CUdevice parameter's position, 0: none). */
static __always_inline int gf_device_park(struct pt_regs *ctx, u32 op, int dev_arg)
{
	u64 id = bpf_get_current_pid_tgid();
	if (!gf_in_scope(id >> 32))
		return 0;
	struct gf_inflight v;
	__builtin_memset(&v, 0, sizeof(v));
	v.out_ptr = PT_REGS_PARM1(ctx);
	v.ev.device = dev_arg ? (s32)gf_arg(ctx, dev_arg) : 0;
	return gf_park(&v, GF_DEVICE_PROBE_KEY + op);
}

static __always_inline void gf_set_device(u64 id, s32 device)
{
	struct gf_thread_device *t = thread_device.lookup(&id);
	if (t) {
		t->device = device;
		return;
	}
	struct gf_thread_device fresh = {};
	fresh.device = device;
	thread_device.update(&id, &fresh);
}

static __always_inline void gf_push_device(u64 id, s32 device)
{
	struct gf_thread_device *t = thread_device.lookup(&id);
	if (!t) {
		struct gf_thread_device fresh = {};
		fresh.device = device;
		fresh.depth = 1; /* below it: device 0, the default */
		thread_device.update(&id, &fresh);
		return;
	}
	u32 depth = t->depth;
	if (depth < GF_CTX_STACK)
		t->below[depth & (GF_CTX_STACK - 1)] = t->device;
	if (depth < 0xffff)
		t->depth = depth + 1;
	t->device = device;
}

static __always_inline void gf_pop_device(u64 id)
{
	struct gf_thread_device *t = thread_device.lookup(&id);
	if (!t || t->depth == 0)
		return; /* pushed before the trace began: not known */
	u32 depth = t->depth - 1;
	t->depth = depth;
	if (depth < GF_CTX_STACK)
		t->device = t->below[depth & (GF_CTX_STACK - 1)];
}

/* The device of context `c` of process `pid`, or -1 when it is not known. */
static __always_inline s32 gf_ctx_device(u32 pid, u64 c)
{
	struct gf_ctx_key key = {};
	key.ctx = c;
	key.pid = pid;
	s32 *device = ctx_device.lookup(&key);
	return device ? *device : -1;
}

static __always_inline int gf_device_finish(struct pt_regs *ctx, u32 op)
{
	struct gf_inflight_key key = {};
	u64 id = bpf_get_current_pid_tgid();
	key.pid_tgid = id;
	key.api = GF_DEVICE_PROBE_KEY + op;
	struct gf_inflight *v = inflight.lookup(&key);
	if (!v)
		return 0;
	u64 arg = v->out_ptr;
	s32 device = v->ev.device;
	inflight.delete(&key);
	if ((s32)PT_REGS_RC(ctx) != 0)
		return 0; /* failed: nothing changed */
	u32 pid = id >> 32;
	if (op == GF_DEV_SET_DEVICE) {
		gf_set_device(id, device);
	} else if (op == GF_DEV_CTX_RETAIN || op == GF_DEV_CTX_CREATE) {
		u64 c = 0;
		if (!arg || bpf_probe_read_user(&c, sizeof(c), (void *)arg) != 0 || !c)
			return 0;
		struct gf_ctx_key ck = {};
		ck.ctx = c;
		ck.pid = pid;
		ctx_device.update(&ck, &device);
		if (op == GF_DEV_CTX_CREATE)
			gf_push_device(id, device);
	} else if (op == GF_DEV_CTX_SET) {
		if (!arg) { /* cuCtxSetCurrent(NULL): the current context is unbound */
			gf_pop_device(id);
			return 0;
		}
		device = gf_ctx_device(pid, arg);
		if (device >= 0)
			gf_set_device(id, device);
	} else if (op == GF_DEV_CTX_PUSH) {
		device = gf_ctx_device(pid, arg);
		gf_push_device(id, device >= 0 ? device : gf_device_of(id));
	} else if (op == GF_DEV_CTX_POP) {
		gf_pop_device(id);
	}
	return 0;
}

#if GF_WATCH_EXEC
/* A thread that exits leaves no device behind for a later thread given its id (where exec is
 * not watched, the LRU map ages such entries out). In the exiting thread. */
RAW_TRACEPOINT_PROBE(sched_process_exit)
{
	u64 id = bpf_get_current_pid_tgid();
	thread_device.delete(&id);
	return 0;
}
#endif

/* ---- the probe programs: one family macro per shape of call -------------
 *
 * GF_PROBE_<family>(name, layer, argument) defines `<name>_entry` and, for the families
 * that complete at return, `<name>_return`. producer/probe/probes.py attaches them by these names.
 *
 * With attach cookies (GF_ATTACH_COOKIE, Linux 5.15+), one program per family serves every
 * row of it: `gf_<FAMILY>_entry` / `_return`, attached with the row's cookie, api id | argument
 * << 16 (records.Probe.cookie), the layer following from the api id. Without them, each row of
 * the probe table (events.h) has programs of its own with its values built in. A program per
 * row made 22,500 instructions for bcc to compile at every start, ~2 s (each of the 12 launch
 * rows ~1,400): per family, about a third of that.
 */
#if GF_ATTACH_COOKIE
/* `gf_cookie`: the program's cookie, read once (a helper call the compiler cannot fold). */
#define GF_COOKIE(ctx) bpf_get_attach_cookie(ctx)
#define GF_API_OF(name) ((u16)gf_cookie)
#define GF_ARG_OF(arg) ((u32)(gf_cookie >> 16))
#define GF_LAYER_OF(layer) \
	(GF_API_OF(0) >= GF_DRIVER_API_BASE ? GF_LAYER_DRIVER : GF_LAYER_RUNTIME)
#else
#define GF_COOKIE(ctx) 0
#define GF_API_OF(name) GF_API_##name
#define GF_ARG_OF(arg) (arg)
#define GF_LAYER_OF(layer) (layer)
#endif
#if GF_ATTACH_COOKIE
/* A probe at an instruction the kernel single-steps (GF_COOKIE_STEPPED in its cookie, where
 * producer/discover/entrypoint.py found nothing it emulates): its calls in scope are counted, so that
 * the summary can say what the steps cost. Elsewhere one cookie test a call. */
static __always_inline void gf_count_stepped(u64 gf_cookie)
{
	if (!(gf_cookie & GF_COOKIE_STEPPED))
		return;
	if (!gf_in_scope(bpf_get_current_pid_tgid() >> 32))
		return;
	u32 slot = GF_DROP_STEPPED;
	u64 *n = drops.lookup(&slot);
	if (n)
		*n += 1;
}
#define GF_STEPPED(cookie) gf_count_stepped(cookie)
#else
#define GF_STEPPED(cookie) do { } while (0)
#endif
/* A probe's program: its body, then a sampled call's walk (gf_py_follow, GF_PY_STACKS). */
#define GF_ENTRY(name)                                                                 \
	static __always_inline int name##_body(struct pt_regs *ctx, u64 gf_cookie);    \
	int name##_entry(struct pt_regs *ctx)                                          \
	{                                                                              \
		u64 gf_cookie = GF_COOKIE(ctx);                                        \
		(void)gf_cookie;                                                       \
		GF_STEPPED(gf_cookie);                                                 \
		int rc = name##_body(ctx, gf_cookie);                                  \
		gf_py_follow(ctx);                                                     \
		return rc;                                                             \
	}                                                                              \
	static __always_inline int name##_body(struct pt_regs *ctx, u64 gf_cookie)
#define GF_RETURN(name)                                                                \
	int name##_return(struct pt_regs *ctx)                                         \
	{                                                                              \
		u64 gf_cookie = GF_COOKIE(ctx);                                        \
		(void)gf_cookie;                                                       \
		return gf_finish(ctx, GF_API_OF(name));                                \
	}

#define GF_PROBE_LAUNCH(name, layer, arg) \
	GF_ENTRY(name) { return gf_launch(ctx, GF_LAYER_OF(layer), GF_API_OF(name)); }
#define GF_PROBE_LAUNCH_EX(name, layer, arg) \
	GF_ENTRY(name) { return gf_launch_ex(ctx, GF_LAYER_OF(layer), GF_API_OF(name)); }

/* cudaMemcpy(dst, src, count, kind) */
#define GF_PROBE_MEMCPY(name, layer, arg)                                              \
	GF_ENTRY(name) {                                                               \
		return gf_copy_sync(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),     \
				    PT_REGS_PARM3(ctx), (u32)PT_REGS_PARM4(ctx));      \
	}                                                                              \
	GF_RETURN(name)
/* cudaMemcpyAsync(dst, src, count, kind, stream) */
#define GF_PROBE_MEMCPY_ASYNC(name, layer, arg)                                        \
	GF_ENTRY(name) {                                                               \
		return gf_copy_async(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),    \
				     PT_REGS_PARM3(ctx), (u32)PT_REGS_PARM4(ctx),      \
				     PT_REGS_PARM5(ctx));                              \
	}
/* cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind=[sp+8]) */
#define GF_PROBE_MEMCPY_2D(name, layer, arg)                                           \
	GF_ENTRY(name) {                                                               \
		return gf_copy_sync(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),     \
				    PT_REGS_PARM5(ctx) * PT_REGS_PARM6(ctx),           \
				    (u32)gf_stack_arg(ctx, 0));                        \
	}                                                                              \
	GF_RETURN(name)
/* cudaMemcpy2DAsync(..., kind=[sp+8], stream=[sp+16]) */
#define GF_PROBE_MEMCPY_2D_ASYNC(name, layer, arg)                                     \
	GF_ENTRY(name) {                                                               \
		return gf_copy_async(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),    \
				     PT_REGS_PARM5(ctx) * PT_REGS_PARM6(ctx),          \
				     (u32)gf_stack_arg(ctx, 0), gf_stack_arg(ctx, 1)); \
	}
/* cuMemcpyHtoD_v2(dst, src, bytes) and the other copies of one direction (`kind`);
 * cuMemcpy(dst, src, bytes): unified addressing, direction from the pointers. */
#define GF_PROBE_COPY(name, layer, kind)                                               \
	GF_ENTRY(name) {                                                               \
		return gf_copy_sync(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),     \
				    PT_REGS_PARM3(ctx), GF_ARG_OF(kind));                         \
	}                                                                              \
	GF_RETURN(name)
/* cuMemcpyHtoDAsync_v2(dst, src, bytes, stream) */
#define GF_PROBE_COPY_ASYNC(name, layer, kind)                                         \
	GF_ENTRY(name) {                                                               \
		return gf_copy_async(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),    \
				     PT_REGS_PARM3(ctx), GF_ARG_OF(kind), PT_REGS_PARM4(ctx));    \
	}
/* cudaMemcpyPeer(dst, dstDevice, src, srcDevice, count), cuMemcpyPeer(dst, dstCtx, src,
 * srcCtx, bytes) */
#define GF_PROBE_COPY_PEER(name, layer, arg)                                           \
	GF_ENTRY(name) {                                                               \
		return gf_copy_sync(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),     \
				    PT_REGS_PARM5(ctx), GF_COPY_D2D);                  \
	}                                                                              \
	GF_RETURN(name)
/* ...Async(..., stream) */
#define GF_PROBE_COPY_PEER_ASYNC(name, layer, arg)                                     \
	GF_ENTRY(name) {                                                               \
		return gf_copy_async(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),    \
				     PT_REGS_PARM5(ctx), GF_COPY_D2D, PT_REGS_PARM6(ctx)); \
	}

/* cudaMemset(devPtr, value, count), cuMemsetD8_v2(dst, value, N): N elements of `width`
 * bytes (1, 2 or 4); ...Async(..., stream) */
#define GF_PROBE_MEMSET(name, layer, width)                                            \
	GF_ENTRY(name) {                                                               \
		return gf_memset(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),        \
				 PT_REGS_PARM3(ctx) * GF_ARG_OF(width), 0, 0);                    \
	}
#define GF_PROBE_MEMSET_ASYNC(name, layer, width)                                      \
	GF_ENTRY(name) {                                                               \
		return gf_memset(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),        \
				 PT_REGS_PARM3(ctx) * GF_ARG_OF(width), PT_REGS_PARM4(ctx), 1);   \
	}
/* cudaMemset2D(devPtr, pitch, value, width, height) / Async(..., stream) */
#define GF_PROBE_MEMSET_2D(name, layer, arg)                                           \
	GF_ENTRY(name) {                                                               \
		return gf_memset(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),        \
				 PT_REGS_PARM4(ctx) * PT_REGS_PARM5(ctx), 0, 0);       \
	}
#define GF_PROBE_MEMSET_2D_ASYNC(name, layer, arg)                                     \
	GF_ENTRY(name) {                                                               \
		return gf_memset(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),        \
				 PT_REGS_PARM4(ctx) * PT_REGS_PARM5(ctx),              \
				 PT_REGS_PARM6(ctx), 1);                               \
	}
#define GF_PROBE_MEMSET_3D(name, layer, arg) \
	GF_ENTRY(name) { return gf_memset_3d(ctx, GF_LAYER_OF(layer), GF_API_OF(name), 0, 0); }
#define GF_PROBE_MEMSET_3D_ASYNC(name, layer, arg) \
	GF_ENTRY(name) {                                                               \
		return gf_memset_3d(ctx, GF_LAYER_OF(layer), GF_API_OF(name),          \
				    PT_REGS_PARM2(ctx), 1);                            \
	}

/* cudaMalloc(ptr, size), cuMemAlloc_v2(out, bytes) and kin: `kind` is enum gf_alloc_kind */
#define GF_PROBE_ALLOC(name, layer, kind) \
	GF_ENTRY(name) { return gf_alloc(ctx, GF_LAYER_OF(layer), GF_API_OF(name), GF_ARG_OF(kind), 0); } \
	GF_RETURN(name)
/* cudaMallocAsync(ptr, size, stream), cuMemAllocAsync(out, bytes, stream) */
#define GF_PROBE_ALLOC_ASYNC(name, layer, arg)                                         \
	GF_ENTRY(name) {                                                               \
		return gf_alloc(ctx, GF_LAYER_OF(layer), GF_API_OF(name), GF_ALLOC_DEVICE_ASYNC,      \
				PT_REGS_PARM3(ctx));                                   \
	}                                                                              \
	GF_RETURN(name)
/* cudaMallocFromPoolAsync(ptr, size, pool, stream) */
#define GF_PROBE_ALLOC_POOL(name, layer, arg)                                          \
	GF_ENTRY(name) {                                                               \
		return gf_alloc(ctx, GF_LAYER_OF(layer), GF_API_OF(name), GF_ALLOC_POOL_ASYNC,        \
				PT_REGS_PARM4(ctx));                                   \
	}                                                                              \
	GF_RETURN(name)

/* cudaFree(ptr), cudaFreeHost(ptr) / cudaFreeAsync(ptr, stream), and the driver's */
#define GF_PROBE_FREE(name, layer, arg) \
	GF_ENTRY(name) {                                                               \
		return gf_free(ctx, GF_LAYER_OF(layer), GF_API_OF(name),               \
			       PT_REGS_PARM1(ctx), 0, 0);                              \
	}                                                                              \
	GF_RETURN(name)
#define GF_PROBE_FREE_ASYNC(name, layer, arg) \
	GF_ENTRY(name) {                                                               \
		return gf_free(ctx, GF_LAYER_OF(layer), GF_API_OF(name),               \
			       PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 1);             \
	}                                                                              \
	GF_RETURN(name)

/* cudaStreamSynchronize(stream), cudaDeviceSynchronize(), cudaEventSynchronize(event):
 * `scope` is enum gf_sync_scope; the stream or the event is the first argument, a
 * device-wide wait has none. */
#define GF_PROBE_SYNC(name, layer, scope)                                              \
	GF_ENTRY(name) {                                                               \
		return gf_sync(ctx, GF_LAYER_OF(layer), GF_API_OF(name), GF_ARG_OF(scope),     \
			       GF_ARG_OF(scope) == GF_SYNC_DEVICE ? 0 : PT_REGS_PARM1(ctx)); \
	}                                                                              \
	GF_RETURN(name)

#define GF_PROBE_GRAPH_LAUNCH(name, layer, arg) \
	GF_ENTRY(name) { return gf_graph_launch(ctx, GF_LAYER_OF(layer), GF_API_OF(name)); }
/* cudaStreamBeginCapture(stream, mode), cudaStreamEndCapture(stream, cudaGraph_t *),
 * cudaGraphInstantiate*(cudaGraphExec_t *, graph, ...); the driver's have the same shapes. */
#define GF_PROBE_CAPTURE_BEGIN(name, layer, arg) \
	GF_ENTRY(name) {                                                               \
		return gf_capture_begin(ctx, GF_LAYER_OF(layer), GF_API_OF(name),      \
					PT_REGS_PARM1(ctx));                           \
	}
#define GF_PROBE_CAPTURE_END(name, layer, arg)                                         \
	GF_ENTRY(name) {                                                               \
		return gf_capture_end(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),   \
				      PT_REGS_PARM2(ctx));                             \
	}                                                                              \
	GF_RETURN(name)
#define GF_PROBE_INSTANTIATE(name, layer, arg)                                         \
	GF_ENTRY(name) {                                                               \
		return gf_instantiate(ctx, GF_LAYER_OF(layer), GF_API_OF(name), PT_REGS_PARM1(ctx),   \
				      PT_REGS_PARM2(ctx));                             \
	}                                                                              \
	GF_RETURN(name)

#if GF_ATTACH_COOKIE
/* Every family of the probe table (events.h GF_API_FAMILIES). */
#define GF_FAMILY(family) GF_PROBE_##family(gf_##family, 0, 0)
GF_API_FAMILIES(GF_FAMILY)
#else
/* Every row of the probe table. */
#define GF_PROBE(name, id, layer, family, arg) GF_PROBE_##family(name, GF_LAYER_##layer, arg)
GF_API_PROBES(GF_PROBE)
#endif

/* __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun, ...):
 * nvcc's module constructor registers each kernel's host stub and mangled name. */
#define GF_NAME_PROBE_NAME(name, kind)                                                 \
	GF_ENTRY(name) {                                                               \
		return gf_name(kind, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx),           \
			       PT_REGS_PARM3(ctx));                                    \
	}
/* (handle *out, aux): __cudaGetKernel(cudaKernel_t *, hostFun) — nvcc 12.4+ stubs launch
 * by this handle; cuKernelGetFunction(CUfunction *, CUkernel); cuModuleLoadData(CUmodule *,
 * image, ...), cuModuleLoadDataEx and cuLibraryLoadData(CUlibrary *, code, ...): the
 * module's handle and image address (which file it came from, or the heap for JIT-built
 * code). */
#define GF_NAME_PROBE_HANDLE(name, kind)                                               \
	GF_ENTRY(name) {                                                               \
		return gf_name_park(kind, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0);  \
	}                                                                              \
	int name##_return(struct pt_regs *ctx) { return gf_name_finish(ctx, kind); }
/* (handle *out, aux, const char *name): cuModuleGetFunction(CUfunction *, CUmodule, name),
 * cuLibraryGetKernel(CUkernel *, CUlibrary, name) */
#define GF_NAME_PROBE_NAMED_HANDLE(name, kind)                                         \
	GF_ENTRY(name) {                                                               \
		return gf_name_park(kind, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),      \
				    PT_REGS_PARM3(ctx));                               \
	}                                                                              \
	int name##_return(struct pt_regs *ctx) { return gf_name_finish(ctx, kind); }

/* The thread's device (above): `dev_arg` is the position of the CUdevice parameter. */
#define GF_DEVICE_PROBE(name, op, dev_arg)                                             \
	GF_ENTRY(name) { return gf_device_park(ctx, op, dev_arg); }                    \
	int name##_return(struct pt_regs *ctx) { return gf_device_finish(ctx, op); }
#define GF_NAME_PROBE_SET_DEVICE(name, dev_arg) GF_DEVICE_PROBE(name, GF_DEV_SET_DEVICE, dev_arg)
#define GF_NAME_PROBE_CTX_RETAIN(name, dev_arg) GF_DEVICE_PROBE(name, GF_DEV_CTX_RETAIN, dev_arg)
#define GF_NAME_PROBE_CTX_CREATE(name, dev_arg) GF_DEVICE_PROBE(name, GF_DEV_CTX_CREATE, dev_arg)
#define GF_NAME_PROBE_CTX_SET(name, dev_arg) GF_DEVICE_PROBE(name, GF_DEV_CTX_SET, dev_arg)
#define GF_NAME_PROBE_CTX_PUSH(name, dev_arg) GF_DEVICE_PROBE(name, GF_DEV_CTX_PUSH, dev_arg)
#define GF_NAME_PROBE_CTX_POP(name, dev_arg) GF_DEVICE_PROBE(name, GF_DEV_CTX_POP, dev_arg)

#define GF_NAME_PROBE(name, layer, family, kind) GF_NAME_PROBE_##family(name, kind)
GF_NAME_PROBES(GF_NAME_PROBE)

/* ---- dlopens that map nothing that matters -------------------------------- */

/* Most dlopens of a program start-up map files that define nothing gpuflight probes (Python's
 * extension modules, libtorch_cpu, ...). User space tells which (producer/discover/verdictcache.py keeps
 * the verdicts across runs) in `quiet_files`. Here, each executable file mapping a process in
 * scope makes of a file not known to be quiet marks its thread in `loads_pending`; the
 * loader's RT_CONSISTENT call (below) notifies, and holds, only a thread so marked — the
 * thread that mapped the files is the one whose dlopen reports them. A dlopen of quiet files
 * only is let through, counted in GF_DROP_QUIET_LOADS. Anything unsure (a walk that fails, a
 * file not in the map, a mapping by other code than the loader) marks the thread: at worst a
 * hold that was not needed. A file written since it was classified has another change time,
 * so another key: it is held and classified again. The walk's offsets come from the running
 * kernel's BTF (producer/probe/btf.py FileOffsets); without them every dlopen notifies, as without
 * the filter. */
#if GF_QUIET_LOADS && defined(GF_FILE_OFF_TASK_FILES)
#define GF_QUIET 1
#define GF_PROT_EXEC 4
#ifndef GF_QUIET_FILES_MAX
#define GF_QUIET_FILES_MAX 32768
#endif
BPF_HASH(quiet_files, struct gf_file_id, u8, GF_QUIET_FILES_MAX);
BPF_TABLE("lru_hash", u32, u8, loads_pending, 16384);

/* task->files->fdt->fd[fd]->f_inode: its number, size and change time, and its superblock's
 * dev_t. */
static __always_inline int gf_file_of_fd(s32 fd, struct gf_file_id *id)
{
	u8 *task = (u8 *)bpf_get_current_task();
	u8 *files = 0, *fdt = 0, *fds = 0, *file = 0, *inode = 0, *sb = 0;
	u32 max_fds = 0, dev = 0, nsec = 0;
	s64 sec = 0;
	if (fd < 0)
		return -1;
	if (bpf_probe_read_kernel(&files, sizeof(files), task + GF_FILE_OFF_TASK_FILES) || !files)
		return -1;
	if (bpf_probe_read_kernel(&fdt, sizeof(fdt), files + GF_FILE_OFF_FILES_FDT) || !fdt)
		return -1;
	if (bpf_probe_read_kernel(&max_fds, sizeof(max_fds), fdt + GF_FILE_OFF_FDT_MAX_FDS) ||
	    (u32)fd >= max_fds)
		return -1;
	if (bpf_probe_read_kernel(&fds, sizeof(fds), fdt + GF_FILE_OFF_FDT_FD) || !fds)
		return -1;
	if (bpf_probe_read_kernel(&file, sizeof(file), fds + 8 * (u64)(u32)fd) || !file)
		return -1;
	if (bpf_probe_read_kernel(&inode, sizeof(inode), file + GF_FILE_OFF_FILE_INODE) || !inode)
		return -1;
	if (bpf_probe_read_kernel(&id->ino, sizeof(id->ino), inode + GF_FILE_OFF_INODE_INO) ||
	    bpf_probe_read_kernel(&id->size, sizeof(id->size), inode + GF_FILE_OFF_INODE_SIZE) ||
	    bpf_probe_read_kernel(&sec, sizeof(sec), inode + GF_FILE_OFF_INODE_CTIME_SEC) ||
	    bpf_probe_read_kernel(&nsec, sizeof(nsec), inode + GF_FILE_OFF_INODE_CTIME_NSEC))
		return -1;
	/* Linux 6.13+ keeps a flag in the top bit of i_ctime_nsec (multigrain timestamps). */
	id->ctime_ns = sec * 1000000000 + (nsec & 0x3fffffff);
	if (bpf_probe_read_kernel(&sb, sizeof(sb), inode + GF_FILE_OFF_INODE_SB) || !sb)
		return -1;
	if (bpf_probe_read_kernel(&dev, sizeof(dev), sb + GF_FILE_OFF_SB_DEV))
		return -1;
	id->dev = dev;
	return 0;
}

/* mmap(2), from the raw sys_enter tracepoint (below): the registers it was called with. */
static __always_inline int gf_on_mmap(struct pt_regs *regs)
{
	u64 prot = 0;
	s64 fd = -1;
	if (bpf_probe_read_kernel(&prot, sizeof(prot), &PT_REGS_PARM3(regs)) ||
	    bpf_probe_read_kernel(&fd, sizeof(fd), &PT_REGS_PARM5(regs)))
		return 0;
	if (!(prot & GF_PROT_EXEC) || (s32)fd < 0)
		return 0;
	u64 id = bpf_get_current_pid_tgid();
	if (!gf_in_scope(id >> 32))
		return 0;
	struct gf_file_id file = {};
	if (gf_file_of_fd((s32)fd, &file) == 0 && quiet_files.lookup(&file))
		return 0;
	u32 tid = (u32)id;
	u8 one = 1;
	loads_pending.update(&tid, &one);
	return 0;
}

/* Whether the calling thread's link map change is one to notify: it mapped a file not known to
 * be quiet since it last notified. */
static __always_inline int gf_load_pending(void)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id;
	if (loads_pending.lookup(&tid)) {
		loads_pending.delete(&tid);
		return 1;
	}
	if (gf_in_scope(id >> 32))
		gf_count_drop(GF_DROP_QUIET_LOADS, id >> 32);
	return 0;
}
#endif

/* ---- the dynamic loader ------------------------------------------------ */

/* ld.so calls _dl_debug_state() whenever its link map changes (start-up,
 * dlopen, dlclose), after mapping a library and before running any of its
 * code. User space rescans the process then; a process in scope is also held
 * (SIGSTOP) until that rescan has attached to what it mapped, so not even its
 * first call is missed. The stop is sent only once the notification is
 * queued, so a held process is always released: by user space, or, where the tracer dies
 * holding it, by its watchdog (below). */
#if GF_FILTER_PIDS && GF_HOLD_ON_LOAD
#define GF_HOLDS 1
/* The holds not yet over, each by its notification: user space deletes one once it has
 * continued the process (producer/capture.py); the watchdog that outlives a tracer killed
 * meanwhile continues those left (producer/probe/holdguard.py), and no other process: one the user
 * stopped (Ctrl-Z) is not in it. A hold the map has no room for is not made. */
BPF_HASH(holds, struct gf_loader_event, u8, 4096);
#endif

static __always_inline int gf_loader_notify(u16 reason)
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
		gf_count_drop(GF_DROP_LOADER, pid);
		return 0;
	}
	u64 now = bpf_ktime_get_ns();
#ifdef GF_HOLDS
	if (held) {
		struct gf_loader_event hold = {.pid = pid, .held = 1, .reason = reason, .ts_ns = now};
		u8 one = 1;
		if (holds.update(&hold, &one) != 0)
			held = 0;
	}
#endif
	e->pid = pid;
	e->held = held;
	e->reason = reason;
	e->ts_ns = now;
	if (held)
		bpf_send_signal(GF_SIGSTOP);
	loader_events.ringbuf_submit(e, 0);
	return 0;
}

#if GF_PY_STACKS
/* A walked Python process is about to exit (CPython's Py_FinalizeEx, then libc's _exit; or
 * _exit alone: os._exit): the code objects its stacks' frames point to go with it, and user
 * space reads them when the frames arrive (a thread woken for it). A trace holds the process
 * there like a dlopen (GF_LOADER_EXIT) until it has read every stack sent before, if it sent
 * one since it was last held so (py_fresh): a script that launches from new code and exits
 * at once still gets its names; a process that sent none is not held. */
int gf_exit_hold(struct pt_regs *ctx)
{
#ifdef GF_HOLDS
	u32 pid = bpf_get_current_pid_tgid() >> 32;
	if (py_fresh.lookup(&pid)) {
		py_fresh.delete(&pid); /* a stack sent after this holds the next exit point */
		gf_loader_notify(GF_LOADER_EXIT);
	}
#endif
	return 0;
}
#endif

/* ld.so calls _dl_debug_state() twice per dlopen that maps something: with r_state RT_ADD
 * before it maps anything (nothing to attach to yet: not a notification, not a hold), then
 * RT_CONSISTENT once every object is mapped, before any of their code runs. The attach
 * cookie is the distance from _dl_debug_state to its loader's _r_debug.r_state (the same
 * load bias); 0 where user space could not tell, or attached without cookies: every call
 * notifies then. */
#define GF_RT_CONSISTENT 0
int on_loader_change(struct pt_regs *ctx)
{
#if GF_ATTACH_COOKIE /* bpf_get_attach_cookie: Linux 5.15 */
	s64 to_state = (s64)bpf_get_attach_cookie(ctx);
	if (to_state) {
		s32 state = GF_RT_CONSISTENT;
		if (bpf_probe_read_user(&state, sizeof(state),
					(void *)(PT_REGS_IP(ctx) + to_state)) == 0 &&
		    state != GF_RT_CONSISTENT)
			return 0;
	}
#endif
#ifdef GF_QUIET
	if (!gf_load_pending())
		return 0;
#endif
	return gf_loader_notify(GF_LOADER_MAPPED);
}

#if GF_WATCH_EXEC
/* A new image: its own loader (a container's, say) or a static runtime in the
 * executable is mapped before any of its code runs. In the task that exec'd. */
RAW_TRACEPOINT_PROBE(sched_process_exec) { return gf_loader_notify(GF_LOADER_MAPPED); }
#endif

/* Every system call of the machine enters here while the program is attached (only trace
 * attaches it: a process in scope is held), so the call's number is looked at first. trace:
 * mmap(2) for the quiet-load filter (above); listen(2), as the HTTP capture is set up when a
 * process in scope first listens, held meanwhile (nothing is accepted before a listen); user
 * space releases later ones at once. A 32-bit task's numbers are its own table's, read as
 * this one's: at worst a hold not needed. */
#if defined(GF_QUIET) || GF_HOLD_ON_LISTEN
RAW_TRACEPOINT_PROBE(sys_enter)
{
	long nr = (long)ctx->args[1];
#ifdef GF_QUIET
	if (nr == __NR_mmap)
		return gf_on_mmap((struct pt_regs *)ctx->args[0]);
#endif
#if GF_HOLD_ON_LISTEN
	if (nr == __NR_listen)
		return gf_loader_notify(GF_LOADER_LISTEN);
#endif
	return 0;
}
#endif

#if GF_FOLLOW_FORKS
/* Children of processes in scope are in scope from their first instruction. In the parent. */
static __always_inline int gf_on_fork(u32 child)
{
	u32 parent = bpf_get_current_pid_tgid() >> 32;
	if (!scope_pids.lookup(&parent))
		return 0;
	u8 one = 1;
	scope_pids.update(&child, &one);
	return 0;
}

#ifdef GF_TASK_OFF_PID
/* The raw arguments: the parent's task_struct, then the child's. */
RAW_TRACEPOINT_PROBE(sched_process_fork)
{
	u32 child = 0;
	if (bpf_probe_read_kernel(&child, sizeof(child), (u8 *)ctx->args[1] + GF_TASK_OFF_PID))
		return 0;
	return gf_on_fork(child);
}
#else
TRACEPOINT_PROBE(sched, sched_process_fork) { return gf_on_fork(args->child_pid); }
#endif
#endif
