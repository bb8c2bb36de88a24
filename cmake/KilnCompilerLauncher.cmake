# ccache makes rebuilds of LibTorch-heavy translation units cheap; use it when present.
find_program(KILN_CCACHE ccache)
if(KILN_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_C_COMPILER_LAUNCHER ${KILN_CCACHE})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${KILN_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${KILN_CCACHE})
  message(STATUS "kiln: compiling through ccache (${KILN_CCACHE})")
endif()
