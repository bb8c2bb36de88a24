# `kiln bench --check` on a backend whose code ran nothing of the step: claims_nothing claims no
# node, so kiln's eager executor runs the whole step and the numbers match eager exactly. That
# proves nothing of the backend: the check must fail (exit 1) with a FAIL line that says why. Asking
# for eager itself is the one run where eager is the point: it still passes.
#   cmake -DKILN=path/to/kiln -DPLUGIN_DIR=dir -P check_bench.cmake
include(${CMAKE_CURRENT_LIST_DIR}/conformance_checks.cmake)

# Runs `kiln bench mlp ARGS...` and asserts its exit status and that its output has each of `texts`.
function(check_bench label want_rc)
  cmake_parse_arguments(B "" "" "ARGS;TEXTS" ${ARGN})
  execute_process(COMMAND ${KILN} bench mlp --steps 4 --batch 8 --check ${B_ARGS}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${label}: exit ${rc}\n${out}${err}")
  if(NOT rc EQUAL want_rc)
    conformance_fail("${label}: exit status ${rc}, expected ${want_rc}")
  endif()
  foreach(text ${B_TEXTS})
    string(FIND "${out}" "${text}" at)
    if(at EQUAL -1)
      conformance_fail("${label}: the report lacks '${text}'")
    endif()
  endforeach()
endfunction()

check_bench(claims_nothing 1 ARGS --backend claims_nothing --plugin-dir ${PLUGIN_DIR}
  TEXTS "backend: claims_nothing" "runs on: eager" "check: FAIL"
        "claims_nothing ran nothing of the step (runs on: eager): claims_nothing claimed none of the")
check_bench(eager 0 ARGS --backend eager TEXTS "runs on: eager" "check: PASS")
conformance_finish("kiln bench --check misjudged a backend that ran nothing"
  "a backend that ran nothing fails the check, eager itself passes it")
