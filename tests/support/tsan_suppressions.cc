// ThreadSanitizer suppressions and options compiled into every test binary of a
// LOOM_SANITIZE=thread build (cmake/LoomHelpers.cmake loom_add_test, and the MPI tests).
//
// The tcp transport orders its receives after its sends for TSan itself (comm/src/tcp/
// tsan_wire.h): the collectives reuse buffers by causality through the network, which TSan
// cannot see. No sendmsg report is suppressed.
//
// race:std::__exception_ptr::exception_ptr::_M_release — a failed Work's error (an
// exception_ptr) destroyed on the thread that drops the Work's last reference (the worker
// popping a completed operation), after the waiter rethrew it, caught it and read what(). The
// exception object's reference count lives in libstdc++ (uninstrumented), so TSan sees the
// destructor's writes but not the count that orders them after the catch. Only reports whose
// writer is that release match.
//
// deadlock:mca_btl_tcp_add_procs — inside MPI_Init (the MPI tests), Open MPI's tcp transport
// takes two of its own locks in both orders on one thread (mca_btl_tcp_add_procs and
// mca_btl_tcp_proc_remove); no Loom lock is in the cycle.
//
// race:opal_convertor_unpack, race:mca_pml_ob1.so — Open MPI (uninstrumented) copying a message
// into a receive buffer from whichever thread drives its progress engine: with two MPI groups,
// one group's worker can complete the other's receive. Open MPI orders that copy before the
// request's completion with its own atomics, which TSan does not see, so the owner's later read
// of the buffer looks like a race. Only reports with one of these copies in a stack match.
extern "C" const char* __tsan_default_suppressions() {
  return "race:std::__exception_ptr::exception_ptr::_M_release\n"
         "deadlock:mca_btl_tcp_add_procs\n"
         "race:opal_convertor_unpack\n"
         "race:mca_pml_ob1.so\n";
}

// history_size=7: the largest history TSan keeps per thread. A suppression matches only a report
// whose earlier access has a stack, and the large sweeps (long-lived thread-rank worlds moving
// MiBs per case) outrun the default history.
// handle_segv=0: Loom's own fatal-signal handler is under test (a rank that segfaults still
// writes its trace and dies of SIGSEGV, pg_diagnostics_test); TSan's handler would take the
// signal first and end the process its own way.
extern "C" const char* __tsan_default_options() {
  return "history_size=7:handle_segv=0";
}
