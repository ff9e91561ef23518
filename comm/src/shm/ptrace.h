// Who may read this process's memory with process_vm_readv (the single-copy path), under
// Yama's ptrace restrictions (/proc/sys/kernel/yama/ptrace_scope).
//
// process_vm_readv needs ptrace-attach rights over the target (PTRACE_MODE_ATTACH_REALCREDS):
// same uid and, under Yama scope 1 ("restricted", the default of Ubuntu and others), the
// reader must also be an ancestor of the target or be named by the target with
// prctl(PR_SET_PTRACER). The ranks are siblings, so there a rank must name its readers. Yama
// keeps one such name per process, and the name covers that process and its descendants. So:
// - one local peer: that peer's pid (exactly the process that reads);
// - several: their nearest common ancestor (the launcher that forked them: loom-run, torchrun,
//   srun's step daemon, the test's parent), which covers every peer and also that launcher's
//   other descendants; never PR_SET_PTRACER_ANY (any process of the same user). When the
//   nearest common ancestor is init (peers started independently), nothing is relaxed and the
//   single copy stays off on that host.
// Scope 0 or no Yama: nothing to relax (same-uid readers are allowed). Scope 2 (admin only) and
// 3 (no attach): PR_SET_PTRACER cannot help; the single-copy probe fails and says so.
// Zero-copy windows (/proc/<pid>/fd) need only ptrace-read rights, which Yama does not restrict.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace loom::comm::shm {

// Yama's ptrace_scope, or -1 when Yama is not present.
int yamaPtraceScope();

// Whether Yama requires this process to name its readers (scope 1).
inline bool ptracerNeeded() {
  return yamaPtraceScope() == 1;
}

// The process to name for readers `peers` (see above; this process's own pid among them is
// ignored): 0 when there is none to name (no other reader; or `why` says why none fits).
pid_t ptracerFor(const std::vector<pid_t>& peers, std::string& why);

// Names the process that may read this one (see above) for readers `peers` (this process's own
// pid among them is ignored). Returns "" on success (or when nothing was needed), else why not.
// `named` receives the pid named (0: none).
std::string allowReadsBy(const std::vector<pid_t>& peers, pid_t& named);

// Withdraws the name (PR_SET_PTRACER 0): only ancestors may attach again.
void revokeReads();

// The name is one per process and the arenas of several groups may need it: each arena that
// named its readers holds it (holdReads, after allowReadsBy succeeded) and lets go when it no
// longer needs it or goes (releaseReads); the last to let go withdraws the name, so that no
// permission outlives the groups that needed it. readHolders() is the count, for tests.
void holdReads();
void releaseReads();
int readHolders();

}  // namespace loom::comm::shm
