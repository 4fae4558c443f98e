# CKPT_CORE_SOURCES: libckpt/core/sources.mk's list (which kmod/Kbuild
# includes), as absolute paths.
set(ckpt_core_dir ${PROJECT_SOURCE_DIR}/libckpt/core)
file(STRINGS ${ckpt_core_dir}/sources.mk ckpt_core_line REGEX "^CKPT_CORE_SOURCES :=")
string(REGEX REPLACE "^CKPT_CORE_SOURCES :=[ \t]*" "" ckpt_core_line "${ckpt_core_line}")
string(REGEX REPLACE "[ \t]+" ";" ckpt_core_names "${ckpt_core_line}")
if(NOT ckpt_core_names)
  message(FATAL_ERROR "no CKPT_CORE_SOURCES in ${ckpt_core_dir}/sources.mk")
endif()
list(TRANSFORM ckpt_core_names PREPEND ${ckpt_core_dir}/ OUTPUT_VARIABLE CKPT_CORE_SOURCES)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${ckpt_core_dir}/sources.mk)
