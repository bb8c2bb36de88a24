/* A tiny shared library: the fuzzer's seed is this file compiled, whole and cut short. */
int kiln_fuzz_seed(int x) { return x * 3 + 1; }
