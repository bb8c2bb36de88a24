# run(<step> <command>...) for the test drivers run with cmake -P (the package tests, the custom
# backend built out of tree): runs the command, fails the test with its output when it fails, and
# leaves its stdout in run_output.
function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${step} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${step}: ok")
  set(run_output "${out}" PARENT_SCOPE)
endfunction()
