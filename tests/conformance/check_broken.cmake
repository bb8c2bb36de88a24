# Runs `kiln conformance` on each deliberately broken plugin and asserts on its exit status and
# JSON report: the defect is reported as failed / crashed / hung in the case that executes, the
# cases that do not execute still pass, and the suite finishes.
#   cmake -DKILN=path/to/kiln -DPLUGIN_DIR=dir -DWORK_DIR=dir -P check_broken.cmake
include(${CMAKE_CURRENT_LIST_DIR}/conformance_checks.cmake)
file(MAKE_DIRECTORY ${WORK_DIR})
set(_cases "ABI.ExportsOnlyTheEntrySymbol:ABI.DescriptorIsSane:Numeric.UnaryPointwise:Availability.AgreesWithTheHardwareProbe")

# Numeric.UnaryPointwise executes the defect and gets `expected`, with a message; the rest pass.
function(check_case label name result msg)
  if(name STREQUAL "Numeric.UnaryPointwise")
    if(NOT result STREQUAL expected)
      conformance_fail("${label}: ${name} is ${result}, expected ${expected} (${msg})")
    endif()
    if(msg STREQUAL "")
      conformance_fail("${label}: ${name} has no message")
    endif()
  elseif(NOT result STREQUAL "passed")
    conformance_fail("${label}: ${name} is ${result}, expected passed (${msg})")
  endif()
endfunction()

foreach(pair "wrong_result;failed" "crash;crashed" "hang;hung")
  list(GET pair 0 defect)
  list(GET pair 1 expected)
  conformance_run(LABEL broken_${defect} PLUGIN ${PLUGIN_DIR}/libkiln_broken_${defect}.so
    JSON ${WORK_DIR}/${defect}.json CASES 4 COUNT_NOTE " (the suite did not finish)" CHECK_CASE check_case
    REPORT report ARGS --filter ${_cases} --timeout 10 --jobs 2)
  if(NOT report STREQUAL "")
    string(JSON n_expected GET "${report}" ${expected})
    if(NOT n_expected EQUAL 1)
      conformance_fail("broken_${defect}: '${expected}' is ${n_expected}, expected 1")
    endif()
  endif()
endforeach()
conformance_finish("the conformance suite misreported broken plugins"
  "wrong results -> failed, crash -> crashed, hang -> hung; every run finished with a JSON report")
