// AddressSanitizer options compiled into every test binary of a LOOM_SANITIZE=address build
// (cmake/LoomHelpers.cmake loom_test_binary_defaults).
//
// handle_segv=0: Loom's own fatal-signal handler is under test (a rank that segfaults still
// writes its trace and dies of SIGSEGV, pg_diagnostics_test); ASan's handler would take the
// signal first and end the process with exit code 1. A segfault elsewhere still ends the test
// with SIGSEGV and Loom's backtrace.
extern "C" const char* __asan_default_options() {
  return "handle_segv=0";
}
