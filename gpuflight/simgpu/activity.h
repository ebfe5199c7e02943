/* gpuflight simulated GPU: the activity log the driver writes and the simulated NVML reads.
 *
 * With GF_SIM_NVML_DIR set and the real-time timing model on (timing.h), each process that
 * uses the simulated driver maps GF_SIM_NVML_DIR/activity.<pid> and appends one record per
 * kernel it enqueues: the device, and when the kernel runs on the device's timeline
 * (CLOCK_MONOTONIC ns). The driver stores `count` with release order after the record; the
 * reader loads it with acquire order. No system call per kernel: the file is a shared mapping.
 * A full log (ACT_CAP kernels) stops growing; `dropped` counts the kernels not logged.
 */
#ifndef GF_ACTIVITY_H
#define GF_ACTIVITY_H

#include <stdint.h>

#define ACT_MAGIC 0x31544341u /* "ACT1" */
#define ACT_CAP (1u << 18)
#define ACT_NAME "activity."

struct act_rec {
	uint32_t device;
	uint32_t reserved;
	uint64_t start_ns;
	uint64_t end_ns;
};

struct act_log {
	uint32_t magic;
	uint32_t pid;
	uint64_t count;   /* records written (release) */
	uint64_t dropped; /* kernels not logged: the log was full */
	uint64_t reserved;
	struct act_rec rec[ACT_CAP];
};

#endif
