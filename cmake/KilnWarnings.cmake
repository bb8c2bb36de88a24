# The one warning policy of the kiln tree. Included by the top-level CMakeLists.txt before any
# target is made, so every library, plugin, executable and test in the tree compiles with it and a
# new target cannot be forgotten. Not installed: third-party backends built with the SDK's
# kiln_add_plugin choose their own warnings.
#
# -Wno-unused-parameter: libkiln, kiln_workloads and the conformance suite were built with it before
# the policy existed (overrides of LibTorch and executor interfaces that ignore arguments); the
# plugins, whose callbacks leave unused parameters unnamed, build clean without it. Dropping it
# means naming or removing those parameters in the LibTorch-side code first.
#
# KILN_WERROR turns warnings into errors (CI, through scripts/test). A target whose warnings are not
# ours to fix yet opts out with kiln_allow_warnings(<target>), which says so at configure time.
include_guard(GLOBAL)

option(KILN_WERROR "Treat compiler warnings as errors" OFF)

set(KILN_WARNING_FLAGS -Wall -Wextra -Wno-unused-parameter)
if(KILN_WERROR)
  list(APPEND KILN_WARNING_FLAGS -Werror)
endif()
# C and C++ only: nvcc would need these spelled as -Xcompiler options.
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${KILN_WARNING_FLAGS}>")

# kiln_allow_warnings(<target> <why>): the policy's warnings stay on for <target>, but under
# KILN_WERROR they do not fail its build.
function(kiln_allow_warnings target why)
  target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:C,CXX>:-Wno-error>")
  if(KILN_WERROR)
    message(STATUS "kiln: KILN_WERROR is off for ${target}: ${why}")
  endif()
endfunction()
