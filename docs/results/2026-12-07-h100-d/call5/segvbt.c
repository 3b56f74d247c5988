// LD_PRELOAD helper: on SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGABRT print a native backtrace to stderr (fd 2), then re-raise.
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include <stdio.h>
#include <dlfcn.h>
#include <ucontext.h>
static void handler(int sig, siginfo_t *si, void *uc_) {
    char buf[256];
    ucontext_t *uc = (ucontext_t *)uc_;
    void *pc = (void *)uc->uc_mcontext.gregs[REG_RIP];
    int n = snprintf(buf, sizeof buf, "\n*** segvbt: signal %d at addr %p, pc %p\n", sig, si->si_addr, pc);
    write(2, buf, n);
    Dl_info di;
    if (dladdr(pc, &di) && di.dli_fname) {
        n = snprintf(buf, sizeof buf, "*** pc in %s (+0x%lx) %s\n", di.dli_fname,
                     (unsigned long)((char *)pc - (char *)di.dli_fbase), di.dli_sname ? di.dli_sname : "?");
        write(2, buf, n);
    }
    void *frames[128];
    int k = backtrace(frames, 128);
    backtrace_symbols_fd(frames, k, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}
__attribute__((constructor)) static void init(void) {
    backtrace((void *[1]){0}, 1);  // preload libgcc_s before any crash
    static char altstack[1 << 16];
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    sigaltstack(&ss, 0);
    struct sigaction sa; memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler; sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
    for (unsigned i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, 0);
}
