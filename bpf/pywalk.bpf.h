/* gpuflight: the calling thread's Python stack, read in the kernel (issue 28: code paths).
 *
 * The walk of producer/decode/pystacks.py (its reference, which the tests hold it to):
 * _PyRuntime → its first interpreter → the caller's thread state → its current frame → each
 * frame's code object and instruction → the frame before, at most GF_PY_MAX_DEPTH frames.
 * CPython 3.11+ (`_PyInterpreterFrame`s): the thread state is the one whose native thread id
 * is the caller's; the instruction is a pointer into the code; shim frames (owned by the C
 * stack) are left out. 3.9/3.10 (`PyFrameObject`s): the thread state is the one whose
 * `thread_id` (pthread_self(): on x86-64 the thread pointer, the task's fsbase, at
 * GF_TASK_OFF_FSBASE from the running kernel's BTF; without it no 3.9/3.10 thread is found)
 * is the caller's; the instruction is `f_lasti`, an int. Every read is bpf_probe_read_user: a
 * read that fails, or a frame seen twice in a row, ends the walk, flagged. Where the offsets
 * come from, per process: producer/discover/pythons.py (`_Py_DebugOffsets`, or its table).
 *
 * Helpers only: no maps here (bcc rewrites map calls only in the file it compiles). The
 * caller looks up the process's offsets and hands a per-CPU scratch record to fill.
 */
#ifndef GF_PYWALK_BPF_H
#define GF_PYWALK_BPF_H

#ifndef GF_PY_MAX_DEPTH
#define GF_PY_MAX_DEPTH 64
#endif
#ifndef GF_PY_MAX_THREADS
#define GF_PY_MAX_THREADS 64
#endif
/* Bytes of a frame read at once: every field the walk needs lies in an interpreter frame's
 * first 80, in a frame object's first 112 (f_lasti at 104 on 3.9); the scratch they are read
 * into covers any offset under 128 (each is masked so). */
#define GF_PY_FRAME_BYTES 80
#define GF_PY_OBJECT_BYTES 112
#define GF_PY_SCRATCH_BYTES 136
#define GF_PY_NONE 0xffff
#define GF_PY_OWNED_BY_CSTACK 3

/* Flags of a walk. */
#define GF_PY_TRUNCATED 1 /* more frames than GF_PY_MAX_DEPTH, a failed read, or a cycle */
#define GF_PY_NO_THREAD 2 /* no thread state of the caller (not a Python thread yet) */
#define GF_PY_NEW 4       /* the first sample of this stack: its frames follow the head */
#define GF_PY_NO_PYTHON 8 /* a process with no CPython known: its native caller alone */
#define GF_PY_BACKWARD 16 /* the frames of the thread that entered the autograd engine */

/* A process's layout (producer/discover/pythons.py PyLayout; GF_PY_NONE: not there). */
struct gf_py_offsets {
	u64 runtime; /* the address of _PyRuntime in the process */
	u16 interpreters_head;
	u16 threads_head;
	u16 tstate_next;
	u16 tstate_native_thread_id;
	u16 tstate_cframe;
	u16 cframe_current_frame;
	u16 tstate_current_frame;
	u16 frame_previous;
	u16 frame_code;
	u16 frame_instr;
	u16 frame_owner;
	u16 tstate_thread_id; /* 3.9/3.10: pthread_self() of the thread (GF_PY_NONE on 3.11+) */
	u16 instr_bytes;      /* 8: a pointer into the code (3.11+); 4: f_lasti (3.9/3.10) */
	u16 pad[3];
};

/* One walk: its head (what every sample sends), then its frames innermost first (code
 * object, instruction pointer; sent with a stack's first sample only, GF_PY_NEW). */
struct gf_py_stack {
	u64 ts_ns;
	u32 pid;
	u32 tid;
	u64 tstate;
	u32 depth;
	u32 flags;
	u64 stack_id; /* gf_py_hash: the same frames of the same process, the same id */
	u64 caller;   /* the probed call's return address: its native caller */
	u32 weight;   /* 1/p: the calls this sample stands for */
	u32 pending;  /* (the capture's scratch: a walk is to follow; 0 when sent) */
	u64 code[GF_PY_MAX_DEPTH];
	u64 instr[GF_PY_MAX_DEPTH];
	u8 frame[GF_PY_SCRATCH_BYTES]; /* scratch: the frame read last */
};

static __always_inline u64 gf_py_read(u64 address)
{
	u64 value = 0;
	if (bpf_probe_read_user(&value, sizeof(value), (void *)address) < 0)
		return 0;
	return value;
}

/* The calling thread's thread pointer (pthread_self() on x86-64), 0 if not known. */
static __always_inline u64 gf_py_fsbase(void)
{
	u64 fsbase = 0;
#ifdef GF_TASK_OFF_FSBASE
	bpf_probe_read_kernel(&fsbase, sizeof(fsbase),
			      (u8 *)bpf_get_current_task() + GF_TASK_OFF_FSBASE);
#endif
	return fsbase;
}

/* The thread state of thread `tid` (whose thread pointer is `fsbase`): `hint` (a cache's
 * word) if it is still that thread's, else found in the interpreter's list; 0 if none. */
static __always_inline u64 gf_py_thread_state(const struct gf_py_offsets *o, u32 tid,
					      u64 fsbase, u64 hint)
{
	u64 want = tid;
	u16 at = o->tstate_native_thread_id;
	if (at == GF_PY_NONE) { /* 3.9/3.10: by pthread_self(), the thread pointer */
		at = o->tstate_thread_id;
		want = fsbase;
		if (at == GF_PY_NONE || !want)
			return 0;
	}
	if (hint && gf_py_read(hint + at) == want)
		return hint;
	u64 interp = gf_py_read(o->runtime + o->interpreters_head);
	if (!interp)
		return 0;
	u64 tstate = gf_py_read(interp + o->threads_head);
	for (int i = 0; i < GF_PY_MAX_THREADS && tstate; i++) {
		if (gf_py_read(tstate + at) == want)
			return tstate;
		tstate = gf_py_read(tstate + o->tstate_next);
	}
	return 0;
}

/* The innermost frame of thread state `tstate` (0: none, a thread not running Python). */
static __always_inline u64 gf_py_top(const struct gf_py_offsets *o, u64 tstate)
{
	if (!tstate)
		return 0;
	if (o->tstate_cframe != GF_PY_NONE) {
		u64 cframe = gf_py_read(tstate + o->tstate_cframe);
		return cframe ? gf_py_read(cframe + o->cframe_current_frame) : 0;
	}
	return gf_py_read(tstate + o->tstate_current_frame);
}

/* The instruction frame `frame` is at (a pointer into its code, or f_lasti). */
static __always_inline u64 gf_py_instr(const struct gf_py_offsets *o, u64 frame)
{
	u64 instr = gf_py_read(frame + o->frame_instr);
	return o->instr_bytes == 4 ? (u32)instr : instr;
}

/* Fill `s` (its pid, tid and ts_ns set by the caller) with the frames of thread state
 * `tstate` from its frame `frame` (gf_py_top) outwards: frame i of the chain at index i, a
 * shim frame (owned by the C stack) with code 0 (user space skips those). One index for both
 * keeps the verifier's work linear in the bound: a separate count of kept frames made its
 * states grow with each step, and 64 steps were over its budget (bcc 0.26 cannot pass
 * bpf_loop a callback). */
static __always_inline void gf_py_walk(const struct gf_py_offsets *o, u64 tstate, u64 frame,
				       struct gf_py_stack *s)
{
	s->tstate = tstate;
	s->depth = 0;
	s->flags = 0;
	if (!tstate) {
		s->flags = GF_PY_NO_THREAD;
		return;
	}
	u64 last = 0;
	u32 i;
	int objects = o->instr_bytes == 4;
	for (i = 0; i < GF_PY_MAX_DEPTH; i++) {
		if (!frame)
			break;
		long read = objects ? bpf_probe_read_user(s->frame, GF_PY_OBJECT_BYTES, (void *)frame)
				    : bpf_probe_read_user(s->frame, GF_PY_FRAME_BYTES, (void *)frame);
		if (frame == last || read < 0) {
			s->flags |= GF_PY_TRUNCATED;
			break;
		}
		last = frame;
		u8 owner = objects ? 0 : s->frame[o->frame_owner & 0x7f];
		s->code[i] = owner == GF_PY_OWNED_BY_CSTACK ? 0 : *(u64 *)&s->frame[o->frame_code & 0x7f];
		s->instr[i] = objects ? *(u32 *)&s->frame[o->frame_instr & 0x7f]
				      : *(u64 *)&s->frame[o->frame_instr & 0x7f];
		frame = *(u64 *)&s->frame[o->frame_previous & 0x7f];
	}
	if (i == GF_PY_MAX_DEPTH && frame)
		s->flags |= GF_PY_TRUNCATED;
	s->depth = i;
}

/* The id of a walk's stack: FNV-1a over the process, the flags that change what it means,
 * and each frame's code object and instruction. */
static __always_inline u64 gf_py_hash(const struct gf_py_stack *s)
{
	u64 h = 0xcbf29ce484222325ULL;
	h = (h ^ s->pid) * 0x100000001b3ULL;
	h = (h ^ (s->flags & (GF_PY_TRUNCATED | GF_PY_NO_THREAD | GF_PY_NO_PYTHON |
			      GF_PY_BACKWARD))) *
	    0x100000001b3ULL;
	h = (h ^ s->caller) * 0x100000001b3ULL;
	for (u32 i = 0; i < GF_PY_MAX_DEPTH; i++) {
		if (i >= s->depth)
			break;
		h = (h ^ s->code[i]) * 0x100000001b3ULL;
		h = (h ^ s->instr[i]) * 0x100000001b3ULL;
	}
	return h;
}

/* Sampling: each thread counts its probed calls down (`left`, its entry of a per-thread
 * map); the call that reaches 0 is sampled, and the next gap drawn uniformly from
 * [1, 2*period - 1] (mean `period`: the sample stands for `period` calls, an unbiased
 * estimate). A period of 1 samples every call (exact). Returns the sample's weight, or 0. */
static __always_inline u32 gf_py_sampled(u32 *left, u32 period)
{
	if (period <= 1)
		return 1;
	if (*left > 1) {
		*left -= 1;
		return 0;
	}
	*left = 1 + bpf_get_prandom_u32() % (2 * period - 1);
	return period;
}

#endif /* GF_PYWALK_BPF_H */
