# What check_broken.cmake and check_verdicts.cmake share: run `kiln conformance` on one test plugin
# and match its exit status and JSON report, case by case, against what the script expects. Every
# mismatch is collected, so that one run names all of them; conformance_finish reports them.

# Records one mismatch; `text` names the plugin, the case and what was expected.
function(conformance_fail text)
  set_property(GLOBAL APPEND PROPERTY KILN_CONFORMANCE_FAILURES "${text}")
endfunction()

# conformance_run(LABEL label PLUGIN path.so JSON report.json CASES n CHECK_CASE function
#                 [EXIT_NOTE text] [COUNT_NOTE text] [REPORT var] ARGS args...)
# Runs `${KILN} conformance PLUGIN ARGS... --json JSON` and asserts that it exits 1 and writes a
# report of CASES cases (EXIT_NOTE and COUNT_NOTE end those failures with why). Then calls
# CHECK_CASE(label name result message) on each case of the report, which calls conformance_fail
# for what is wrong. REPORT receives the report's text, empty when none was written. Each failure
# starts with LABEL.
function(conformance_run)
  cmake_parse_arguments(R "" "LABEL;PLUGIN;JSON;CASES;CHECK_CASE;EXIT_NOTE;COUNT_NOTE;REPORT" "ARGS" ${ARGN})
  if(R_REPORT)
    set(${R_REPORT} "" PARENT_SCOPE)
  endif()
  file(REMOVE ${R_JSON})
  execute_process(
    COMMAND ${KILN} conformance ${R_PLUGIN} ${R_ARGS} --json ${R_JSON}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${R_LABEL}: exit ${rc}\n${out}${err}")
  if(NOT rc EQUAL 1)
    conformance_fail("${R_LABEL}: exit status ${rc}, expected 1${R_EXIT_NOTE}")
  endif()
  if(NOT EXISTS ${R_JSON})
    conformance_fail("${R_LABEL}: no JSON report written")
    return()
  endif()
  file(READ ${R_JSON} report)
  if(R_REPORT)
    set(${R_REPORT} "${report}" PARENT_SCOPE)
  endif()
  string(JSON total GET "${report}" total)
  string(JSON n_cases LENGTH "${report}" cases)
  if(NOT total EQUAL R_CASES)
    conformance_fail("${R_LABEL}: ${total} cases reported, expected ${R_CASES}${R_COUNT_NOTE}")
  endif()
  if(NOT n_cases EQUAL total)
    conformance_fail("${R_LABEL}: the report lists ${n_cases} cases, its total says ${total}")
  endif()
  if(n_cases EQUAL 0)
    return()
  endif()
  math(EXPR last "${n_cases} - 1")
  foreach(i RANGE ${last})
    string(JSON name GET "${report}" cases ${i} name)
    string(JSON result GET "${report}" cases ${i} result)
    string(JSON msg GET "${report}" cases ${i} message)
    cmake_language(CALL ${R_CHECK_CASE} "${R_LABEL}" "${name}" "${result}" "${msg}")
  endforeach()
endfunction()

# Fails the script with `heading` and every mismatch recorded, or prints `summary` when there is none.
function(conformance_finish heading summary)
  get_property(failures GLOBAL PROPERTY KILN_CONFORMANCE_FAILURES)
  if(failures)
    string(REPLACE ";" "\n  " text "${failures}")
    message(FATAL_ERROR "${heading}:\n  ${text}")
  endif()
  message(STATUS "${summary}")
endfunction()
