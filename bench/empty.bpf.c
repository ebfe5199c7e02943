/* bench: the floor — an empty uprobe program. */
#include <uapi/linux/ptrace.h>

int empty(struct pt_regs *ctx) { return 0; }
