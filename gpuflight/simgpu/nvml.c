/* gpuflight simulated GPU: libnvidia-ml.so.1, NVML for the simulated devices.
 *
 * Its figures come from the simulated driver's own timeline: each process using the driver
 * logs when its kernels run on each device (activity.h, GF_SIM_NVML_DIR, real-time timing
 * model). Like the real driver, this NVML samples every GF_SIM_NVML_PERIOD_US (default
 * 166667, 1/6 s): period k is (k P, (k+1) P] of CLOCK_MONOTONIC, its timestamp the CPU time
 * (CLOCK_REALTIME, µs since the epoch) of its end; a period is sampled once it ended more
 * than 1 ms ago (a kernel is logged when enqueued, before it runs). The last
 * GF_SIM_NVML_BUFFER periods (default 1000) are kept.
 *
 *   nvmlDeviceGetProcessUtilization   one sample per process and period in which its kernels
 *                                     ran: smUtil = their device time / P, in percent, rounded
 *                                     (memUtil, encUtil, decUtil 0); timestamps >
 *                                     lastSeenTimeStamp; none: NVML_ERROR_NOT_FOUND
 *   nvmlDeviceGetSamples              NVML_GPU_UTILIZATION_SAMPLES: one per period, busy or
 *                                     not, the device's utilisation (all processes, <= 100)
 *   nvmlDeviceGetUtilizationRates     gpu: the last sampled period's; memory 0
 *   nvmlDeviceGetComputeRunningProcesses_v3   the live processes that ran kernels on the
 *                                     device (used memory: not available)
 *   nvmlDeviceGetCount_v2 (GF_SIM_DEVICES), ..GetHandleByIndex_v2, ..GetName ("NVIDIA H100
 *   80GB HBM3"), ..GetUUID, ..GetMemoryInfo (80 GB, none used), nvmlInit(_v2|WithFlags),
 *   nvmlShutdown, nvmlErrorString, nvmlSystemGetDriverVersion.
 * Power, temperature, clocks and PCIe counters: NVML_ERROR_NOT_SUPPORTED; functions not
 * exported are "function not found" to pynvml. Ground truth is exact but for the rounding
 * of smUtil to a whole percent: at most P / 200 of device time per sample.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "activity.h"

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_NOT_FOUND = 6,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_UNKNOWN = 999,
};
#define NVML_GPU_UTILIZATION_SAMPLES 1
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_VALUE_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFull
#define MAX_DEVICES 16
#define MAX_PROCS 512
#define SETTLE_NS 1000000ull

typedef struct {
	unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
	unsigned int pid;
	unsigned long long timeStamp;
	unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef union {
	double dVal;
	unsigned int uiVal;
	unsigned long ulVal;
	unsigned long long ullVal;
	signed long long sllVal;
	signed int siVal;
	unsigned short usVal;
} nvmlValue_t;
typedef struct {
	unsigned long long timeStamp;
	nvmlValue_t sampleValue;
} nvmlSample_t;
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

struct device {
	int index;
};

/* One process's log and what it added up to: per device, its busy ns in each buffered
 * period (ring indexed by period % nbuf, tagged with the period). */
struct proc {
	int pid;
	struct act_log *log;
	uint64_t read; /* records consumed */
	int64_t *tag;  /* [MAX_DEVICES * nbuf] */
	double *busy;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_init;
static int g_ndev = 1;
static struct device g_dev[MAX_DEVICES];
static uint64_t g_period_ns = 166667000ull;
static int64_t g_nbuf = 1000;
static int64_t g_wall_offset_ns; /* CLOCK_REALTIME - CLOCK_MONOTONIC, fixed at init */
static char g_dir[4096];
static struct proc g_procs[MAX_PROCS];
static int g_nprocs;

static uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static long env_long(const char *name, long dflt, long lo, long hi)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (!s || !*s)
		return dflt;
	v = strtol(s, &end, 10);
	return (*end || v < lo || v > hi) ? dflt : v;
}

/* ---- the activity logs ---------------------------------------------------------------- */

static struct proc *proc_of(int pid)
{
	int i;

	for (i = 0; i < g_nprocs; i++)
		if (g_procs[i].pid == pid)
			return &g_procs[i];
	return NULL;
}

static void proc_open(int pid, const char *name)
{
	char path[4352];
	struct proc *p;
	void *map;
	size_t n = (size_t)MAX_DEVICES * (size_t)g_nbuf;
	int fd;

	if (g_nprocs >= MAX_PROCS)
		return;
	snprintf(path, sizeof(path), "%s/%s", g_dir, name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	map = mmap(NULL, sizeof(struct act_log), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return;
	p = &g_procs[g_nprocs];
	memset(p, 0, sizeof(*p));
	p->tag = malloc(n * sizeof(*p->tag));
	p->busy = calloc(n, sizeof(*p->busy));
	if (!p->tag || !p->busy) {
		free(p->tag);
		free(p->busy);
		munmap(map, sizeof(struct act_log));
		return;
	}
	memset(p->tag, 0xff, n * sizeof(*p->tag)); /* -1: no period */
	p->pid = pid;
	p->log = map;
	g_nprocs++;
}

static void scan_dir(void)
{
	DIR *d = opendir(g_dir);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		char *end;
		long pid;

		if (strncmp(e->d_name, ACT_NAME, strlen(ACT_NAME)))
			continue;
		pid = strtol(e->d_name + strlen(ACT_NAME), &end, 10);
		if (*end || pid <= 0 || proc_of((int)pid))
			continue;
		proc_open((int)pid, e->d_name);
	}
	closedir(d);
}

static void add_busy(struct proc *p, uint32_t dev, int64_t k, double ns)
{
	size_t i = (size_t)dev * (size_t)g_nbuf + (size_t)(k % g_nbuf);

	if (p->tag[i] != k) {
		p->tag[i] = k;
		p->busy[i] = 0;
	}
	p->busy[i] += ns;
}

static double busy_of(const struct proc *p, int dev, int64_t k)
{
	size_t i = (size_t)dev * (size_t)g_nbuf + (size_t)(k % g_nbuf);

	return p->tag[i] == k ? p->busy[i] : 0.0;
}

/* Consume the records written since the last read: each kernel's slot split over periods. */
static void read_logs(void)
{
	int i;

	scan_dir();
	for (i = 0; i < g_nprocs; i++) {
		struct proc *p = &g_procs[i];
		uint64_t n;

		if (__atomic_load_n(&p->log->magic, __ATOMIC_ACQUIRE) != ACT_MAGIC)
			continue;
		n = __atomic_load_n(&p->log->count, __ATOMIC_ACQUIRE);
		if (n > ACT_CAP)
			n = ACT_CAP;
		for (; p->read < n; p->read++) {
			const struct act_rec *r = &p->log->rec[p->read];
			uint64_t s = r->start_ns, e = r->end_ns;

			if (r->device >= MAX_DEVICES || e <= s)
				continue;
			/* period k is (kP, (k+1)P]: a slot [s, e) lands in floor(s/P) .. */
			while (s < e) {
				int64_t k = (int64_t)(s / g_period_ns);
				uint64_t k_end = (uint64_t)(k + 1) * g_period_ns;
				uint64_t upto = e < k_end ? e : k_end;

				add_busy(p, r->device, k, (double)(upto - s));
				s = upto;
			}
		}
	}
}

/* The newest period sampled now, and the oldest still in the buffer. */
static int64_t last_period(void)
{
	uint64_t now = clock_ns(CLOCK_MONOTONIC);

	return (int64_t)((now - SETTLE_NS) / g_period_ns) - 1;
}

static unsigned long long stamp_us(int64_t k)
{
	return (unsigned long long)(((int64_t)((uint64_t)(k + 1) * g_period_ns) + g_wall_offset_ns) /
				    1000);
}

/* The first period whose timestamp is after `last_seen_us`. */
static int64_t first_after(unsigned long long last_seen_us, int64_t newest)
{
	int64_t k = newest - g_nbuf + 1;

	if (k < 0)
		k = 0;
	if (last_seen_us) {
		int64_t from = (int64_t)(((int64_t)last_seen_us * 1000 - g_wall_offset_ns) /
					 (int64_t)g_period_ns);

		/* `from` is at most one period off: step to the first stamp > last_seen */
		if (from - 2 > k)
			k = from - 2;
		while (k <= newest && stamp_us(k) <= last_seen_us)
			k++;
	}
	return k;
}

static unsigned int percent(double busy_ns)
{
	double v = busy_ns * 100.0 / (double)g_period_ns + 0.5;

	return v > 100.0 ? 100u : (unsigned int)v;
}

/* ---- the API ------------------------------------------------------------------------------ */

static struct device *dev_of(void *handle)
{
	struct device *d = handle;

	if (!g_init || d < g_dev || d >= g_dev + g_ndev)
		return NULL;
	return d;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	const char *dir = getenv("GF_SIM_NVML_DIR");
	int i;

	pthread_mutex_lock(&g_lock);
	if (!g_init) {
		g_ndev = (int)env_long("GF_SIM_DEVICES", 1, 1, MAX_DEVICES);
		g_period_ns = (uint64_t)env_long("GF_SIM_NVML_PERIOD_US", 166667, 1000, 10000000) *
			      1000ull;
		g_nbuf = env_long("GF_SIM_NVML_BUFFER", 1000, 2, 100000);
		g_wall_offset_ns =
			(int64_t)clock_ns(CLOCK_REALTIME) - (int64_t)clock_ns(CLOCK_MONOTONIC);
		snprintf(g_dir, sizeof(g_dir), "%s", dir && *dir ? dir : "");
		for (i = 0; i < MAX_DEVICES; i++)
			g_dev[i].index = i;
	}
	g_init++;
	pthread_mutex_unlock(&g_lock);
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void)
{
	return nvmlInitWithFlags(0);
}

API nvmlReturn_t nvmlInit(void)
{
	return nvmlInitWithFlags(0);
}

API nvmlReturn_t nvmlShutdown(void)
{
	int i;

	pthread_mutex_lock(&g_lock);
	if (!g_init) {
		pthread_mutex_unlock(&g_lock);
		return NVML_ERROR_UNINITIALIZED;
	}
	if (--g_init == 0) {
		for (i = 0; i < g_nprocs; i++) {
			munmap(g_procs[i].log, sizeof(struct act_log));
			free(g_procs[i].tag);
			free(g_procs[i].busy);
		}
		g_nprocs = 0;
	}
	pthread_mutex_unlock(&g_lock);
	return NVML_SUCCESS;
}

API const char *nvmlErrorString(nvmlReturn_t result)
{
	switch (result) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	default: return "Unknown Error";
	}
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	if (!version || length < 16)
		return NVML_ERROR_INVALID_ARGUMENT;
	snprintf(version, length, "gpuflight-sim");
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	if (!g_init)
		return NVML_ERROR_UNINITIALIZED;
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = (unsigned int)g_ndev;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device)
{
	if (!g_init)
		return NVML_ERROR_UNINITIALIZED;
	if (!device || index >= (unsigned int)g_ndev)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &g_dev[index];
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned int length)
{
	struct device *d = dev_of(device);

	if (!d || !name)
		return d ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
	if ((unsigned int)snprintf(name, length, "NVIDIA H100 80GB HBM3") >= length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length)
{
	struct device *d = dev_of(device);

	if (!d || !uuid)
		return d ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
	if ((unsigned int)snprintf(uuid, length, "GPU-5e1f0000-0000-4000-8000-%012d", d->index) >=
	    length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory)
{
	struct device *d = dev_of(device);

	if (!d || !memory)
		return d ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
	memory->total = 80ull * 1000 * 1000 * 1000;
	memory->used = 0;
	memory->free = memory->total;
	return NVML_SUCCESS;
}

static double device_busy(int dev, int64_t k)
{
	double busy = 0;
	int i;

	for (i = 0; i < g_nprocs; i++)
		busy += busy_of(&g_procs[i], dev, k);
	return busy;
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *utilization)
{
	struct device *d = dev_of(device);

	if (!d || !utilization)
		return d ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
	pthread_mutex_lock(&g_lock);
	read_logs();
	utilization->gpu = percent(device_busy(d->index, last_period()));
	utilization->memory = 0;
	pthread_mutex_unlock(&g_lock);
	return NVML_SUCCESS;
}

/* The periods a query covers stay fixed between the sizing call and the filling call. */
static int64_t g_query_newest = -1;
static unsigned long long g_query_seen = ~0ull;
static uint64_t g_query_at;

static int64_t query_newest(unsigned long long last_seen_us)
{
	uint64_t now = clock_ns(CLOCK_MONOTONIC);

	if (last_seen_us != g_query_seen || now - g_query_at > 500000000ull) {
		g_query_seen = last_seen_us;
		g_query_at = now;
		g_query_newest = last_period();
	}
	return g_query_newest;
}

API nvmlReturn_t nvmlDeviceGetProcessUtilization(void *device,
						  nvmlProcessUtilizationSample_t *utilization,
						  unsigned int *processSamplesCount,
						  unsigned long long lastSeenTimeStamp)
{
	struct device *d = dev_of(device);
	unsigned int n = 0;
	int64_t k, newest;
	int i;

	if (!d || !processSamplesCount)
		return d ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
	pthread_mutex_lock(&g_lock);
	read_logs();
	newest = query_newest(lastSeenTimeStamp);
	for (k = first_after(lastSeenTimeStamp, newest); k <= newest; k++) {
		for (i = 0; i < g_nprocs; i++) {
			double busy = busy_of(&g_procs[i], d->index, k);

			if (busy <= 0)
				continue;
			if (utilization && n < *processSamplesCount) {
				nvmlProcessUtilizationSample_t *s = &utilization[n];

				memset(s, 0, sizeof(*s));
				s->pid = (unsigned int)g_procs[i].pid;
				s->timeStamp = stamp_us(k);
				s->smUtil = percent(busy);
			}
			n++;
		}
	}
	pthread_mutex_unlock(&g_lock);
	if (n == 0) {
		*processSamplesCount = 0;
		return NVML_ERROR_NOT_FOUND;
	}
	if (!utilization || n > *processSamplesCount) {
		*processSamplesCount = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	*processSamplesCount = n;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetSamples(void *device, int type, unsigned long long lastSeenTimeStamp,
				      int *sampleValType, unsigned int *sampleCount,
				      nvmlSample_t *samples)
{
	struct device *d = dev_of(device);
	unsigned int n = 0;
	int64_t k, newest;

	if (!d || !sampleCount || !sampleValType)
		return d ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
	if (type != NVML_GPU_UTILIZATION_SAMPLES)
		return NVML_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&g_lock);
	read_logs();
	newest = query_newest(lastSeenTimeStamp);
	for (k = first_after(lastSeenTimeStamp, newest); k <= newest; k++) {
		if (samples) {
			if (n >= *sampleCount)
				break; /* what fits */
			samples[n].timeStamp = stamp_us(k);
			samples[n].sampleValue.ullVal = 0;
			samples[n].sampleValue.uiVal = percent(device_busy(d->index, k));
		}
		n++;
	}
	pthread_mutex_unlock(&g_lock);
	*sampleValType = NVML_VALUE_TYPE_UNSIGNED_INT;
	*sampleCount = n;
	return n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *infoCount,
							  nvmlProcessInfo_t *infos)
{
	struct device *d = dev_of(device);
	unsigned int n = 0;
	int i;
	int64_t k, newest;

	if (!d || !infoCount)
		return d ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
	pthread_mutex_lock(&g_lock);
	read_logs();
	newest = last_period() + 1;
	for (i = 0; i < g_nprocs; i++) {
		const struct proc *p = &g_procs[i];
		int ran = 0;

		if (kill(p->pid, 0) != 0 && errno == ESRCH)
			continue;
		for (k = newest - g_nbuf + 1; k <= newest && !ran; k++)
			ran = k >= 0 && busy_of(p, d->index, k) > 0;
		if (!ran)
			continue;
		if (infos && n < *infoCount) {
			infos[n].pid = (unsigned int)p->pid;
			infos[n].usedGpuMemory = NVML_VALUE_NOT_AVAILABLE;
			infos[n].gpuInstanceId = 0xFFFFFFFFu;
			infos[n].computeInstanceId = 0xFFFFFFFFu;
		}
		n++;
	}
	pthread_mutex_unlock(&g_lock);
	if (n == 0) {
		*infoCount = 0;
		return NVML_SUCCESS;
	}
	if (!infos || n > *infoCount) {
		*infoCount = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	*infoCount = n;
	return NVML_SUCCESS;
}

/* Gauges the simulated GPU does not have. */
API nvmlReturn_t nvmlDeviceGetPowerUsage(void *device, unsigned int *power)
{
	return dev_of(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_UNINITIALIZED;
}

API nvmlReturn_t nvmlDeviceGetTemperature(void *device, int sensor, unsigned int *temp)
{
	return dev_of(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_UNINITIALIZED;
}

API nvmlReturn_t nvmlDeviceGetClockInfo(void *device, int type, unsigned int *clock)
{
	return dev_of(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_UNINITIALIZED;
}

API nvmlReturn_t nvmlDeviceGetPcieThroughput(void *device, int counter, unsigned int *value)
{
	return dev_of(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_UNINITIALIZED;
}
