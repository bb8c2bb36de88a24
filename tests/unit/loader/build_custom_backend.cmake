# Test fixture: installs kiln's SDK to a fresh prefix, then configures and builds
# samples/custom_backend out of tree against it with find_package(kiln), exactly as a third party
# would. Run with -DKILN_BUILD_DIR= -DSAMPLE_DIR= -DWORK_DIR= -DGENERATOR=.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

include(${CMAKE_CURRENT_LIST_DIR}/../../package/run_step.cmake)  # run(<step> <command>...)

run("install the kiln SDK" ${CMAKE_COMMAND} --install ${KILN_BUILD_DIR} --prefix ${WORK_DIR}/prefix --component sdk)
run("configure the sample" ${CMAKE_COMMAND} -S ${SAMPLE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run("build the sample" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
foreach(lib libkiln_custom_elementwise.so libkiln_minimal_relu.so)
  if(NOT EXISTS ${WORK_DIR}/build/${lib})
    message(FATAL_ERROR "the sample built, but ${WORK_DIR}/build/${lib} is missing")
  endif()
endforeach()
