/* bench/lower_bound.py: the least a probe that records each call can do — the clock, the
 * driver's stacked arguments (one read), an 88-byte struct gf_event, no filter, no lookup —
 * in the ring (`least_record`) or in a slot of its CPU's buffer as gpuflight writes them
 * (`least_record_cpu`, bpf/cudart.bpf.c GF_CPU_SLOTS: compare-and-swap of the head, the stamp
 * last; the ring when the buffer is full), and the empty program (the floor), all loaded for
 * uprobe_multi links. */
#include <uapi/linux/ptrace.h>
#include "events.h"

#define SLOTS 4096

BPF_RINGBUF_OUTPUT(events, 4096); /* 16 MiB */
BPF_F_TABLE("array", u32, struct gf_slot, cpu_events, GF_NCPUS * SLOTS, BPF_F_MMAPABLE);
BPF_F_TABLE("array", u32, struct gf_cpu_head, cpu_heads, GF_NCPUS, BPF_F_MMAPABLE);
/* Events the per-CPU recorder could not place (its buffer and the ring full). */
BPF_ARRAY(unplaced, u64, 1);

static __always_inline void fill(struct pt_regs *ctx, struct gf_event *ev, u64 *stacked)
{
	u64 id = bpf_get_current_pid_tgid();
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->ts_ns = bpf_ktime_get_ns();
	ev->pid = id >> 32;
	ev->tid = (u32)id;
	ev->type = GF_EV_LAUNCH;
	ev->dim[0] = (u32)PT_REGS_PARM2(ctx);
	ev->dim[1] = (u32)PT_REGS_PARM3(ctx);
	ev->dim[2] = (u32)PT_REGS_PARM4(ctx);
	ev->dim[3] = (u32)PT_REGS_PARM5(ctx);
	ev->dim[4] = (u32)PT_REGS_PARM6(ctx);
	ev->dim[5] = (u32)stacked[1];
	ev->bytes = (u32)stacked[2];
	ev->stream = stacked[3];
	ev->handle = PT_REGS_PARM1(ctx);
}

/* cuLaunchKernel(f, gx, gy, gz, bx, by, bz=[sp+8], sharedMem=[sp+16], stream=[sp+24], ...) */
int least_record(struct pt_regs *ctx)
{
	u64 stacked[4] = {}; /* return address, bz, sharedMem, stream */
	bpf_probe_read_user(stacked, sizeof(stacked), (void *)PT_REGS_SP(ctx));
	struct gf_event *ev = events.ringbuf_reserve(sizeof(struct gf_event));
	if (!ev)
		return 0;
	fill(ctx, ev, stacked);
	events.ringbuf_submit(ev, BPF_RB_NO_WAKEUP);
	return 0;
}

int least_record_cpu(struct pt_regs *ctx)
{
	u64 stacked[4] = {};
	bpf_probe_read_user(stacked, sizeof(stacked), (void *)PT_REGS_SP(ctx));
	u32 cpu = bpf_get_smp_processor_id(), first = 0;
	struct gf_cpu_head *h = cpu_heads.lookup(&cpu);
	if (!h)
		return 0;
	u64 head = h->head;
	u32 index = cpu * SLOTS + (u32)(head & (SLOTS - 1));
	struct gf_slot *s = cpu_events.lookup(&index);
	if (!s || head - h->tail >= SLOTS ||
	    __sync_val_compare_and_swap(&h->head, head, head + 1) != head) {
		/* As gpuflight does: the ring takes what the CPU's buffer cannot. */
		struct gf_event *ev = events.ringbuf_reserve(sizeof(struct gf_event));
		if (!ev) {
			u64 *n = unplaced.lookup(&first);
			if (n)
				__sync_fetch_and_add(n, 1);
			return 0;
		}
		fill(ctx, ev, stacked);
		events.ringbuf_submit(ev, BPF_RB_NO_WAKEUP);
		return 0;
	}
	fill(ctx, &s->ev, stacked);
	asm volatile("" ::: "memory");
	s->committed = head + 1;
	return 0;
}

int empty_multi(struct pt_regs *ctx) { return 0; }
