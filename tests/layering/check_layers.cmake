# The layering rule of docs/architecture.md (DESIGN.md "Layers": lower never includes higher), checked on the
# include lines of every file under src/, include/memtrain/ and kernels/ of ROOT:
#
#   cmake -DROOT=<source tree> -P tests/layering/check_layers.cmake
#
# Rule 1: a file never includes a header of a layer above its own. A file's layer is its folder (src/<folder>/,
#         include/memtrain/<folder>/, kernels/); an include's layer is the folder it names ("memtrain/amp/...",
#         "core/backend.h", "kernels/x.cuh"). Includes naming no layer folder (system, third party, same folder)
#         are not checked.
# Rule 2: the raw CUDA entry points (src/cuda/*.h, private) are included by the CUDA backend only (src/cuda/,
#         kernels/); the rest reaches CUDA through the backend contract (src/core/backend.h). The public
#         memtrain/cuda/cuda.h holds only the device queries.
# Rule 3: outside the backends (src/cpu, src/cuda, src/meta, kernels/) code does not choose its path by device
#         (is_cpu(), is_cuda(), DeviceType::) except in the files of `device_dispatch` below, each with its
#         reason: that choice is the backend registry's. A device named inside an MT_CHECK on the same line is a
#         refusal ("collectives take CPU tensors"), and is_meta() is the meta device's documented data-dependent
#         branch (bytes, no values); both are counted and reported, not refused.
# Prints every violation and fails when there is one. tests/layering/fixture holds a tree with known
# violations, to show the check finds them (the test layering_check_catches_violations).
cmake_minimum_required(VERSION 3.20)

if(NOT DEFINED ROOT OR NOT IS_DIRECTORY "${ROOT}")
  message(FATAL_ERROR "check_layers: pass -DROOT=<source tree>")
endif()

# ---- the layers, lowest first (docs/architecture.md; io/, absent from DESIGN.md's table, is file formats and
# atomic writes over core only, used by models, data and training, so it sits right above core) ----
set(layer_names core io backends ops+autograd techniques models data training distributed planning)
set(rank_core 0)
set(rank_io 1)
foreach(folder cpu cuda meta kernels)
  set(rank_${folder} 2)
endforeach()
set(rank_ops 3)
set(rank_autograd 3)
set(rank_amp 4)
set(rank_ckpt 4)
set(rank_optim 4)
set(rank_nn 5)
set(rank_data 6)
set(rank_train 7)
set(rank_dist 8)
set(rank_plan 9)
set(backends_rank 2)

# ---- exceptions: "<file regex>|<include regex>", each with the reason; the coordinator removes them once the
# file is fixed (an entry that no longer matches anything is reported as stale) ----
set(allowed "")  # none left: every file keeps to its layer
set(allowed_used "")

# ---- rule 3: the files outside the backends allowed to choose a path by device, "<file regex>|<reason>" ----
set(device_dispatch
  "^src/core/backend_registry\\.cpp$|the registry: a backend and a cache policy per device type, and who moves a copy's bytes"
  "^include/memtrain/core/device\\.h$|the Device type itself"
  "^src/train/predict\\.cpp$|planning: a CPU run's loader batches share the process's memory, a device run's do not")
set(device_dispatch_files "")
set(device_refusal_files "")
set(device_meta_files "")

set(violations "")
set(checked 0)
file(GLOB_RECURSE files RELATIVE "${ROOT}" "${ROOT}/src/*" "${ROOT}/include/memtrain/*" "${ROOT}/kernels/*")
foreach(file IN LISTS files)
  if(NOT file MATCHES "\\.(h|hpp|cpp|cc|cu|cuh|inl)$")
    continue()
  endif()
  if(file STREQUAL "include/memtrain/memtrain.h")
    continue()  # the one-include umbrella: includes every layer by design
  endif()
  if(file MATCHES "^kernels/")
    set(folder kernels)
  elseif(file MATCHES "^src/([^/]+)/")
    set(folder "${CMAKE_MATCH_1}")
  elseif(file MATCHES "^include/memtrain/([^/]+)/")
    set(folder "${CMAKE_MATCH_1}")
  else()
    list(APPEND violations "${file}: not inside a layer folder")
    continue()
  endif()
  if(NOT DEFINED rank_${folder})
    list(APPEND violations "${file}: folder '${folder}' has no layer: add it to docs/architecture.md and to this check")
    continue()
  endif()
  set(rank ${rank_${folder}})
  math(EXPR checked "${checked} + 1")

  if(NOT folder MATCHES "^(cpu|cuda|meta|kernels)$")
    # One list element per line: the code's own semicolons and brackets would split or join CMake list items.
    file(READ "${ROOT}/${file}" text)
    string(REGEX REPLACE "[][;]" "," text "${text}")
    string(REPLACE "\n" ";" device_lines "${text}")
    foreach(line IN LISTS device_lines)
      if(NOT line MATCHES "is_cpu\\(\\)|is_cuda\\(\\)|is_meta\\(\\)|DeviceType::")
        continue()
      elseif(line MATCHES "^[ \t]*//")
        continue()  # a comment
      elseif(line MATCHES "MT_CHECK\\(.*(is_cpu|is_cuda|DeviceType::)")
        list(APPEND device_refusal_files "${file}")
      elseif(NOT line MATCHES "is_cpu\\(\\)|is_cuda\\(\\)|DeviceType::")
        list(APPEND device_meta_files "${file}")
      else()
        set(reason "")
        foreach(entry IN LISTS device_dispatch)
          string(REPLACE "|" ";" pair "${entry}")
          list(GET pair 0 file_re)
          if(file MATCHES "${file_re}")
            list(GET pair 1 reason)
          endif()
        endforeach()
        if(reason STREQUAL "")
          string(STRIP "${line}" code)
          list(APPEND violations "${file} chooses its path by device (\"${code}\"): add a backend entry (src/core/backend_entries.def) instead")
        else()
          list(APPEND device_dispatch_files "${file}")
        endif()
      endif()
    endforeach()
  endif()

  file(STRINGS "${ROOT}/${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"]")
      continue()
    endif()
    set(inc "${CMAKE_MATCH_1}")
    if(inc STREQUAL "memtrain/memtrain.h")
      set(inc_rank 99)
      set(inc_layer "the umbrella header")
    elseif(inc STREQUAL "memtrain/cuda/cuda.h")
      set(inc_rank 0)  # the public device queries: answered by core's registry when there is no CUDA backend
      set(inc_layer "core")
    elseif(inc MATCHES "^(memtrain/)?([^/]+)/")
      if(NOT DEFINED rank_${CMAKE_MATCH_2})
        continue()  # not a layer folder: third party ("fmt/format.h", "Eigen/Core")
      endif()
      set(inc_rank ${rank_${CMAKE_MATCH_2}})
      list(GET layer_names ${inc_rank} inc_layer)
    else()
      continue()  # same folder or system header
    endif()

    set(problem "")
    if(inc_rank GREATER rank)
      list(GET layer_names ${rank} own_layer)
      set(problem "${own_layer} includes ${inc_layer}, a layer above it")
    elseif(inc MATCHES "^cuda/" AND NOT folder MATCHES "^(cuda|kernels)$")
      set(problem "a raw CUDA entry point outside the CUDA backend: go through the backend contract (core/backend.h)")
    endif()
    if(problem STREQUAL "")
      continue()
    endif()

    set(exempt FALSE)
    foreach(entry IN LISTS allowed)
      string(REPLACE "|" ";" pair "${entry}")
      list(GET pair 0 file_re)
      list(GET pair 1 inc_re)
      if(file MATCHES "${file_re}" AND inc MATCHES "${inc_re}")
        set(exempt TRUE)
        list(APPEND allowed_used "${entry}")
      endif()
    endforeach()
    if(NOT exempt)
      list(APPEND violations "${file} includes \"${inc}\": ${problem}")
    endif()
  endforeach()
endforeach()

foreach(entry IN LISTS allowed)
  list(FIND allowed_used "${entry}" used_at)
  if(used_at EQUAL -1)
    message(STATUS "layering: stale exception (nothing matches it any more; remove it): ${entry}")
  endif()
endforeach()

list(LENGTH violations count)
if(count GREATER 0)
  list(JOIN violations "\n  " text)
  message(FATAL_ERROR "layering: ${count} violations in ${ROOT} (docs/architecture.md):\n  ${text}\n")
endif()
message(STATUS "layering: ${checked} files checked, no file includes a header of a layer above its own")
foreach(kind dispatch refusal meta)
  list(REMOVE_DUPLICATES device_${kind}_files)
  list(LENGTH device_${kind}_files n)
  list(JOIN device_${kind}_files ", " names)
  message(STATUS "device queries outside the backends, ${kind}: ${n} files (${names})")
endforeach()
