# Run by ctest (see CMakeLists.txt next to this file) as `cmake -P`: install, move the prefix, build the
# consumer against the moved prefix with the CUDA toolkit hidden, run it. Every step must succeed; the first
# failure stops the check with the step's output.
#
# What it shows: the package is relocatable (nothing in its CMake files names a path of the build machine,
# and it works from a prefix it was not installed to), a consumer builds with no CUDA toolkit in sight and
# no C++ standard of its own, and the CUDA module is optional at run time (hidden, cuda::unavailable_reason()
# names it). The custom-model example is built the same way.
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

set(installed ${WORK_DIR}/prefix)
set(prefix ${WORK_DIR}/moved-prefix)
set(consumer_build ${WORK_DIR}/consumer-build)
# Start from nothing, so files left by an earlier run cannot hide a missing install rule.
file(REMOVE_RECURSE ${WORK_DIR})

step(install ${CMAKE_COMMAND} --install ${MEMTRAIN_BUILD_DIR} --prefix ${installed})
file(RENAME ${installed} ${prefix})
foreach(f include/memtrain/core/allocator.h lib/cmake/memtrain/memtrainConfig.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install check: ${prefix}/${f} was not installed")
  endif()
endforeach()

# No absolute path in the exported CMake files: every path there must be relative to the prefix
# (${_IMPORT_PREFIX}, ${CMAKE_CURRENT_LIST_DIR}). An absolute one starts a quoted string or a list element.
file(GLOB_RECURSE package_files ${prefix}/lib/cmake/*.cmake)
set(absolute "")
foreach(f IN LISTS package_files)
  file(STRINGS ${f} lines REGEX "[\";]/[A-Za-z0-9_.+-]")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^[ \t]*#")
      list(APPEND absolute "${f}: ${line}")
    endif()
  endforeach()
endforeach()
if(absolute)
  list(JOIN absolute "\n" absolute)
  message(FATAL_ERROR "install check: the installed CMake files name absolute paths:\n${absolute}")
endif()

# Hide the CUDA toolkit: from CMake's searches and from PATH (nvcc).
set(path_without_cuda "")
string(REPLACE ":" ";" path_entries "$ENV{PATH}")
foreach(entry IN LISTS path_entries)
  if(NOT entry MATCHES "cuda")
    list(APPEND path_without_cuda ${entry})
  endif()
endforeach()
string(REPLACE ";" ":" path_without_cuda "${path_without_cuda}")
set(hidden_cuda ${CMAKE_COMMAND} -E env PATH=${path_without_cuda} CUDAToolkit_ROOT= CUDA_PATH=)

step(configure ${hidden_cuda} ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${consumer_build}
  -G ${GENERATOR} -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}
  -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
  -DCMAKE_CXX_FLAGS=${CONSUMER_FLAGS} -DCMAKE_EXE_LINKER_FLAGS=${CONSUMER_FLAGS}
  -DCMAKE_IGNORE_PREFIX_PATH=/usr/local/cuda
  -DCMAKE_PREFIX_PATH=${prefix} -DEXPECT_CUDA=${EXPECT_CUDA})
step(build ${hidden_cuda} ${CMAKE_COMMAND} --build ${consumer_build})
step(run ${consumer_build}/memtrain_consumer)
message("${step_output}")
if(NOT step_output MATCHES "memtrain consumer: ok")
  message(FATAL_ERROR "install check: the consumer did not report success")
endif()

# The custom-model example (examples/custom_model), built the way its README section says: an outside project
# against the moved prefix, no C++ standard of its own, no CUDA toolkit in sight. A short run must train.
set(example_build ${WORK_DIR}/custom-model-build)
step(configure_example ${hidden_cuda} ${CMAKE_COMMAND} -S ${EXAMPLE_SOURCE_DIR} -B ${example_build}
  -G ${GENERATOR} -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}
  -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
  -DCMAKE_CXX_FLAGS=${CONSUMER_FLAGS} -DCMAKE_EXE_LINKER_FLAGS=${CONSUMER_FLAGS}
  -DCMAKE_IGNORE_PREFIX_PATH=/usr/local/cuda -DCMAKE_PREFIX_PATH=${prefix})
step(build_example ${hidden_cuda} ${CMAKE_COMMAND} --build ${example_build})
step(run_example ${example_build}/memtrain_custom_model --steps 2 --out-dir ${WORK_DIR}/custom-model-run)
if(NOT step_output MATCHES "custom_model: val loss [0-9.]+ -> [0-9.]+")
  message(FATAL_ERROR "install check: the custom-model example did not train:\n${step_output}")
endif()

# With the CUDA module gone, the CPU path still works and the reason names the missing library.
if(EXPECT_CUDA)
  set(module ${prefix}/lib/libmemtrain_cuda.so)
  if(NOT EXISTS ${module})
    message(FATAL_ERROR "install check: the CUDA module ${module} was not installed")
  endif()
  file(RENAME ${module} ${module}.hidden)
  step(run_without_cuda_module ${consumer_build}/memtrain_consumer)
  file(RENAME ${module}.hidden ${module})
  message("${step_output}")
  if(NOT step_output MATCHES "memtrain consumer: ok" OR NOT step_output MATCHES "available no, reason: [^\n]*libmemtrain_cuda\\.so")
    message(FATAL_ERROR "install check: without libmemtrain_cuda.so the consumer must run on the CPU and name the module")
  endif()
endif()
