# Small wrappers so every plugin and test is declared the same way.

# keel_add_plugin(NAME SOURCES ... MANIFEST file.toml.in [LIBS ...] [OUTPUT_DIR dir])
# Builds lib<NAME>.so against the SDK only and writes its manifest beside it (configure_file, so @VARS@ work).
# Plugins built into the default directory (no OUTPUT_DIR: the real plugins, not test fixtures) are installed with
# their manifest into <prefix>/${KEEL_INSTALL_PLUGIN_DIR}; the manifest's `library` is relative, so a moved
# install tree keeps working.
set(KEEL_INSTALL_PLUGIN_DIR lib/keel/plugins)
function(keel_add_plugin name)
  cmake_parse_arguments(P "" "MANIFEST;OUTPUT_DIR" "SOURCES;LIBS" ${ARGN})
  set(install_it OFF)
  if(NOT P_OUTPUT_DIR)
    set(P_OUTPUT_DIR ${KEEL_PLUGIN_OUTPUT_DIR})
    set(install_it ON)
  endif()
  add_library(${name} MODULE ${P_SOURCES})
  target_link_libraries(${name} PRIVATE keel::sdk ${P_LIBS})
  set_target_properties(${name} PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${P_OUTPUT_DIR}
    CXX_VISIBILITY_PRESET hidden
    C_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(P_MANIFEST)
    get_filename_component(manifest_name ${P_MANIFEST} NAME)
    string(REGEX REPLACE "\\.in$" "" manifest_name ${manifest_name})
    set(KEEL_PLUGIN_LIBRARY "lib${name}.so")
    configure_file(${P_MANIFEST} ${P_OUTPUT_DIR}/${manifest_name} @ONLY)
  endif()
  if(install_it)
    # $ORIGIN: a plugin may ship its own dependencies beside it.
    set_target_properties(${name} PROPERTIES INSTALL_RPATH "$ORIGIN")
    install(TARGETS ${name} LIBRARY DESTINATION ${KEEL_INSTALL_PLUGIN_DIR} COMPONENT plugins)
    if(P_MANIFEST)
      install(FILES ${P_OUTPUT_DIR}/${manifest_name} DESTINATION ${KEEL_INSTALL_PLUGIN_DIR} COMPONENT plugins)
    endif()
  endif()
endfunction()

# keel_add_test(NAME SOURCES ... [LIBS ...]) — a GoogleTest executable registered with CTest.
function(keel_add_test name)
  if(NOT KEEL_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 TEST_LIST ${name}_TESTS)
  # The tests' environment: gtest_discover_tests' PROPERTIES would set only the first variable of a list (its script
  # quotes each list element as its own argument), so a ctest include file run after the discovered tests' own sets
  # the whole list on each of them.
  set(env "KEEL_TEST_PLUGIN_DIR=${KEEL_TEST_PLUGIN_OUTPUT_DIR}" "KEEL_BUILD_DIR=${CMAKE_BINARY_DIR}"
      ${KEEL_SANITIZER_TEST_ENV})
  set(env_file "${CMAKE_CURRENT_BINARY_DIR}/${name}_environment.cmake")
  file(WRITE "${env_file}" "foreach(t IN LISTS ${name}_TESTS)\n"
                           "  set_tests_properties(\"\${t}\" PROPERTIES ENVIRONMENT [==[${env}]==])\n"
                           "endforeach()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${env_file}")
endfunction()
include(GoogleTest)

# In a sanitizer build, every test registered with add_test() (scripts, fuzzers, CLI checks, valgrind-free C tests)
# also runs with the build's sanitizer options, as the GoogleTest ones do through keel_add_test: suppressions,
# halt-on-error and the exit code that fails the test. The options are appended at the end of the test's directory,
# after any set_tests_properties(... ENVIRONMENT ...) there, so a test's own variables are kept.
if(KEEL_SANITIZER_TEST_ENV)
  function(add_test)
    _add_test(${ARGV})
    if(ARGV0 STREQUAL "NAME")
      # A deferred call expands its arguments when it runs: EVAL puts this test's name and the options in now.
      cmake_language(EVAL CODE "cmake_language(DEFER CALL set_property TEST [[${ARGV1}]] APPEND PROPERTY ENVIRONMENT [[${KEEL_SANITIZER_TEST_ENV}]])")
    endif()
  endfunction()
endif()
