# Decides whether the CUDA kernels are built. Nothing CPU-side depends on this: with CUDA off the
# daemon, client and tests build unchanged and only the kernels target is skipped.
set(FLUXON_HAVE_CUDA OFF)
if(NOT FLUXON_CUDA STREQUAL "OFF" AND NOT FLUXON_CORE_ONLY)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # sm_90 machine code for Hopper plus compute_90 PTX so newer GPUs can JIT it.
    set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual")
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 does not know nvcc's C++20 flag
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    # System packages (yaml-cpp, protobuf, ...) export /usr/include; passed to nvcc as -isystem it
    # breaks libstdc++'s #include_next <math.h>. It is searched anyway, so never pass it.
    list(APPEND CMAKE_CUDA_IMPLICIT_INCLUDE_DIRECTORIES /usr/include)
    find_package(CUDAToolkit REQUIRED)
    set(FLUXON_HAVE_CUDA ON)
  elseif(FLUXON_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FLUXON_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "Fluxon CUDA kernels: ${FLUXON_HAVE_CUDA}")
