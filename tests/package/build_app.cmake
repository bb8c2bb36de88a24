# Test driver: builds tests/package/app, a program outside the kiln tree, with find_package(kiln)
# and kiln::kiln, runs it and checks what it prints.
#   MODE=install     installs the build tree to a prefix, moves the prefix elsewhere (it must be
#                    relocatable), checks its files, then builds the program against it; also
#                    configures tests/package/sdk_only there, which must not need LibTorch.
#   MODE=build_tree  builds the program with kiln_DIR=<build tree>.
# Run with -DMODE= -DKILN_BUILD_DIR= -DSOURCE_DIR= -DWORK_DIR= -DGENERATOR= [-DLAUNCHER=].
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

include(${CMAKE_CURRENT_LIST_DIR}/run_step.cmake)

set(app_args -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release)
if(LAUNCHER)
  list(APPEND app_args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()

if(MODE STREQUAL "install")
  set(prefix ${WORK_DIR}/prefix)
  run("install kiln" ${CMAKE_COMMAND} --install ${KILN_BUILD_DIR} --prefix ${WORK_DIR}/staging)
  file(RENAME ${WORK_DIR}/staging ${prefix})
  set(missing)
  foreach(f
      bin/kiln lib/libkiln.so
      include/kiln/kiln.h include/kiln/trainer.h include/kiln/compile.h include/kiln/config.h
      include/kiln/ir.h include/kiln/group_outcome.h include/kiln/log.h include/kiln/version.h include/kiln/distributed.h
      include/kiln/plugin_api.h include/kiln/plugin_api.hpp
      lib/cmake/kiln/kilnConfig.cmake lib/cmake/kiln/kilnConfigVersion.cmake
      lib/cmake/kiln/kilnTargets.cmake lib/cmake/kiln/kilnLibraryTargets.cmake
      lib/cmake/kiln/KilnPlugin.cmake lib/kiln/plugins/libkiln_inductor.so)
    if(NOT EXISTS ${prefix}/${f})
      list(APPEND missing ${f})
    endif()
  endforeach()
  if(missing)
    message(FATAL_ERROR "the installed prefix ${prefix} lacks: ${missing}")
  endif()
  file(GLOB_RECURSE internal RELATIVE ${prefix} ${prefix}/include/kiln/internal/* ${prefix}/include/kiln/workloads.h)
  if(internal)
    message(FATAL_ERROR "headers that are not kiln's public API were installed: ${internal}")
  endif()
  message(STATUS "the installed prefix has every file a user needs, and no internal header")
  run("configure a plugin project for the SDK alone" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/sdk_only
      -B ${WORK_DIR}/sdk_only ${app_args} -DCMAKE_PREFIX_PATH=${prefix})
  set(find_kiln -DCMAKE_PREFIX_PATH=${prefix})
elseif(MODE STREQUAL "build_tree")
  set(find_kiln -Dkiln_DIR=${KILN_BUILD_DIR})
else()
  message(FATAL_ERROR "MODE must be install or build_tree, not '${MODE}'")
endif()

run("configure the program (${MODE})" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/app -B ${WORK_DIR}/app ${app_args} ${find_kiln})
run("build the program" ${CMAKE_COMMAND} --build ${WORK_DIR}/app)
# kiln::kiln's link option: the shared libstdc++ comes before LibTorch (docs/dependencies.md).
run("check that the program loads libstdc++ before LibTorch"
    bash ${SOURCE_DIR}/../repository/libstdcxx_first.sh ${WORK_DIR}/app/package_app)
run("run the program" ${WORK_DIR}/app/package_app)
if(NOT run_output MATCHES "package_app: ok")
  message(FATAL_ERROR "the program ran but did not print 'package_app: ok':\n${run_output}")
endif()
message(STATUS "${run_output}")
