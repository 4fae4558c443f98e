# Cross-build of the userspace library, tools and unit tests for aarch64 with
# Debian's cross toolchain (gcc/g++-aarch64-linux-gnu) and the arm64 -dev
# packages installed through Debian multiarch (scripts/deps.sh):
#   cmake -S . -B build-aarch64 --toolchain cmake/aarch64-linux-gnu.cmake
# The test programs run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR), so
# gtest_discover_tests and ctest work unchanged on an x86-64 host
# (`make check-aarch64`). The kernel module is not built for aarch64.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Multiarch: the arm64 libraries live in /usr/lib/aarch64-linux-gnu beside
# the host's, with their CMake and pkg-config files; headers are shared.
# Programs (pkg-config, python) are the host's.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# qemu-aarch64 from qemu-user, with the loader and libc of multiarch
# (libc6:arm64) at their usual paths (-L /). Not -L /usr/aarch64-linux-gnu:
# that takes the loader from the cross toolchain's libc, while the loader
# then finds libc.so.6 through /etc/ld.so.cache in multiarch's libc6:arm64,
# another build of glibc; the mismatched pair spins forever in the first
# pthread_create (every test that starts the engine's threads hung).
find_program(CKPT_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static REQUIRED)
if(NOT EXISTS /lib/ld-linux-aarch64.so.1)
  message(FATAL_ERROR "/lib/ld-linux-aarch64.so.1 missing: install libc6:arm64 (scripts/deps.sh)")
endif()
set(CMAKE_CROSSCOMPILING_EMULATOR ${CKPT_QEMU_AARCH64} -L /)
