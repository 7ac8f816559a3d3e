# Install rules: the library, its public headers, and a CMake package so an outside project can write
#   find_package(memtrain REQUIRED)
#   target_link_libraries(app PRIVATE memtrain::memtrain)
# memtrain is a shared library: only its public dependencies (fmt, nlohmann_json) are part of the exported
# interface. The CUDA module, libmemtrain_cuda.so, is installed beside it but not exported: libmemtrain.so
# loads it at run time, so a consumer needs no CUDA toolkit to build, and the package works from any prefix
# (nothing in the exported files names a path of the build machine; the install check greps for one).
include(CMakePackageConfigHelpers)

set(MEMTRAIN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/memtrain)

install(TARGETS memtrain EXPORT memtrainTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET memtrain_cuda)
  install(TARGETS memtrain_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/memtrain
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(EXPORT memtrainTargets
  NAMESPACE memtrain::
  FILE memtrainTargets.cmake
  DESTINATION ${MEMTRAIN_INSTALL_CMAKEDIR})

# Plain TRUE/FALSE for the config template, whatever spelling the options used.
foreach(flag MEMTRAIN_HAVE_CUDA MEMTRAIN_HAVE_ONEDNN MEMTRAIN_HAVE_MPI)
  if(${flag})
    set(${flag}_VALUE TRUE)
  else()
    set(${flag}_VALUE FALSE)
  endif()
endforeach()

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/memtrainConfig.cmake.in
  ${PROJECT_BINARY_DIR}/memtrainConfig.cmake
  INSTALL_DESTINATION ${MEMTRAIN_INSTALL_CMAKEDIR})
# Before 1.0 a minor release may break the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/memtrainConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/memtrainConfig.cmake
  ${PROJECT_BINARY_DIR}/memtrainConfigVersion.cmake
  DESTINATION ${MEMTRAIN_INSTALL_CMAKEDIR})
