// ThreadSanitizer suppressions compiled into every test binary of a LOOM_SANITIZE=thread build
// (cmake/LoomHelpers.cmake, loom_add_test).
//
// race:sendmsg — the kernel's read of a send payload (the sendmsg interceptor) against a later
// receive into the same buffer (the tcp transport's recv or memcpy into a posted receive). The
// collectives reuse buffers by causality through the network: in the ring all-reduce in place,
// the all-gather data for a segment can only arrive after the peer received (so the kernel had
// copied) this rank's reduce-scatter bytes from that segment. Thread ranks share one process,
// and TSan, which cannot see ordering through a TCP connection (each end is a different fd),
// reports these pairs. Nothing else is suppressed: races on the transport's own state have no
// sendmsg frame.
//
// race:std::__exception_ptr::exception_ptr::_M_release — a failed Work's error (an
// exception_ptr) destroyed on the thread that drops the Work's last reference (the worker
// popping a completed operation), after the waiter rethrew it, caught it and read what(). The
// exception object's reference count lives in libstdc++ (uninstrumented), so TSan sees the
// destructor's writes but not the count that orders them after the catch. Only reports whose
// writer is that release match.
extern "C" const char* __tsan_default_suppressions() {
  return "race:sendmsg\nrace:std::__exception_ptr::exception_ptr::_M_release\n";
}

// The largest history TSan keeps per thread: a suppression matches only a report whose earlier
// access has a stack, and with the default history the large sweeps (long-lived thread-rank
// worlds moving MiBs per case) report sendmsg pairs with "failed to restore the stack".
extern "C" const char* __tsan_default_options() {
  return "history_size=7";
}
