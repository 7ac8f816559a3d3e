# Install rules: the library, its public headers, and a CMake package so an outside project can write
#   find_package(memtrain REQUIRED)
#   target_link_libraries(app PRIVATE memtrain::memtrain)
# memtrain is a static library, so its private dependencies are part of the exported link interface
# (as $<LINK_ONLY:...>); memtrainConfig.cmake therefore finds every one of them, including oneDNN and
# the CUDA toolkit when this build used them.
include(CMakePackageConfigHelpers)

set(MEMTRAIN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/memtrain)

install(TARGETS memtrain EXPORT memtrainTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/memtrain
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(EXPORT memtrainTargets
  NAMESPACE memtrain::
  FILE memtrainTargets.cmake
  DESTINATION ${MEMTRAIN_INSTALL_CMAKEDIR})

# Plain TRUE/FALSE for the config template, whatever spelling the options used.
foreach(flag MEMTRAIN_HAVE_CUDA MEMTRAIN_HAVE_ONEDNN)
  if(${flag})
    set(${flag}_VALUE TRUE)
  else()
    set(${flag}_VALUE FALSE)
  endif()
endforeach()

# Where this build found the CUDA toolkit: a hint for consumers, used only if they give none of their own.
set(MEMTRAIN_CUDA_ROOT_HINT "")
if(MEMTRAIN_HAVE_CUDA AND CUDAToolkit_BIN_DIR)
  get_filename_component(MEMTRAIN_CUDA_ROOT_HINT ${CUDAToolkit_BIN_DIR} DIRECTORY)
endif()

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
