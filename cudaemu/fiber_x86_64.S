/* cudaemu_fiber_switch(void **save_sp, void *to_sp): saves the callee-saved
 * registers on the current stack, stores the stack pointer in *save_sp,
 * then resumes the context whose stack pointer is to_sp.  A new fiber's
 * stack is laid out by fiber_init in exec.cc to look like a saved one whose
 * return address is its entry function.  Caller-saved registers need no
 * saving: this is an ordinary function call to both sides. */
#if defined(__x86_64__)
        .text
        .globl  cudaemu_fiber_switch
        .type   cudaemu_fiber_switch, @function
cudaemu_fiber_switch:
        .cfi_startproc
        pushq   %rbp
        pushq   %rbx
        pushq   %r12
        pushq   %r13
        pushq   %r14
        pushq   %r15
        movq    %rsp, (%rdi)
        movq    %rsi, %rsp
        popq    %r15
        popq    %r14
        popq    %r13
        popq    %r12
        popq    %rbx
        popq    %rbp
        ret
        .cfi_endproc
        .size   cudaemu_fiber_switch, .-cudaemu_fiber_switch
#else
#error "cudaemu fibers are written for x86-64 only"
#endif
        .section .note.GNU-stack,"",@progbits
