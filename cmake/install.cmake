# What `cmake --install` (and `make install PREFIX=... DESTDIR=...`) puts
# where, by GNUInstallDirs: the library and its headers, ckpt.pc, the tools,
# the Python package, man pages and bash completion. README.md, "Install".
include(GNUInstallDirs)

# The Python package's directory, relative to the prefix unless given:
# Debian's python3 looks in /usr/lib/python3/dist-packages and in
# /usr/local/lib/python3.X/dist-packages.
set(CKPT_INSTALL_PYTHONDIR "" CACHE STRING
  "where the ckpt Python package is installed (default: the prefix's dist-packages)")
if(CKPT_INSTALL_PYTHONDIR)
  set(ckpt_pydir ${CKPT_INSTALL_PYTHONDIR})
elseif(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(ckpt_pydir lib/python3/dist-packages)
else()
  execute_process(COMMAND ${CKPT_PYTHON} -c "import sys; print('%d.%d' % sys.version_info[:2])"
    OUTPUT_VARIABLE ckpt_pyver OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
  set(ckpt_pydir lib/python${ckpt_pyver}/dist-packages)
endif()
set(CKPT_INSTALL_BASHCOMPDIR ${CMAKE_INSTALL_DATADIR}/bash-completion/completions CACHE STRING
  "where ckptctl's bash completion is installed")
# The udev rule and systemd unit (boot/) go to these when the tree has them.
set(CKPT_INSTALL_UDEVRULESDIR lib/udev/rules.d CACHE STRING "where udev rules are installed")
set(CKPT_INSTALL_SYSTEMDUNITDIR lib/systemd/system CACHE STRING "where systemd units are installed")

# libckpt.so.MAJOR.MINOR.PATCH, its SONAME link libckpt.so.MAJOR (runtime)
# and the link-time libckpt.so; the two public headers (the training path,
# ckpt.h, and the administration, ckpt_admin.h) and the one they include.
install(TARGETS ckpt LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES libckpt/include/ckpt.h libckpt/include/ckpt_admin.h libckpt/core/ckpt_abi.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# ckpt.pc, relocatable: its prefix is found from where the file is, so a
# staged install (DESTDIR) or --prefix at install time gives the right paths.
file(RELATIVE_PATH ckpt_pc_to_prefix /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" ckpt_pc_to_prefix "${ckpt_pc_to_prefix}")
configure_file(${PROJECT_SOURCE_DIR}/libckpt/ckpt.pc.in ${PROJECT_BINARY_DIR}/ckpt.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ckpt.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ckptctl manages devices (sbin); ckpt-trace replays a seeded training trace
# into an image (a reference to compare a device with).
install(TARGETS ckptctl DESTINATION ${CMAKE_INSTALL_SBINDIR})
install(TARGETS ckpt-trace DESTINATION ${CMAKE_INSTALL_BINDIR})

# The Python package without a copy of the library: an installed ckpt loads
# libckpt.so.0 through the dynamic loader (libckpt/python/ckpt/__init__.py).
install(DIRECTORY libckpt/python/ckpt DESTINATION ${ckpt_pydir}
  FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)

# Man pages from reStructuredText (docutils' rst2man): ckptctl(8) from
# man/ckptctl.8.rst with each command's --help filled in by
# man/ckptctl-man.py; dm-ckpt(4) from the target's reference kmod/dm-ckpt.rst.
find_program(RST2MAN NAMES rst2man rst2man.py)
if(NOT RST2MAN)
  message(FATAL_ERROR "rst2man not found: the man pages need python3-docutils (scripts/deps.sh)")
endif()
set(man ${PROJECT_BINARY_DIR}/man)
add_custom_command(OUTPUT ${man}/ckptctl.8
  COMMAND ${CMAKE_COMMAND} -E make_directory ${man}
  COMMAND ${CKPT_PYTHON} ${PROJECT_SOURCE_DIR}/man/ckptctl-man.py $<TARGET_FILE:ckptctl>
          ${PROJECT_SOURCE_DIR}/man/ckptctl.8.rst ${man}/ckptctl.8.rst ${CMAKE_CROSSCOMPILING_EMULATOR}
  COMMAND ${RST2MAN} --halt=warning ${man}/ckptctl.8.rst ${man}/ckptctl.8
  DEPENDS ckptctl ${PROJECT_SOURCE_DIR}/man/ckptctl.8.rst ${PROJECT_SOURCE_DIR}/man/ckptctl-man.py
  COMMENT "Generating man page ckptctl.8")
add_custom_command(OUTPUT ${man}/dm-ckpt.4
  COMMAND ${CMAKE_COMMAND} -E make_directory ${man}
  COMMAND ${RST2MAN} --halt=warning ${PROJECT_SOURCE_DIR}/man/dm-ckpt.4.rst ${man}/dm-ckpt.4
  DEPENDS ${PROJECT_SOURCE_DIR}/man/dm-ckpt.4.rst ${PROJECT_SOURCE_DIR}/kmod/dm-ckpt.rst
  COMMENT "Generating man page dm-ckpt.4")
# (not in the sanitizer builds, which install nothing)
if(CKPT_SANITIZE OR CKPT_TSAN)
  add_custom_target(ckpt_man DEPENDS ${man}/ckptctl.8 ${man}/dm-ckpt.4)
else()
  add_custom_target(ckpt_man ALL DEPENDS ${man}/ckptctl.8 ${man}/dm-ckpt.4)
endif()
install(FILES ${man}/ckptctl.8 DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)
install(FILES ${man}/dm-ckpt.4 DESTINATION ${CMAKE_INSTALL_MANDIR}/man4)
install(FILES completion/ckptctl DESTINATION ${CKPT_INSTALL_BASHCOMPDIR})

# The udev rule and the systemd units that assemble dm-ckpt devices at boot
# (README.md, "Assembly at boot").
file(GLOB ckpt_udev_rules ${PROJECT_SOURCE_DIR}/scripts/udev/*.rules)
file(GLOB ckpt_systemd_units ${PROJECT_SOURCE_DIR}/scripts/systemd/*.service)
if(ckpt_udev_rules)
  install(FILES ${ckpt_udev_rules} DESTINATION ${CKPT_INSTALL_UDEVRULESDIR})
endif()
# (the units run the installed ckptctl: its path is the prefix's)
foreach(unit IN LISTS ckpt_systemd_units)
  get_filename_component(name ${unit} NAME)
  file(READ ${unit} text)
  string(REPLACE "/usr/sbin/ckptctl" "${CMAKE_INSTALL_FULL_SBINDIR}/ckptctl" text "${text}")
  file(WRITE ${PROJECT_BINARY_DIR}/systemd/${name} "${text}")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${unit})
  install(FILES ${PROJECT_BINARY_DIR}/systemd/${name} DESTINATION ${CKPT_INSTALL_SYSTEMDUNITDIR})
endforeach()
