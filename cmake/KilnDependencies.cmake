# Every external dependency is found here, in one place; docs/dependencies.md says why each one.

# LibTorch comes from PyPI's torch==2.11.0 wheel, installed by scripts/setup into a venv at a
# fixed, machine-wide path. Its CMake package lives at torch.utils.cmake_prefix_path.
set(KILN_PYTHON "/opt/kiln/venv/bin/python3" CACHE FILEPATH "Python that has torch==2.11.0")
if(NOT Torch_DIR)
  execute_process(
    COMMAND ${KILN_PYTHON} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE KILN_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _kiln_torch_rc ERROR_QUIET)
  if(NOT _kiln_torch_rc EQUAL 0)
    message(FATAL_ERROR "kiln: cannot import torch with ${KILN_PYTHON}; run scripts/setup first "
                        "(or pass -DKILN_PYTHON=... / -DTorch_DIR=...)")
  endif()
  list(APPEND CMAKE_PREFIX_PATH ${KILN_TORCH_PREFIX})
endif()

# The CUDA toolkit is optional. Torch's CMake package probes CUDA itself; we only record whether
# the toolkit is here so that CUDA-only targets can be skipped with a clear message.
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  set(KILN_HAVE_CUDA ON)
  message(STATUS "kiln: CUDA toolkit ${CUDAToolkit_VERSION} found at ${CUDAToolkit_BIN_DIR}; CUDA targets are built")
else()
  set(KILN_HAVE_CUDA OFF)
  message(STATUS "kiln: no CUDA toolkit found; CUDA targets (cudagraphs runtime, NVRTC kernels) are skipped")
endif()

find_package(Torch REQUIRED)
# Torch's package puts its flags (the C++11 ABI define) into TORCH_CXX_FLAGS; apply them only to
# targets that link LibTorch, never to plugins.
find_package(spdlog REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(Boost 1.74 REQUIRED)  # headers only: Boost.DLL, on std::filesystem
find_package(dlpack REQUIRED)
find_package(Threads REQUIRED)
if(KILN_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
