# What `cmake --install build --prefix P` puts under P (a relocatable tree: nothing below names P itself):
#
#   P/include/keel/{keel.h,plugin.h,keel.hpp}     the C API, the plugin ABI, the C++ wrapper
#   P/lib/libkeel.so -> libkeel.so.0 -> .0.1.0    the runtime: exports the C API only (core/libkeel.map)
#   P/lib/libkeel_core.so.0 -> .0.1.0             the same core with its C++ symbols, private to bin/keel (and
#                                                 libkeel_train): no namelink, no headers, not an API to link
#   P/bin/keel                                    the command line (RPATH $ORIGIN/../lib)
#   P/lib/keel/plugins/*.so + *.keel-plugin.toml  every in-tree plugin with its manifest (keel_add_plugin)
#   P/lib/cmake/Keel/KeelConfig*.cmake            find_package(Keel): keel::keel (libkeel + headers), keel::sdk
#   P/lib/pkgconfig/keel.pc                       pkg-config --cflags --libs keel
#
# The package does not export keel_core's build-tree interface (onnx, protobuf, spdlog, the source tree's include
# directories): a host application needs keel.h and libkeel.so only, and a plugin needs the headers only. So
# KeelConfig.cmake declares both targets as IMPORTED targets relative to its own location, and needs no other
# package. The binary and libkeel find their own system dependencies through the loader's default paths.
include(CMakePackageConfigHelpers)

set(KEEL_INSTALL_CMAKE_DIR lib/cmake/Keel)

# keel.h states the version in macros; it must be the project's.
file(STRINGS ${PROJECT_SOURCE_DIR}/sdk/include/keel/keel.h _keel_h_version REGEX "^#define KEEL_VERSION_STRING ")
string(REGEX REPLACE ".*\"(.*)\".*" "\\1" _keel_h_version "${_keel_h_version}")
if(NOT _keel_h_version STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "sdk/include/keel/keel.h says version ${_keel_h_version}, the project is ${PROJECT_VERSION}: "
                      "update KEEL_VERSION_MAJOR/MINOR/PATCH/STRING in keel.h")
endif()
foreach(_part MAJOR MINOR)
  file(STRINGS ${PROJECT_SOURCE_DIR}/sdk/include/keel/plugin.h _line REGEX "^#define KEEL_PLUGIN_ABI_${_part} [0-9]+")
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" KEEL_PLUGIN_ABI_${_part} "${_line}")
endforeach()

install(DIRECTORY ${PROJECT_SOURCE_DIR}/sdk/include/keel DESTINATION include COMPONENT sdk
  FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")

install(TARGETS libkeel
  LIBRARY DESTINATION lib COMPONENT runtime NAMELINK_COMPONENT sdk)
install(TARGETS keel_core
  LIBRARY DESTINATION lib COMPONENT runtime NAMELINK_SKIP)
if(TARGET keel)
  install(TARGETS keel RUNTIME DESTINATION bin COMPONENT runtime)
endif()

get_target_property(_keel_soversion libkeel SOVERSION)
set(KEEL_INSTALL_LIBRARY_FILE "libkeel.so.${PROJECT_VERSION}")
set(KEEL_INSTALL_LIBRARY_SONAME "libkeel.so.${_keel_soversion}")
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/KeelConfig.cmake.in
  ${CMAKE_BINARY_DIR}/package/KeelConfig.cmake
  INSTALL_DESTINATION ${KEEL_INSTALL_CMAKE_DIR})
# Same major = compatible (the C API and the plugin ABI only grow within a major).
write_basic_package_version_file(${CMAKE_BINARY_DIR}/package/KeelConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/package/KeelConfig.cmake ${CMAKE_BINARY_DIR}/package/KeelConfigVersion.cmake
  DESTINATION ${KEEL_INSTALL_CMAKE_DIR} COMPONENT sdk)

configure_file(${CMAKE_CURRENT_LIST_DIR}/keel.pc.in ${CMAKE_BINARY_DIR}/package/keel.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/package/keel.pc DESTINATION lib/pkgconfig COMPONENT sdk)
