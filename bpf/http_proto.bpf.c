/* gpuflight: the HTTP capture (http.bpf.h) compiled on its own, with the scope map it shares
 * with the CUDA probes declared as bpf/cudart.bpf.c declares it. Used by the tests and the
 * syscall-cost bench until the capture joins bpf/cudart.bpf.c.
 *
 * Build-time parameters: GF_FILTER_PIDS as in cudart.bpf.c, and those of http.bpf.h.
 */
#ifndef GF_FILTER_PIDS
#define GF_FILTER_PIDS 0
#endif

BPF_HASH(scope_pids, u32, u8, 65536);

#include "http.bpf.h"
