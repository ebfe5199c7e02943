/* The floor of bench/http_syscalls.py: an empty program on each syscall tracepoint that
 * bpf/http.bpf.h uses (what attaching costs before any of gpuflight's code runs). */
TRACEPOINT_PROBE(syscalls, sys_enter_accept4) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_accept4) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_accept) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_accept) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_read) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_read) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_recvfrom) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_recvfrom) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_recvmsg) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_recvmsg) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_readv) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_readv) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_write) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_write) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_sendto) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_sendto) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_sendmsg) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_sendmsg) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_writev) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_writev) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_sendfile64) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_sendfile64) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_close) { return 0; }
