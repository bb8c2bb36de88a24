# Test driver: builds kiln's Debian package from the build tree with cpack, checks its control
# fields and files, unpacks it (no dpkg -i: that needs root and changes the machine) and runs the
# packaged `kiln` from the unpacked tree: its version, and the in-tree backends it finds next to
# itself. Run with -DKILN_BUILD_DIR= -DWORK_DIR= -DVERSION=.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

include(${CMAKE_CURRENT_LIST_DIR}/run_step.cmake)

run("cpack" cpack -G DEB -B ${WORK_DIR} --config ${KILN_BUILD_DIR}/CPackConfig.cmake)
file(GLOB debs ${WORK_DIR}/kiln_${VERSION}_*.deb)
list(LENGTH debs n)
if(NOT n EQUAL 1)
  file(GLOB all ${WORK_DIR}/*)
  message(FATAL_ERROR "expected one kiln_${VERSION}_<arch>.deb in ${WORK_DIR}, found: ${all}")
endif()

run("control fields" dpkg-deb -f ${debs} Package Version Depends Description)
foreach(want "Package: kiln" "Version: ${VERSION}" "libspdlog1.10" "libtomlplusplus3" "graph and hands it" "torch==")
  string(FIND "${run_output}" "${want}" at)
  if(at LESS 0)
    message(FATAL_ERROR "the package's control fields lack '${want}':\n${run_output}")
  endif()
endforeach()

run("contents" dpkg-deb -c ${debs})
foreach(f ./usr/bin/kiln ./usr/lib/libkiln.so ./usr/include/kiln/kiln.h ./usr/include/kiln/plugin_api.h
          ./usr/lib/kiln/plugins/libkiln_inductor.so ./usr/lib/cmake/kiln/kilnConfig.cmake)
  string(FIND "${run_output}" " ${f}\n" at)
  if(at LESS 0)
    message(FATAL_ERROR "the package lacks ${f}:\n${run_output}")
  endif()
endforeach()
foreach(f kiln/internal/ workloads.h)
  string(FIND "${run_output}" "${f}" at)
  if(NOT at LESS 0)
    message(FATAL_ERROR "the package holds ${f}, which is not installed:\n${run_output}")
  endif()
endforeach()

run("unpack" dpkg-deb -x ${debs} ${WORK_DIR}/root)
run("kiln --version" ${WORK_DIR}/root/usr/bin/kiln --version)
string(FIND "${run_output}" "${VERSION}" at)
if(at LESS 0)
  message(FATAL_ERROR "the packaged kiln says another version:\n${run_output}")
endif()
run("kiln plugins" ${WORK_DIR}/root/usr/bin/kiln plugins)
string(FIND "${run_output}" "${WORK_DIR}/root/usr/lib/kiln/plugins/libkiln_inductor.so" at)
if(at LESS 0)
  message(FATAL_ERROR "the packaged kiln does not find the packaged backends:\n${run_output}")
endif()
