/* Test glue for bpf/pywalk.bpf.h (tests/system/test_pywalk.py): a uprobe on a function a
 * Python workload calls through ctypes samples its calls (py_config[0]: the period), walks
 * the caller's Python stack on a sampled one, and sends the sample: its head on py_samples,
 * and its stack's frames on py_frames the first time the stack is seen. No wake-up (a wake-up a sample cost ~5 us): the reader
 * takes them when it looks. */
#include <uapi/linux/ptrace.h>
#include "pywalk.bpf.h"

BPF_HASH(py_procs, u32, struct gf_py_offsets, 64);
BPF_ARRAY(py_config, u32, 1);
BPF_HASH(py_countdown, u64, u32, 1024);
BPF_HASH(py_seen, u64, u8, 65536);
BPF_PERCPU_ARRAY(py_scratch, struct gf_py_stack, 1);
BPF_RINGBUF_OUTPUT(py_samples, 1024);
BPF_RINGBUF_OUTPUT(py_frames, 1024);

#define GF_PY_HEAD_BYTES offsetof(struct gf_py_stack, code)

int on_point(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32;
	struct gf_py_offsets *o = py_procs.lookup(&pid);
	if (!o)
		return 0;
	u32 zero = 0, start = 0;
	u32 *period = py_config.lookup(&zero);
	u32 *left = py_countdown.lookup_or_try_init(&id, &start);
	if (!period || !left)
		return 0;
	u32 weight = gf_py_sampled(left, *period);
	if (!weight)
		return 0;
	struct gf_py_stack *s = py_scratch.lookup(&zero);
	if (!s)
		return 0;
	s->ts_ns = bpf_ktime_get_ns();
	s->pid = pid;
	s->tid = (u32)id;
	u64 tstate = gf_py_thread_state(o, (u32)id, gf_py_fsbase(), 0);
	gf_py_walk(o, tstate, gf_py_top(o, tstate), s);
	s->weight = weight;
	s->caller = 0; /* (the capture's: the probed call's return address) */
	s->pending = 0;
	s->stack_id = gf_py_hash(s);
	u8 one = 1;
	if (!py_seen.lookup(&s->stack_id)) {
		py_seen.update(&s->stack_id, &one);
		s->flags |= GF_PY_NEW;
		py_frames.ringbuf_output(s, sizeof(*s) - sizeof(s->frame), BPF_RB_NO_WAKEUP);
	}
	py_samples.ringbuf_output(s, GF_PY_HEAD_BYTES, BPF_RB_NO_WAKEUP);
	return 0;
}
