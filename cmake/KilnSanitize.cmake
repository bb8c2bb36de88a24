# KILN_SANITIZE: a sanitizer build of the whole tree (scripts/test --sanitize builds one beside the
# normal build). "address" is AddressSanitizer with UndefinedBehaviorSanitizer; "thread" is
# ThreadSanitizer. Every C and C++ target of the tree is instrumented (kiln's own code: LibTorch,
# oneDNN and the system libraries are not), and an error stops the test that hit it: UBSan does not
# recover, ASan and TSan abort. Plugin libraries get the flags too; their sanitizer runtime is the
# one the test executable brought in.
include_guard(GLOBAL)

set(KILN_SANITIZE "" CACHE STRING "Sanitizer build: address (ASan + UBSan), thread (TSan) or empty")
set_property(CACHE KILN_SANITIZE PROPERTY STRINGS "" address thread)

if(KILN_SANITIZE STREQUAL "address")
  # vptr is left out: it checks dynamic types through RTTI that LibTorch's uninstrumented objects
  # carry too, and reports their casts as kiln's.
  set(_kiln_san -fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined)
elseif(KILN_SANITIZE STREQUAL "thread")
  set(_kiln_san -fsanitize=thread)
elseif(NOT KILN_SANITIZE STREQUAL "")
  message(FATAL_ERROR "KILN_SANITIZE='${KILN_SANITIZE}': expected address, thread or nothing")
endif()

if(_kiln_san)
  # GCC's flow analysis on instrumented code reports libstdc++'s own std::function and <regex> as
  # maybe uninitialized (a known false positive under sanitizers); the normal build keeps the check.
  # -O1 (the level the sanitizers' documentation recommends) overrides the build type's -O3:
  # instrumented, libkiln's files (LibTorch's headers in each) compile in about two thirds of the
  # time, 34 s against 53 s for the trainer's on one core.
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_kiln_san};-O1;-fno-omit-frame-pointer;-g1>"
                      "$<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized>")
  add_link_options("$<$<LINK_LANGUAGE:C,CXX>:${_kiln_san}>")
  # Plugins are shared libraries that the sanitizer runtime of the executable serves.
  message(STATUS "kiln: sanitizer build (${KILN_SANITIZE}): ${_kiln_san}")
endif()
