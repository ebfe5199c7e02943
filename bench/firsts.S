/* bench/emulation.py: functions that differ in their first instruction only, each called in a
 * loop with an empty uprobe on it, to tell which instructions the kernel emulates at a probe
 * and which it single-steps. Each returns 0. */
	.data
	.p2align 2
g_flag:	.long 0
	.text
#define FN(name) .globl name; .type name, @function; .p2align 4; name:
#define END(name) .size name, .-name
FN(f_push)
	push %rbp
	mov %rsp, %rbp
	xor %eax, %eax
	pop %rbp
	ret
END(f_push)
FN(f_push_r12)
	push %r12
	pop %r12
	xor %eax, %eax
	ret
END(f_push_r12)
FN(f_nop1)
	nop
	xor %eax, %eax
	ret
END(f_nop1)
FN(f_jmp8)
	jmp 1f
	nop
1:	xor %eax, %eax
	ret
END(f_jmp8)
FN(f_jmp32)
	jmp 1f
	.skip 200, 0x90
1:	xor %eax, %eax
	ret
END(f_jmp32)
FN(f_call)
	call 1f
	ret
1:	xor %eax, %eax
	ret
END(f_call)
/* NVIDIA's driver thunk (libcuda 535): a probe at the entry and one at the je */
FN(f_cmp_rip)
	cmpl $0x321cba00, g_flag(%rip)
	je 1f
1:	xor %eax, %eax
	ret
END(f_cmp_rip)
FN(f_test_rip)
	testb $1, g_flag(%rip)
	jne 1f
1:	xor %eax, %eax
	ret
END(f_test_rip)
FN(f_endbr_push)
	endbr64
	push %rbp
	pop %rbp
	xor %eax, %eax
	ret
END(f_endbr_push)
FN(f_endbr)
	endbr64
	xor %eax, %eax
	ret
END(f_endbr)
FN(f_nop4)
	.byte 0x0f, 0x1f, 0x40, 0x00	/* nopl 0x0(%rax): a 4-byte nop */
	xor %eax, %eax
	ret
END(f_nop4)
FN(f_nop5)
	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00	/* nopl 0x0(%rax,%rax,1): the 5-byte nop */
	xor %eax, %eax
	ret
END(f_nop5)
FN(f_sub)
	sub $8, %rsp
	add $8, %rsp
	xor %eax, %eax
	ret
END(f_sub)
FN(f_mov)
	mov %rdi, %rax
	xor %eax, %eax
	ret
END(f_mov)
FN(f_xor)
	xor %eax, %eax
	ret
END(f_xor)
FN(f_lea)
	lea 8(%rsp), %rax
	xor %eax, %eax
	ret
END(f_lea)
	.section .note.GNU-stack,"",@progbits
