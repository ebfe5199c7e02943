/* gpuflight tests: the stub driver (stubcuda.c) entered the way real drivers' functions begin.
 *
 * tests/workloads/build.py (build_thunked_stubcuda) compiles stubcuda.c with each function
 * listed below renamed gf_impl_NAME, and links this file beside it: NAME is then a thunk
 * that ends in a jump to gf_impl_NAME, every register but the flags as the caller left
 * them. Each line below names the thunk's shape, then the function:
 *
 *   nvidia      cmpl $0x321cba00, S(%rip) · je · jmp *P(%rip)     NVIDIA's libcuda 535: the
 *                                                                 probe goes at the je, +10
 *   endbr_cmp   endbr64 · the same                                +14
 *   test_jcc    testb $1, S(%rip) · jne · jmp *P(%rip)            +7
 *   endbr_push  endbr64 · push %rbp · mov · pop · jmp             +4 (the push)
 *   nops        nopl 0(%rax,%rax,1) · endbr64 · cmpl · je · jmp   +18 (a 4-byte nop)
 *   stepped     lea 0(%rip), %r11 · jmp                           nothing to skip: the probe
 *                                                                 stays at the entry, stepped
 *   loop_back   as nvidia, and a branch back to the je further on: at the entry, stepped
 *
 * S is never set: no thunk takes its other way (mov $4, %eax: CUDA_ERROR_DEINITIALIZED).
 * Each shape marks where a probe on it belongs with a local symbol, gf_probe_NAME: the tests
 * hold gpuflight's attach plan to these marks (build.thunk_shapes lists the shapes).
 */
	.bss
	.p2align 2
gf_thunk_state:
	.zero 4

.macro pointer name
	.hidden gf_impl_\name
	.section .data.rel.ro,"aw"
	.p2align 3
gf_impl_\name\()_ptr:
	.quad gf_impl_\name
	.text
	.p2align 4
	.globl \name
	.type \name, @function
.endm

.macro deinitialized name
1:	movl $4, %eax
	ret
	.size \name, .-\name
.endm

.macro nvidia name
	pointer \name
\name:
	cmpl $0x321cba00, gf_thunk_state(%rip)
gf_probe_\name:
	je 1f
	jmp *gf_impl_\name\()_ptr(%rip)
	deinitialized \name
.endm

.macro endbr_cmp name
	pointer \name
\name:
	endbr64
	cmpl $0x321cba00, gf_thunk_state(%rip)
gf_probe_\name:
	je 1f
	jmp *gf_impl_\name\()_ptr(%rip)
	deinitialized \name
.endm

.macro test_jcc name
	pointer \name
\name:
	testb $1, gf_thunk_state(%rip)
gf_probe_\name:
	jne 1f
	jmp *gf_impl_\name\()_ptr(%rip)
	deinitialized \name
.endm

.macro endbr_push name
	pointer \name
\name:
	endbr64
gf_probe_\name:
	push %rbp
	mov %rsp, %rbp
	pop %rbp
	jmp gf_impl_\name
	.size \name, .-\name
.endm

.macro nops name
	pointer \name
\name:
	nopl 0(%rax,%rax,1)
	endbr64
	cmpl $0x321cba00, gf_thunk_state(%rip)
gf_probe_\name:
	je 1f
	jmp *gf_impl_\name\()_ptr(%rip)
	deinitialized \name
.endm

.macro stepped name
	pointer \name
\name:
gf_probe_\name:
	lea 0(%rip), %r11
	jmp gf_impl_\name
	.size \name, .-\name
.endm

.macro loop_back name
	pointer \name
\name:
gf_probe_\name:
	cmpl $0x321cba00, gf_thunk_state(%rip)
0:	je 1f
	jmp *gf_impl_\name\()_ptr(%rip)
1:	movl $4, %eax
	cmpl $2, gf_thunk_state(%rip)
	je 0b
	ret
	.size \name, .-\name
.endm

	nvidia cuInit
	nvidia cuModuleLoadData
	endbr_cmp cuModuleLoadDataEx
	test_jcc cuModuleGetFunction
	endbr_push cuLibraryLoadData
	nops cuLibraryGetKernel
	nvidia cuKernelGetFunction
	endbr_cmp cuMemAlloc_v2
	test_jcc cuMemAllocAsync
	endbr_push cuMemAllocAsync_ptsz
	nops cuMemAllocManaged
	nvidia cuMemAllocHost_v2
	endbr_cmp cuMemHostAlloc
	test_jcc cuMemFree_v2
	endbr_push cuMemFreeAsync
	nops cuMemFreeAsync_ptsz
	nvidia cuMemFreeHost
	endbr_cmp cuStreamEndCapture
	test_jcc cuStreamEndCapture_ptsz
	endbr_push cuGraphInstantiateWithFlags
	nops cuGraphInstantiateWithParams
	nvidia cuGraphInstantiateWithParams_ptsz
	nvidia cuLaunchKernel
	endbr_cmp cuLaunchKernel_ptsz
	test_jcc cuLaunchCooperativeKernel
	endbr_push cuLaunchCooperativeKernel_ptsz
	nops cuLaunchKernelEx
	nvidia cuLaunchKernelEx_ptsz
	nvidia cuMemcpyHtoD_v2
	endbr_cmp cuMemcpyHtoD_v2_ptds
	stepped cuMemcpyDtoH_v2
	test_jcc cuMemcpyDtoH_v2_ptds
	endbr_push cuMemcpyDtoD_v2
	nops cuMemcpyDtoD_v2_ptds
	nvidia cuMemcpyHtoDAsync_v2
	endbr_cmp cuMemcpyHtoDAsync_v2_ptsz
	test_jcc cuMemcpyDtoHAsync_v2
	endbr_push cuMemcpyDtoHAsync_v2_ptsz
	nops cuMemcpyDtoDAsync_v2
	nvidia cuMemcpyDtoDAsync_v2_ptsz
	endbr_cmp cuMemcpy
	test_jcc cuMemcpy_ptds
	endbr_push cuMemcpyAsync
	nops cuMemcpyAsync_ptsz
	nvidia cuMemcpyPeer
	endbr_cmp cuMemcpyPeer_ptds
	test_jcc cuMemcpyPeerAsync
	endbr_push cuMemcpyPeerAsync_ptsz
	stepped cuMemsetD8_v2
	nops cuMemsetD8_v2_ptds
	nvidia cuMemsetD16_v2
	endbr_cmp cuMemsetD16_v2_ptds
	test_jcc cuMemsetD32_v2
	endbr_push cuMemsetD32_v2_ptds
	nops cuMemsetD8Async
	nvidia cuMemsetD8Async_ptsz
	endbr_cmp cuMemsetD16Async
	test_jcc cuMemsetD16Async_ptsz
	endbr_push cuMemsetD32Async
	nops cuMemsetD32Async_ptsz
	loop_back cuStreamSynchronize
	nvidia cuStreamSynchronize_ptsz
	endbr_push cuCtxSynchronize
	nops cuEventSynchronize
	endbr_cmp cuGraphLaunch
	test_jcc cuGraphLaunch_ptsz
	nvidia cuStreamBeginCapture_v2
	endbr_cmp cuStreamBeginCapture_v2_ptsz
	nvidia cuGetProcAddress
	nvidia cuGetProcAddress_v2

	.section .note.GNU-stack,"",@progbits
