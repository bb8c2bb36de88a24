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
# Header-only, from Debian, nothing to load at run time: CLI11 parses the `kiln` command lines and
# nlohmann/json writes and reads every JSON document kiln has (docs/dependencies.md). Their CMake
# packages live in /usr/share/cmake; on the GPU machine, in the prefix scripts/device-build unpacks.
find_package(CLI11 2 CONFIG QUIET)
if(NOT CLI11_FOUND)
  message(FATAL_ERROR "kiln: CLI11 2.x not found (no CLI11Config.cmake): install the Debian package libcli11-dev "
                      "(scripts/setup does), or pass -DCLI11_DIR=<directory holding CLI11Config.cmake>")
endif()
find_package(nlohmann_json 3 CONFIG QUIET)
if(NOT nlohmann_json_FOUND)
  message(FATAL_ERROR "kiln: nlohmann/json 3.x not found (no nlohmann_jsonConfig.cmake): install the Debian package "
                      "nlohmann-json3-dev (scripts/setup does), or pass -Dnlohmann_json_DIR=<directory holding "
                      "nlohmann_jsonConfig.cmake>")
endif()
if(KILN_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

# oneDNN 3.2 with the Graph API and an OpenMP (GNU) CPU runtime, for the ipex backend: PyPI's
# onednn-cpu-gomp/onednn-devel-cpu-gomp 2023.2.0, installed by scripts/setup into its own prefix
# (docs/dependencies.md says why this build). Optional: without it the ipex plugin is skipped. The
# plugin compiles against the headers and loads libdnnl.so.3 at run time (dlopen), so that it loads,
# and says why it is unavailable, where the library is missing; KILN_ONEDNN_LIBRARY is the file it
# tries first.
set(KILN_ONEDNN_ROOT "/opt/kiln/onednn" CACHE PATH "Prefix of oneDNN 3.x with a CPU OpenMP runtime (ipex backend)")
find_package(dnnl 3.2 CONFIG QUIET PATHS ${KILN_ONEDNN_ROOT} NO_DEFAULT_PATH)
set(KILN_HAVE_ONEDNN OFF)
if(dnnl_FOUND AND TARGET DNNL::dnnl)
  if(NOT DNNL_CPU_RUNTIME STREQUAL "OMP" OR NOT DNNL_GPU_RUNTIME STREQUAL "NONE")
    message(STATUS "kiln: oneDNN ${dnnl_VERSION} at ${KILN_ONEDNN_ROOT} has CPU runtime ${DNNL_CPU_RUNTIME} and GPU "
                   "runtime ${DNNL_GPU_RUNTIME}, not OMP and NONE; the ipex backend is skipped (run scripts/setup)")
  else()
    get_target_property(KILN_ONEDNN_INCLUDE_DIR DNNL::dnnl INTERFACE_INCLUDE_DIRECTORIES)
    get_target_property(KILN_ONEDNN_LIBRARY DNNL::dnnl IMPORTED_LOCATION_RELEASE)
    if(NOT KILN_ONEDNN_LIBRARY)
      get_target_property(KILN_ONEDNN_LIBRARY DNNL::dnnl LOCATION)
    endif()
    set(KILN_HAVE_ONEDNN ON)
    message(STATUS "kiln: oneDNN ${dnnl_VERSION} (CPU, OpenMP) found at ${KILN_ONEDNN_ROOT}; the ipex backend is built")
  endif()
else()
  message(STATUS "kiln: no oneDNN 3.2+ CMake package under KILN_ONEDNN_ROOT=${KILN_ONEDNN_ROOT}; the ipex backend "
                 "is skipped (run scripts/setup, or pass -DKILN_ONEDNN_ROOT=<prefix with lib/cmake/dnnl>)")
endif()

# The PJRT C API header (pjrt_c_api.h) and XLA's CPU PJRT plugin, for the neuron backend: PyPI's
# xla-cpu-pjrt 0.0.1, installed by scripts/setup with pip --target into KILN_PJRT_ROOT. The backend
# builds against the header; the tests run every PJRT call through the CPU plugin. Without the
# header the neuron backend is skipped.
set(KILN_PJRT_ROOT "/opt/kiln/pjrt" CACHE PATH "pip --target directory holding xla_plugins/xla_cpu_pjrt (neuron backend)")
set(KILN_HAVE_PJRT OFF)
set(KILN_PJRT_INCLUDE_DIR "${KILN_PJRT_ROOT}/xla_plugins/xla_cpu_pjrt/include")
set(KILN_PJRT_CPU_PLUGIN "${KILN_PJRT_ROOT}/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
if(EXISTS "${KILN_PJRT_INCLUDE_DIR}/pjrt_c_api.h")
  set(KILN_HAVE_PJRT ON)
  message(STATUS "kiln: PJRT C API header found at ${KILN_PJRT_INCLUDE_DIR}; the neuron backend is built")
else()
  message(STATUS "kiln: no pjrt_c_api.h under KILN_PJRT_ROOT=${KILN_PJRT_ROOT}; the neuron backend is skipped "
                 "(run scripts/setup)")
endif()
