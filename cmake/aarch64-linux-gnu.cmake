# Cross-compiling for AArch64 Linux with Debian's cross toolchain (crossbuild-essential-arm64).
# scripts/arm64.sh configures build-arm64 with this file. Libraries are found in the arm64
# multiarch directories (/usr/lib/aarch64-linux-gnu: libgtest-dev:arm64) and in MOE_ARM64_DEPS
# (default /opt/moe-arm64: arm64 packages that do not install side by side with their amd64
# twins, unpacked there by scripts/install_deps.sh: libyaml-cpp-dev). Header-only packages
# (nlohmann-json3-dev, libcli11-dev) are architecture-independent and come from /usr/share.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
if(NOT DEFINED MOE_ARM64_DEPS)
  set(MOE_ARM64_DEPS "$ENV{MOE_ARM64_DEPS}")
  if(NOT MOE_ARM64_DEPS)
    set(MOE_ARM64_DEPS /opt/moe-arm64)
  endif()
endif()
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES MOE_ARM64_DEPS)
# Programs run on the build machine; libraries, headers and packages of the target only from the
# roots below (the host's amd64 copies are never picked).
set(CMAKE_FIND_ROOT_PATH ${MOE_ARM64_DEPS} /usr/aarch64-linux-gnu /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# Test binaries run under user-mode emulation (qemu-user): ctest in build-arm64, gtest discovery.
find_program(MOE_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(MOE_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${MOE_QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
endif()
