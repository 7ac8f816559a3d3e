# CUDA backend: kernels/*.cu + src/cuda/*.cpp as their own shared library, libmemtrain_cuda.so, when CUDA is
# on. libmemtrain.so never links it: it loads it on first use (src/core/cuda_module_loader.cpp), from its own
# directory, so a program that uses only the CPU needs neither the module nor the CUDA toolkit. Without CUDA
# there is no module, and the registry refuses CUDA devices with "memtrain was built without CUDA".
set(MEMTRAIN_HAVE_CUDA OFF)
if(NOT MEMTRAIN_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(MEMTRAIN_HAVE_CUDA ON)
  elseif(MEMTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MEMTRAIN_CUDA=ON but no CUDA compiler was found")
  endif()
endif()

if(MEMTRAIN_HAVE_CUDA)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  file(GLOB MEMTRAIN_CUDA_KERNELS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/*.cu)
  file(GLOB MEMTRAIN_CUDA_HOST CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cuda/*.cpp)
  # dist's NCCL group needs CUDA (and NCCL when found), so it is built into the module (src/dist/nccl_backend.h).
  add_library(memtrain_cuda SHARED ${MEMTRAIN_CUDA_KERNELS} ${MEMTRAIN_CUDA_HOST}
              ${PROJECT_SOURCE_DIR}/src/dist/nccl_communicator.cpp)
  # Kernels need only C++17, which every CMake version knows how to ask nvcc for (3.25 has no CUDA20 flag
  # for nvcc 13); the host code in src/cuda/ is C++ and stays C++20.
  set_target_properties(memtrain_cuda PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  target_link_libraries(memtrain_cuda PUBLIC memtrain
                        PRIVATE Eigen3::Eigen CUDA::cudart CUDA::cublas CUDA::cublasLt CUDA::cusolver)
  memtrain_library_flags(memtrain_cuda)
  # src/cuda/*.cu: backend entries in one file with the kernels they launch (norm.cu), so nvcc compiles host
  # code that includes memtrain's C++20 headers: an object library of its own, built as CUDA C++20 while the
  # kernels stay C++17. CMake 3.25 knows no C++20 flag for nvcc (later versions do), so it is told nvcc's.
  # FMT_USE_CONSTEXPR=1: fmt 9 turns constexpr off under nvcc, and its consteval format-string checks (which
  # MT_CHECK's messages get) then fail to compile; on, the checks work as in the g++ files.
  file(GLOB MEMTRAIN_CUDA_HOST_CU CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cuda/*.cu)
  if(MEMTRAIN_CUDA_HOST_CU)
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    add_library(memtrain_cuda_host_cu OBJECT ${MEMTRAIN_CUDA_HOST_CU})
    set_target_properties(memtrain_cuda_host_cu PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
    target_compile_definitions(memtrain_cuda_host_cu PRIVATE FMT_USE_CONSTEXPR=1 MEMTRAIN_HAVE_CUDA=1)
    target_include_directories(memtrain_cuda_host_cu PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(memtrain_cuda_host_cu PRIVATE memtrain CUDA::cudart)
    target_sources(memtrain_cuda PRIVATE $<TARGET_OBJECTS:memtrain_cuda_host_cu>)
  endif()
  # The core says "built without CUDA" rather than "module missing" only in a build that has no module.
  target_compile_definitions(memtrain PRIVATE MEMTRAIN_HAVE_CUDA=1)
  target_compile_definitions(memtrain_cuda PUBLIC MEMTRAIN_HAVE_CUDA=1)
  # Host code includes "kernels/elementwise.cuh" and the backend's internal "cuda/cuda_common.h".
  target_include_directories(memtrain_cuda PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/src)
  # Installed, the module finds libmemtrain.so beside it ($ORIGIN) and the CUDA libraries where this build
  # found them (LD_LIBRARY_PATH still wins for a toolkit elsewhere). This path is in the module only, never in
  # the exported CMake files.
  set(_mt_cuda_rpath "$ORIGIN" ${CUDAToolkit_LIBRARY_DIR})
  message(STATUS "memtrain: CUDA backend ON (${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES})")

  # cuDNN and NCCL: optional. cuDNN, when found, is linked for conv2d; NCCL for dist::make_nccl_communicator.
  # Besides the toolkit and the usual system paths, look in MEMTRAIN_CUDNN_ROOT / MEMTRAIN_NCCL_ROOT and in
  # the layouts of the pip wheels (nvidia-cudnn-cu13, nvidia-nccl-cu13):
  # site-packages/nvidia/{cudnn,nccl,cu13}/{include,lib}.
  # Wheels ship only versioned names (libcudnn.so.9), hence the explicit NAMES.
  set(MEMTRAIN_CUDNN_ROOT "" CACHE PATH "Extra prefix to search for cuDNN (with include/ and lib/)")
  set(MEMTRAIN_NCCL_ROOT "" CACHE PATH "Extra prefix to search for NCCL (with include/ and lib/)")
  set(_mt_wheel_roots "")
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import site; print(';'.join(site.getsitepackages() + [site.getusersitepackages()]))"
      OUTPUT_VARIABLE _mt_site_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    foreach(_dir IN LISTS _mt_site_dirs)
      list(APPEND _mt_wheel_roots ${_dir}/nvidia/cu13)
    endforeach()
  endif()
  set(_mt_cudnn_hints ${MEMTRAIN_CUDNN_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${_mt_wheel_roots})
  set(_mt_nccl_hints ${MEMTRAIN_NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${_mt_wheel_roots})
  foreach(_dir IN LISTS _mt_site_dirs)
    list(APPEND _mt_cudnn_hints ${_dir}/nvidia/cudnn)
    list(APPEND _mt_nccl_hints ${_dir}/nvidia/nccl)
  endforeach()
  find_path(MEMTRAIN_CUDNN_INCLUDE_DIR cudnn.h HINTS ${_mt_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(MEMTRAIN_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${_mt_cudnn_hints} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64)
  find_path(MEMTRAIN_NCCL_INCLUDE_DIR nccl.h HINTS ${_mt_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(MEMTRAIN_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_mt_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64)
  if(MEMTRAIN_CUDNN_INCLUDE_DIR AND MEMTRAIN_CUDNN_LIBRARY)
    # conv2d (src/cuda/cuda_conv.cpp) uses it; without it conv2d runs its im2col + cuBLAS fallback.
    target_include_directories(memtrain_cuda PRIVATE ${MEMTRAIN_CUDNN_INCLUDE_DIR})
    target_link_libraries(memtrain_cuda PRIVATE ${MEMTRAIN_CUDNN_LIBRARY})
    target_compile_definitions(memtrain_cuda PRIVATE MEMTRAIN_HAVE_CUDNN=1)
    get_filename_component(_mt_cudnn_dir ${MEMTRAIN_CUDNN_LIBRARY} DIRECTORY)
    list(APPEND _mt_cuda_rpath ${_mt_cudnn_dir})
    message(STATUS "memtrain: cuDNN found (${MEMTRAIN_CUDNN_LIBRARY}); conv2d uses it")
  else()
    message(STATUS "memtrain: cuDNN not found (optional; set MEMTRAIN_CUDNN_ROOT)")
  endif()
  if(MEMTRAIN_NCCL_INCLUDE_DIR AND MEMTRAIN_NCCL_LIBRARY)
    # Only src/dist/nccl_communicator.cpp sees nccl.h; without NCCL it compiles to an entry that says so.
    set_source_files_properties(${PROJECT_SOURCE_DIR}/src/dist/nccl_communicator.cpp PROPERTIES
                                COMPILE_DEFINITIONS MEMTRAIN_HAVE_NCCL=1
                                INCLUDE_DIRECTORIES ${MEMTRAIN_NCCL_INCLUDE_DIR})
    target_link_libraries(memtrain_cuda PRIVATE ${MEMTRAIN_NCCL_LIBRARY})
    get_filename_component(_mt_nccl_dir ${MEMTRAIN_NCCL_LIBRARY} DIRECTORY)
    list(APPEND _mt_cuda_rpath ${_mt_nccl_dir})
    message(STATUS "memtrain: NCCL found (${MEMTRAIN_NCCL_LIBRARY}); dist::make_nccl_communicator uses it")
  else()
    message(STATUS "memtrain: NCCL not found (optional; set MEMTRAIN_NCCL_ROOT)")
  endif()
  list(REMOVE_DUPLICATES _mt_cuda_rpath)
  set_target_properties(memtrain_cuda PROPERTIES INSTALL_RPATH "${_mt_cuda_rpath}")
else()
  message(STATUS "memtrain: CUDA backend OFF")
endif()

# Removes from the list named by list_var the sources that include the CUDA backend's private raw entry points
# ("cuda/..." headers of src/cuda/) when there is no CUDA backend to link them against.
function(memtrain_drop_raw_cuda_sources list_var)
  if(MEMTRAIN_HAVE_CUDA)
    return()
  endif()
  set(kept "")
  foreach(src IN LISTS ${list_var})
    file(STRINGS ${src} raw_cuda REGEX "^#include \"cuda/")
    if(NOT raw_cuda)
      list(APPEND kept ${src})
    endif()
  endforeach()
  set(${list_var} ${kept} PARENT_SCOPE)
endfunction()
