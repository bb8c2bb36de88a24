# Runs `kiln conformance` on the plugins whose own code never runs or runs wrong, and asserts the
# verdict and message of every case it runs: a case passes only where the plugin did what it must.
#   declines_everything   compile always returns KILN_ERROR_UNIMPLEMENTED
#   compile_always_fails  compile always returns KILN_ERROR_INTERNAL
#   wrong_kernel          add and sub ignore alpha
#   claims_nothing        available, claims no node of any graph
#   stale_scalars         keeps the run-time scalar values of its first execute
#   ignores_sizes         hands back the program of the first graph of the same ops at other sizes
#   cmake -DKILN=path/to/kiln -DPLUGIN_DIR=dir -DWORK_DIR=dir -P check_verdicts.cmake
include(${CMAKE_CURRENT_LIST_DIR}/conformance_checks.cmake)
file(MAKE_DIRECTORY ${WORK_DIR})
# The cases each plugin runs: where its defect shows, and beside it cases it must still pass or skip.
set(_cases "Claim.PartitionsFormedFromClaimsCompile:Numeric.UnaryPointwise:Numeric.BinaryPointwise:Workload.Mlp")
set(_cases_declines_everything ${_cases})
set(_cases_compile_always_fails ${_cases})
set(_cases_wrong_kernel ${_cases})
set(_cases_claims_nothing "Claim.PartitionsFormedFromClaimsCompile:Numeric.UnaryPointwise:Numeric.RuntimeScalars:\
Workload.Mlp:Workload.PluginRunsInSomeReferenceStep")
set(_cases_ignores_sizes "Numeric.BinaryPointwise:Workload.Mlp:Workload.MlpBatchSizesThatChange:\
SymbolicShapes.OneExecutableServesEverySize")
set(_cases_stale_scalars "Numeric.UnaryPointwise:Numeric.BinaryPointwise:Numeric.RuntimeScalars:\
Numeric.RuntimeScalarChains")
# plugin|case|result|text the message must contain
set(_expected
  "declines_everything|Claim.PartitionsFormedFromClaimsCompile|passed| groups: 0 compiled, "
  "declines_everything|Numeric.UnaryPointwise|skipped|declines to compile every one (KILN_ERROR_UNIMPLEMENTED)"
  "declines_everything|Numeric.BinaryPointwise|skipped|declines to compile every one (KILN_ERROR_UNIMPLEMENTED)"
  "declines_everything|Workload.Mlp|failed|declines_everything declined all"
  "declines_everything|Workload.Mlp|failed|groups it claimed of the mlp step: none of its code ran"
  "compile_always_fails|Claim.PartitionsFormedFromClaimsCompile|failed|failed to compile (internal)"
  "compile_always_fails|Numeric.UnaryPointwise|failed|claimed, then failed to compile"
  "compile_always_fails|Numeric.BinaryPointwise|failed|code generator crashed on"
  "compile_always_fails|Workload.Mlp|failed|claimed groups failed to compile and ran eagerly"
  "wrong_kernel|Claim.PartitionsFormedFromClaimsCompile|passed|compiled, 0 declined"
  "wrong_kernel|Numeric.UnaryPointwise|passed|variants claimed and checked"
  "wrong_kernel|Numeric.BinaryPointwise|failed|aten::add.Tensor(f32[4,5], f32[4,5]): output 0 relative error"
  "wrong_kernel|Workload.Mlp|failed|mlp loss at step 4"
  "claims_nothing|Claim.PartitionsFormedFromClaimsCompile|skipped|the plugin claims no node of the"
  "claims_nothing|Numeric.UnaryPointwise|skipped|the plugin claims none of the"
  "claims_nothing|Numeric.RuntimeScalars|skipped|does not declare KILN_CAPABILITY_RUNTIME_SCALARS"
  "claims_nothing|Workload.Mlp|skipped|claims_nothing claims none of the"
  "claims_nothing|Workload.PluginRunsInSomeReferenceStep|failed|claims_nothing claimed no node of any reference workload (mlp, cnn, gpt)"
  "claims_nothing|Workload.PluginRunsInSomeReferenceStep|failed|nothing of it ran"
  "ignores_sizes|Numeric.BinaryPointwise|failed|aten::add.Tensor(f32[33,65], f32[33,65]): output 0 relative error inf"
  "ignores_sizes|Workload.Mlp|passed|steps match eager"
  "ignores_sizes|Workload.MlpBatchSizesThatChange|failed|mlp loss at step "
  "ignores_sizes|Workload.MlpBatchSizesThatChange|failed| (batch size "
  "ignores_sizes|SymbolicShapes.OneExecutableServesEverySize|failed|mul+add+relu+neg"
  "ignores_sizes|SymbolicShapes.OneExecutableServesEverySize|failed|(second size: offered in symbolic form): output 0 relative error"
  "stale_scalars|Numeric.UnaryPointwise|passed|variants claimed and checked"
  "stale_scalars|Numeric.BinaryPointwise|passed|variants claimed and checked"
  "stale_scalars|Numeric.RuntimeScalars|failed|aten::mul.Scalar(f32[4,5], other=$0), execute 2 of 4"
  "stale_scalars|Numeric.RuntimeScalars|failed|execute 1, with the values it was compiled with, matched"
  "stale_scalars|Numeric.RuntimeScalarChains|failed|adamw update(f32[33,65], f32[33,65], f32[33,65], f32[33,65], step_size=$0, bias_correction2_sqrt=$1, decay=$2), execute 2 of 4")

# Each case must have rows in _expected, and match every one of them.
function(check_case plugin name result msg)
  set(checked FALSE)
  foreach(row ${_expected})
    string(REPLACE "|" ";" fields "${row}")
    list(GET fields 0 want_plugin)
    list(GET fields 1 want_case)
    list(GET fields 2 want_result)
    list(GET fields 3 want_text)
    if(NOT want_plugin STREQUAL plugin OR NOT want_case STREQUAL name)
      continue()
    endif()
    set(checked TRUE)
    if(NOT result STREQUAL want_result)
      conformance_fail("${plugin}: ${name} is ${result}, expected ${want_result} (${msg})")
    endif()
    string(FIND "${msg}" "${want_text}" at)
    if(at EQUAL -1)
      conformance_fail("${plugin}: ${name}'s message lacks '${want_text}': ${msg}")
    endif()
  endforeach()
  if(NOT checked)
    conformance_fail("${plugin}: ${name} has no expected verdict")
  endif()
endfunction()

foreach(plugin declines_everything compile_always_fails wrong_kernel claims_nothing stale_scalars ignores_sizes)
  string(REPLACE ":" ";" case_list "${_cases_${plugin}}")
  list(LENGTH case_list n_cases)
  conformance_run(LABEL ${plugin} PLUGIN ${PLUGIN_DIR}/libkiln_${plugin}.so JSON ${WORK_DIR}/${plugin}.json
    CASES ${n_cases} EXIT_NOTE " (a case fails)" CHECK_CASE check_case
    ARGS --filter ${_cases_${plugin}} --jobs 2 --steps 2)
endforeach()
conformance_finish("the conformance suite misjudged plugins whose code did not run or was wrong"
  "declined everything, failed every compile, wrong kernel, claimed nothing, stale run-time scalars: each got its verdicts")
