# Run by ctest (see CMakeLists.txt next to this file) as `cmake -P`: install, build the consumer, run it.
# Every step must succeed; the first failure stops the check with the step's output.
cmake_minimum_required(VERSION 3.25)

function(step name)
  list(JOIN ARGN " " command)
  message(STATUS "install check: ${name}: ${command}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install check: ${name} failed (${rc}):\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/consumer-build)
# Start from nothing, so files left by an earlier run cannot hide a missing install rule.
file(REMOVE_RECURSE ${WORK_DIR})

step(install ${CMAKE_COMMAND} --install ${MEMTRAIN_BUILD_DIR} --prefix ${prefix})
foreach(f include/memtrain/core/allocator.h)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install check: ${prefix}/${f} was not installed")
  endif()
endforeach()

step(configure ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${consumer_build}
  -G ${GENERATOR} -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}
  -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
  -DCMAKE_CXX_FLAGS=${CONSUMER_FLAGS} -DCMAKE_EXE_LINKER_FLAGS=${CONSUMER_FLAGS}
  -DCMAKE_PREFIX_PATH=${prefix} -DEXPECT_CUDA=${EXPECT_CUDA})
step(build ${CMAKE_COMMAND} --build ${consumer_build})
step(run ${consumer_build}/memtrain_consumer)
message("${step_output}")
if(NOT step_output MATCHES "memtrain consumer: ok")
  message(FATAL_ERROR "install check: the consumer did not report success")
endif()
