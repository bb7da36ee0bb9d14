# SPDX-License-Identifier: Apache-2.0
# cmake -DREPLAY="prog;corpus_dir;prog;corpus_dir..." -P replay_all.cmake
# Runs each replay program on its corpus; fails on the first that fails.
list(LENGTH REPLAY n)
if(n EQUAL 0)
  message(FATAL_ERROR "nothing to replay")
endif()
math(EXPR last "${n} - 1")
foreach(i RANGE 0 ${last} 2)
  math(EXPR j "${i} + 1")
  list(GET REPLAY ${i} prog)
  list(GET REPLAY ${j} dir)
  execute_process(COMMAND ${prog} ${dir} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${prog} ${dir}: ${rc}")
  endif()
endforeach()
