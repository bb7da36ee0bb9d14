# SPDX-License-Identifier: Apache-2.0
# Run by `cmake --install` for each installed program and library (see
# DYAD_SPLIT_DEBUG in packaging/CMakeLists.txt): its debug information moves
# to .debug/<name>.debug beside it (where gdb looks by the file's
# .gnu_debuglink) and the installed file keeps its code and symbol table
# only, as distributions ship them. Variables: DYAD_OBJCOPY, DYAD_FILE (the
# installed file, DESTDIR and prefix included).
if(NOT EXISTS "${DYAD_FILE}" OR IS_SYMLINK "${DYAD_FILE}")
  return()
endif()
get_filename_component(dir "${DYAD_FILE}" DIRECTORY)
get_filename_component(name "${DYAD_FILE}" NAME)
set(debug "${dir}/.debug/${name}.debug")
file(MAKE_DIRECTORY "${dir}/.debug")
execute_process(COMMAND "${DYAD_OBJCOPY}" --only-keep-debug "${DYAD_FILE}" "${debug}"
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(WARNING "DYAD: cannot split the debug information of ${DYAD_FILE} (kept whole): ${err}")
  file(REMOVE "${debug}")
  return()
endif()
# The debuglink is made from inside .debug/ so that it records the bare name.
execute_process(COMMAND "${DYAD_OBJCOPY}" --strip-debug "--add-gnu-debuglink=${name}.debug"
                        "${DYAD_FILE}" "${DYAD_FILE}.stripped"
                WORKING_DIRECTORY "${dir}/.debug" RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(WARNING "DYAD: cannot strip ${DYAD_FILE} (kept whole): ${err}")
  file(REMOVE "${DYAD_FILE}.stripped" "${debug}")
  return()
endif()
file(RENAME "${DYAD_FILE}.stripped" "${DYAD_FILE}")
file(CHMOD "${debug}" PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
message(STATUS "Split debug information: ${DYAD_FILE} -> .debug/${name}.debug")
