# Test driver: builds tests/package/c_plugin, a backend plugin in a project that enables only C,
# with find_package(kiln) and no COMPONENTS, against an installed prefix and against the build tree,
# and loads the plugin with the installed `kiln plugins`.
#   - configuring must succeed and say why kiln::kiln is not defined (the project has no C++);
#   - the plugin is the file kiln_add_plugin documents, libkiln_c_only.so, exporting only
#     kiln_plugin_init;
#   - `kiln plugins --plugin-dir` loads it.
# Run with -DKILN_BUILD_DIR= -DSOURCE_DIR= -DWORK_DIR= -DGENERATOR= [-DLAUNCHER=].
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

include(${CMAKE_CURRENT_LIST_DIR}/run_step.cmake)

set(project_args -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release)
if(LAUNCHER)
  list(APPEND project_args -DCMAKE_C_COMPILER_LAUNCHER=${LAUNCHER})
endif()
set(why "kiln: kiln::kiln is not defined: the project does not enable CXX")

set(prefix ${WORK_DIR}/prefix)
run("install kiln" ${CMAKE_COMMAND} --install ${KILN_BUILD_DIR} --prefix ${prefix})
foreach(mode install build_tree)
  if(mode STREQUAL "install")
    set(find_kiln -DCMAKE_PREFIX_PATH=${prefix})
  else()
    set(find_kiln -Dkiln_DIR=${KILN_BUILD_DIR})
  endif()
  set(build ${WORK_DIR}/${mode})
  run("configure the C plugin project (${mode})" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/c_plugin -B ${build}
      ${project_args} ${find_kiln})
  if(NOT run_output MATCHES "${why}")
    message(FATAL_ERROR "configuring the C plugin project (${mode}) did not say '${why}':\n${run_output}")
  endif()
  run("build the C plugin (${mode})" ${CMAKE_COMMAND} --build ${build})
  if(NOT EXISTS ${build}/libkiln_c_only.so)
    file(GLOB made RELATIVE ${build} ${build}/*.so)
    message(FATAL_ERROR "kiln_add_plugin(NAME c_only) made no ${build}/libkiln_c_only.so (but: ${made})")
  endif()
endforeach()

find_program(NM nm)
if(NM)
  run("list the plugin's exported symbols" ${NM} -D --defined-only ${WORK_DIR}/install/libkiln_c_only.so)
  string(REGEX MATCHALL "[^\n]+" symbols "${run_output}")
  list(FILTER symbols EXCLUDE REGEX " [aA] ")  # the version script's node, not a symbol of the code
  if(NOT symbols MATCHES "^[0-9a-f]+ T kiln_plugin_init$")
    message(FATAL_ERROR "libkiln_c_only.so exports more or other than kiln_plugin_init:\n${run_output}")
  endif()
endif()

run("list the plugin with the installed kiln" ${prefix}/bin/kiln plugins --json --no-default-dirs --plugin-dir
    ${WORK_DIR}/install)
string(JSON loaded GET "${run_output}" 0 loaded)
string(JSON name ERROR_VARIABLE no_name GET "${run_output}" 0 name)
if(NOT loaded STREQUAL "ON" OR NOT name STREQUAL "c_only")
  message(FATAL_ERROR "kiln plugins did not load libkiln_c_only.so:\n${run_output}")
endif()
message(STATUS "libkiln_c_only.so, built in a C-only project, loads: ${name}")
