/* gpuflight test workload: does the driver's cuGetProcAddress hand out its exported entry
 * points? (Then a runtime or framework calling through those pointers hits the probes on
 * the exported symbols.)
 *
 *   procaddress QUERY=EXPORTED[:PTSZ] ...
 *
 * For each argument: cuGetProcAddress_v2(QUERY, &p, 12020, flags, &status), flags 0, or
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2) with ":PTSZ"; prints
 * "QUERY same|other|missing" as p equals dlsym(libcuda, EXPORTED), differs, or is NULL.
 * Works without a GPU: cuInit fails, the lookups do not. Exit 0.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
			unsigned long long flags, int *status);

int main(int argc, char **argv)
{
	void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
	if (!cuda)
		return 2;
	for (int i = 1; i < argc; i++) {
		char query[128], exported[128];
		unsigned long long flags = 0;
		const char *eq = strchr(argv[i], '=');
		if (!eq || (size_t)(eq - argv[i]) >= sizeof(query))
			return 2;
		memcpy(query, argv[i], (size_t)(eq - argv[i]));
		query[eq - argv[i]] = 0;
		snprintf(exported, sizeof(exported), "%s", eq + 1);
		char *colon = strchr(exported, ':');
		if (colon) {
			*colon = 0;
			flags = 2;
		}
		void *p = NULL;
		int status = 0;
		cuGetProcAddress_v2(query, &p, 12020, flags, &status);
		printf("%s %s\n", argv[i], !p ? "missing" : p == dlsym(cuda, exported) ? "same" : "other");
	}
	return 0;
}
