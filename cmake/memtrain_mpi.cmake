# MPI: the data-parallel backend of dist::Communicator (src/dist/mpi_communicator.cpp), built when an MPI
# library is found. Included before the library's sources are globbed, so CMakeLists.txt can drop that file
# when there is no MPI; memtrain_use_mpi(target) wires MPI into the library once the target exists.
#
# MPI stays private to libmemtrain.so: nothing of it is in the exported interface, so a consumer of the
# installed package needs no MPI. Its include directories and MEMTRAIN_HAVE_MPI are set on the sources
# that use them only, so turning MPI on or off does not change (and recompile) every other source.
option(MEMTRAIN_MPI "Build the MPI backend of dist::Communicator when MPI is found" ON)

set(MEMTRAIN_HAVE_MPI OFF)
if(MEMTRAIN_MPI)
  # FindMPI looks for the C bindings only when the C language is enabled (mpi.h is used from C++).
  enable_language(C)
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(MEMTRAIN_HAVE_MPI ON)
    message(STATUS "memtrain: MPI backend ON (${MPI_C_LIBRARIES}, MPI ${MPI_C_VERSION})")
  else()
    message(STATUS "memtrain: MPI not found; dist::world() is a group of one (apt install libopenmpi-dev)")
  endif()
else()
  message(STATUS "memtrain: MPI backend OFF (MEMTRAIN_MPI=OFF)")
endif()

function(memtrain_use_mpi target)
  if(NOT MEMTRAIN_HAVE_MPI)
    return()
  endif()
  # Linked privately: a shared library's private dependencies are not part of its exported link interface.
  target_link_libraries(${target} PRIVATE $<LINK_ONLY:MPI::MPI_C>)
  file(GLOB _mt_mpi_sources ${PROJECT_SOURCE_DIR}/src/dist/mpi_*.cpp)
  set_source_files_properties(${_mt_mpi_sources}
    TARGET_DIRECTORY ${target}
    PROPERTIES INCLUDE_DIRECTORIES "$<TARGET_PROPERTY:MPI::MPI_C,INTERFACE_INCLUDE_DIRECTORIES>"
               COMPILE_OPTIONS "$<TARGET_PROPERTY:MPI::MPI_C,INTERFACE_COMPILE_OPTIONS>"
               # The C API only: mpi.h would otherwise pull in the deprecated C++ bindings (and their warnings).
               COMPILE_DEFINITIONS "OMPI_SKIP_MPICXX=1;MPICH_SKIP_MPICXX=1")
  # world() picks the backend; only its source needs to know whether there is one.
  set_source_files_properties(${PROJECT_SOURCE_DIR}/src/dist/communicator.cpp
    TARGET_DIRECTORY ${target}
    PROPERTIES COMPILE_DEFINITIONS MEMTRAIN_HAVE_MPI=1)
endfunction()
