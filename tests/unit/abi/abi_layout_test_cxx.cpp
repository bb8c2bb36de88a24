// The same layout checks with the header compiled as C++17: both languages must agree.
#include "abi_layout_test.c"
