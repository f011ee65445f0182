# Writes OUTPUT (a header defining ULYSSES_VERSION) from `git describe` of SOURCE_DIR, run at
# every build by core/CMakeLists.txt. The file is rewritten only when the version changes, so
# an unchanged tree recompiles nothing.
execute_process(COMMAND git describe --always --dirty --tags
                WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE version OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT version)
  set(version "unknown")
endif()
set(content "#define ULYSSES_VERSION \"${version}\"\n")
set(previous "")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} previous)
endif()
if(NOT previous STREQUAL content)
  file(WRITE ${OUTPUT} "${content}")
endif()
