/* Test glue for bpf/pywalk.bpf.h (tests/system/test_pywalk.py): a uprobe on a function a
 * Python workload calls through ctypes walks the caller's Python stack and sends it whole. */
#include <uapi/linux/ptrace.h>
#include "pywalk.bpf.h"

BPF_HASH(py_procs, u32, struct gf_py_offsets, 64);
BPF_PERCPU_ARRAY(py_scratch, struct gf_py_stack, 1);
BPF_RINGBUF_OUTPUT(py_stacks, 64);

int on_point(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32;
	struct gf_py_offsets *o = py_procs.lookup(&pid);
	if (!o)
		return 0;
	u32 zero = 0;
	struct gf_py_stack *s = py_scratch.lookup(&zero);
	if (!s)
		return 0;
	s->ts_ns = bpf_ktime_get_ns();
	s->pid = pid;
	s->tid = (u32)id;
	gf_py_walk(o, gf_py_thread_state(o, (u32)id, 0), s);
	py_stacks.ringbuf_output(s, sizeof(*s) - sizeof(s->frame), 0);
	return 0;
}
