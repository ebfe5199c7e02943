/* bench: the floor — an empty uprobe program (`empty_multi`: the same, loaded for
 * uprobe_multi links by bench/attach_cost.py). */
#include <uapi/linux/ptrace.h>

int empty(struct pt_regs *ctx) { return 0; }
int empty_multi(struct pt_regs *ctx) { return 0; }
