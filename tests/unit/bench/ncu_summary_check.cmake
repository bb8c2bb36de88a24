# bench/ncu_summary.py on one recorded step (three launches of an H200 gpt step, as ncu --csv
# wrote them) and on a missing file. Run by ctest with -DPYTHON= -DSCRIPT= -DDATA=.
execute_process(COMMAND ${PYTHON} ${SCRIPT} ${DATA}/ncu_step.csv --sources ${DATA}/sources
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ncu_summary.py exited ${rc}: ${err}")
endif()
foreach(want
    "3 kernels, 88.4 us of GPU time; generated: 2 kernels, 54.0 us (61.2 %)"
    "43.6        1   2.89  kiln_k5 (grid 2112, block 256): flat bf16[64,256,1536], 2 stages"
    "34.3        1   1.09  nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT (grid 132, block 384)"
    "10.5        1   2.52  kiln_k4 (grid 2112, block 256): flat bf16[64,256,384], 1 stage")
  string(FIND "${out}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "ncu_summary.py did not print\n  ${want}\nit printed:\n${out}")
  endif()
endforeach()
# Largest first.
string(FIND "${out}" "kiln_k5 (grid" k5)
string(FIND "${out}" "kiln_k4 (grid" k4)
if(NOT k5 LESS k4)
  message(FATAL_ERROR "kernels not listed largest first:\n${out}")
endif()
execute_process(COMMAND ${PYTHON} ${SCRIPT} ${DATA}/no_such.csv OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 2 OR NOT err MATCHES "ncu_summary: .*no_such.csv")
  message(FATAL_ERROR "a missing file: exit ${rc} (want 2), stderr: ${err}")
endif()
