/* gpuflight simulated GPU: the timeline of one device (included once, by driver.c).
 *
 * Two modes, chosen once at load:
 *   virtual (default)  work costs no CPU time and nothing waits; a simulated clock
 *                      advances by each kernel's and transfer's modeled duration,
 *                      and events stamp that clock: elapsed times are small,
 *                      positive and deterministic.
 *   real-time          when any of the variables below is set: on the wall clock (the
 *                      demo's model: gpuflight/demo/build.py sets GF_SIM_LAUNCH_NS).
 *                      A launch enqueues its kernel at call entry, then busy-spins
 *                      GF_SIM_LAUNCH_NS; synchronous copies and memsets wait for the
 *                      timeline and take bytes / bandwidth; syncs wait for it.
 * Model (both modes): kernel = GF_SIM_KERNEL_BASE_NS (600) + threads *
 * GF_SIM_NS_PER_THREAD (0.04); transfers at GF_SIM_H2D_GBPS / GF_SIM_D2H_GBPS (12),
 * GF_SIM_D2D_GBPS (600, also memsets and peer copies), GF_SIM_H2H_GBPS (20);
 * GF_SIM_DEFAULT_GBPS (20) is accepted for compatibility. GF_SIM_LAUNCH_NS default
 * 4000 in real-time mode, 0 in virtual mode.
 * GF_SIM_REPORT=PATH appends at exit one JSON line over all devices:
 *   {"kernels":N,"gpu_busy_ns":B,"span_ns":S,"utilization":B/S}
 */
#ifndef GF_TIMING_H
#define GF_TIMING_H

#define SPIN_NS 50000ull

struct timeline {
	pthread_mutex_t lock;
	int device;
	double busy_until; /* end of the last enqueued work, ns (wall or virtual) */
	double first_start;
	double busy_ns;
	unsigned long long kernels;
	int started;
};

static int tm_real;
/* The activity log for the simulated NVML (activity.h), or NULL; and the kernel time this
 * thread has enqueued (gfsim_thread_kernel_ns: a workload's ground truth per request). */
static struct act_log *tm_act;
static __thread double tm_thread_kernel_ns;
static void activity_open(void);
static double tm_launch_ns = 4000, tm_kernel_base_ns = 600, tm_ns_per_thread = 0.04;
static double tm_bw[SIM_DIR_COUNT] = {12.0, 12.0, 600.0, 20.0, 600.0};
static char tm_report[4096];

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int env_num(const char *name, double *out, int positive)
{
	const char *s = getenv(name);
	char *end;
	double v;

	if (!s || !*s)
		return 0;
	v = strtod(s, &end);
	if (*end || !(v >= 0.0) || (positive && v == 0.0))
		return 1; /* set (so real-time mode), but unusable: keep the default */
	*out = v;
	return 1;
}

static void timing_report(void);

static void timing_configure(void)
{
	int set = 0;
	double dflt = 20.0;
	const char *r = getenv("GF_SIM_REPORT");

	set |= env_num("GF_SIM_LAUNCH_NS", &tm_launch_ns, 0);
	set |= env_num("GF_SIM_KERNEL_BASE_NS", &tm_kernel_base_ns, 0);
	set |= env_num("GF_SIM_NS_PER_THREAD", &tm_ns_per_thread, 0);
	set |= env_num("GF_SIM_H2D_GBPS", &tm_bw[SIM_H2D], 1);
	set |= env_num("GF_SIM_D2H_GBPS", &tm_bw[SIM_D2H], 1);
	set |= env_num("GF_SIM_D2D_GBPS", &tm_bw[SIM_D2D], 1);
	set |= env_num("GF_SIM_H2H_GBPS", &tm_bw[SIM_H2H], 1);
	set |= env_num("GF_SIM_DEFAULT_GBPS", &dflt, 1);
	tm_bw[SIM_PEER] = tm_bw[SIM_D2D];
	if (r && *r && strlen(r) < sizeof(tm_report)) {
		strcpy(tm_report, r);
		set = 1;
	}
	tm_real = set;
	if (!tm_real)
		tm_launch_ns = 0;
	activity_open();
	if (tm_report[0])
		atexit(timing_report);
}

static void timeline_init(struct timeline *t, int device)
{
	memset(t, 0, sizeof(*t));
	pthread_mutex_init(&t->lock, NULL);
	t->device = device;
}

/* Map GF_SIM_NVML_DIR/activity.<pid> (real-time mode only: virtual time is no device time). A
 * forked child calls it again for its own file. Any failure leaves the log off. */
static void activity_open(void)
{
	const char *dir = getenv("GF_SIM_NVML_DIR");
	char path[4096];
	struct act_log *log;
	int fd;

	if (tm_act) {
		munmap(tm_act, sizeof(*tm_act));
		tm_act = NULL;
	}
	if (!tm_real || !dir || !*dir)
		return;
	if (snprintf(path, sizeof(path), "%s/" ACT_NAME "%d", dir, (int)getpid()) >=
	    (int)sizeof(path))
		return;
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (ftruncate(fd, sizeof(*log)) != 0) {
		close(fd);
		return;
	}
	log = mmap(NULL, sizeof(*log), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (log == MAP_FAILED)
		return;
	log->pid = (uint32_t)getpid();
	__atomic_store_n(&log->magic, ACT_MAGIC, __ATOMIC_RELEASE);
	tm_act = log;
}

/* Log a kernel's slot on the device (called with the timeline's lock held). */
static void activity_kernel(const struct timeline *t, double start, double end)
{
	struct act_log *log = tm_act;
	uint64_t n;

	if (!log)
		return;
	n = log->count;
	if (n >= ACT_CAP) {
		log->dropped++;
		return;
	}
	log->rec[n].device = (uint32_t)t->device;
	log->rec[n].start_ns = (uint64_t)start;
	log->rec[n].end_ns = (uint64_t)end;
	__atomic_store_n(&log->count, n + 1, __ATOMIC_RELEASE);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static void wait_until(double deadline)
{
	for (;;) {
		uint64_t now = now_ns();

		if ((double)now >= deadline)
			return;
		if (deadline - (double)now > (double)SPIN_NS) {
			uint64_t wake = (uint64_t)deadline - SPIN_NS;
			struct timespec ts = {
				.tv_sec = (time_t)(wake / 1000000000ull),
				.tv_nsec = (long)(wake % 1000000000ull),
			};

			clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
		} else {
			cpu_relax();
		}
	}
}

/* Enqueue `dur` ns of work at `at` (real mode: wall ns; virtual: ignored); the slot. */
static void tl_enqueue(struct timeline *t, double at, double dur, int is_kernel, double *start,
		       double *end)
{
	double s;

	pthread_mutex_lock(&t->lock);
	s = tm_real && at > t->busy_until ? at : t->busy_until;
	if (!t->started) {
		t->started = 1;
		t->first_start = s;
	}
	t->busy_until = s + dur;
	t->busy_ns += dur;
	if (is_kernel) {
		t->kernels++;
		tm_thread_kernel_ns += dur;
		if (tm_real)
			activity_kernel(t, s, s + dur);
	}
	pthread_mutex_unlock(&t->lock);
	if (start)
		*start = s;
	if (end)
		*end = s + dur;
}

static double kernel_ns(uint64_t threads)
{
	return tm_kernel_base_ns + (double)threads * tm_ns_per_thread;
}

static double transfer_ns(size_t bytes, int dir)
{
	return (double)bytes / tm_bw[dir];
}

/* A kernel launch (launch_cost: the call's own CPU cost applies). */
static void timeline_kernel(struct timeline *t, uint64_t threads, int launch_cost)
{
	double t0 = tm_real ? (double)now_ns() : 0;

	tl_enqueue(t, t0, kernel_ns(threads), 1, NULL, NULL);
	if (tm_real && launch_cost && tm_launch_ns > 0)
		wait_until(t0 + tm_launch_ns);
}

typedef void (*copy_fn)(void *, size_t, const void *, size_t, size_t, size_t);

static void timeline_copy(struct timeline *t, size_t bytes, int dir, int sync, copy_fn fn,
			  void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
			  size_t height)
{
	double s, e;

	tl_enqueue(t, tm_real ? (double)now_ns() : 0, transfer_ns(bytes, dir), 0, &s, &e);
	if (tm_real && sync)
		wait_until(s);
	fn(dst, dpitch, src, spitch, width, height);
	if (tm_real && sync)
		wait_until(e);
}

/* Transfer-like work with no data movement of its own (memsets, graph copies). */
static void timeline_work(struct timeline *t, size_t bytes, int dir, int sync)
{
	double s;

	tl_enqueue(t, tm_real ? (double)now_ns() : 0, transfer_ns(bytes, dir), 0, &s, NULL);
	if (tm_real && sync)
		wait_until(s);
}

static void timeline_sync(struct timeline *t)
{
	double until;

	if (!tm_real)
		return;
	pthread_mutex_lock(&t->lock);
	until = t->busy_until;
	pthread_mutex_unlock(&t->lock);
	wait_until(until);
}

/* What an event recorded now reads: when all work enqueued so far completes. */
static double timeline_stamp(struct timeline *t)
{
	double v;

	pthread_mutex_lock(&t->lock);
	v = t->busy_until;
	if (tm_real && (double)now_ns() > v)
		v = (double)now_ns();
	pthread_mutex_unlock(&t->lock);
	return v;
}

/* Has the work enqueued so far completed? */
static int timeline_idle(struct timeline *t)
{
	double until;

	if (!tm_real)
		return 1;
	pthread_mutex_lock(&t->lock);
	until = t->busy_until;
	pthread_mutex_unlock(&t->lock);
	return (double)now_ns() >= until;
}

#endif
