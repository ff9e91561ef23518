// Owns the test binaries' precompiled header (LOOM_TEST_PCH, the top CMakeLists.txt): every
// loom_add_test binary reuses the header compiled for this target.
int main() {
  return 0;
}
