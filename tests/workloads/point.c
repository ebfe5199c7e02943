/* A function a Python workload calls through ctypes, for a uprobe to walk its caller
 * (tests/system/test_pywalk.py, bench/pywalk_cost.py). */
void gf_point(void) { __asm__ volatile("" ::: "memory"); }
