# What `cmake --install build --prefix P` puts under P (a relocatable tree: nothing below names P itself):
#
#   P/include/keel/{keel.h,plugin.h,keel.hpp}     the C API, the plugin ABI, the C++ wrapper
#   P/lib/libkeel.so -> libkeel.so.0 -> .0.1.0    the runtime: exports the C API only (core/libkeel.map)
#   P/lib/libkeel_core.so.0 -> .0.1.0             the same core with its C++ symbols: bin/keel's, and the core of
#                                                 the C++ training API (no namelink: linked through keel::train or
#                                                 keel-train.pc, never by -lkeel_core)
#   P/lib/libkeel_train.so -> .so.0 -> .0.1.0     the C++ training API (RUNPATH $ORIGIN: finds libkeel_core.so.0)
#   P/include/keel/train.hpp                      its umbrella header; P/include/keel/cxx/{core,hal}/...: the core's
#                                                 headers it includes (the closure, nothing else; no third-party
#                                                 header but nlohmann/json)
#   P/bin/keel                                    the command line (RPATH $ORIGIN/../lib)
#   P/lib/keel/plugins/*.so + *.keel-plugin.toml  every in-tree plugin with its manifest (keel_add_plugin)
#   P/lib/cmake/Keel/KeelConfig*.cmake            find_package(Keel): keel::keel (libkeel + headers), keel::sdk,
#                                                 keel::train (component train: libkeel_train + libkeel_core)
#   P/lib/pkgconfig/keel.pc, keel-train.pc        pkg-config --cflags --libs keel | keel-train
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
set(KEEL_TRAIN_LIBRARY_FILE "libkeel_train.so.${PROJECT_VERSION}")
set(KEEL_TRAIN_LIBRARY_SONAME "libkeel_train.so.${_keel_soversion}")
set(KEEL_CORE_LIBRARY_FILE "libkeel_core.so.${PROJECT_VERSION}")
set(KEEL_CORE_LIBRARY_SONAME "libkeel_core.so.${_keel_soversion}")
# keel::train is declared by KeelConfig.cmake only when the build has libkeel_train.
if(TARGET keel_train)
  set(KEEL_HAVE_TRAIN TRUE)
else()
  set(KEEL_HAVE_TRAIN FALSE)
endif()
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

# The C++ training API (ARCHITECTURE.md, "The installed C++ training API"): the umbrella header, the closure of core
# headers it includes (keep this list equal to that closure: install_test.sh compiles the umbrella against the
# installed tree alone), keel::train in KeelConfig.cmake and keel-train.pc.
if(TARGET keel_train)
  install(FILES ${PROJECT_SOURCE_DIR}/core/train/public/keel/train.hpp DESTINATION include/keel COMPONENT sdk)
  set(KEEL_TRAIN_PUBLIC_HEADERS
    core/base/allocator.h core/base/device_spec.h core/base/dtype.h core/base/graph.h core/base/log.h
    core/base/options.h core/base/registry.h core/base/status.h core/base/tensor.h core/base/value.h
    core/runtime/dist/identity.h core/runtime/dist/process_group.h core/runtime/dist/store.h
    core/runtime/eager.h core/runtime/environment.h core/runtime/onnx_io.h core/runtime/plugin_manager.h
    core/runtime/session.h
    core/train/checkpoint.h core/train/data.h core/train/data_parallel.h core/train/export.h core/train/idx.h
    core/train/nn.h core/train/onnx_module.h core/train/optim.h core/train/run_plot.h core/train/run_record.h core/train/scalar_log.h core/train/trainer.h
    hal/device.h)
  foreach(_h IN LISTS KEEL_TRAIN_PUBLIC_HEADERS)
    get_filename_component(_d ${_h} DIRECTORY)
    install(FILES ${PROJECT_SOURCE_DIR}/${_h} DESTINATION include/keel/cxx/${_d} COMPONENT sdk)
  endforeach()
  configure_file(${CMAKE_CURRENT_LIST_DIR}/keel-train.pc.in ${CMAKE_BINARY_DIR}/package/keel-train.pc @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/package/keel-train.pc DESTINATION lib/pkgconfig COMPONENT sdk)
endif()
