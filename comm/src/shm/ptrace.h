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

// Yama keeps one name per process, and the arenas of several groups may each need readers
// named (a world group and a subgroup whose peers differ). Each arena that needs them holds a
// grant for its readers, and the name is always the process that covers the readers of every
// grant held: ptracerFor over their union (the one reader when every grant names the same one,
// else their nearest common ancestor). So a second group widens the name instead of taking the
// first group's readers away, and a grant that ends narrows it again; the last to end withdraws
// it (PR_SET_PTRACER 0: only ancestors may attach again), so no permission outlives the groups
// that needed it.
//
// grantReads names the readers `peers` (this process's own pid among them is ignored) and
// returns "" with `grant` != 0 when they may read now; "" with `grant` 0 when there is no reader
// to name; else why not (grant 0: no readers that share no ancestor but init with the other
// grants' are named, and the name stays as it was).
std::string grantReads(const std::vector<pid_t>& peers, int& grant);
// Ends a grant (0 and unknown grants are ignored).
void endGrant(int grant);
// The pid named now (0: none), and the grants held; for tests.
pid_t namedReader();
int readGrants();
// Replaces prctl(PR_SET_PTRACER, pid) for tests (the call returns 0 or an errno); nullptr
// restores prctl. Without Yama the kernel refuses the prctl, so only a test can see the names.
void setPtracerCallForTest(int (*call)(pid_t));

}  // namespace loom::comm::shm
