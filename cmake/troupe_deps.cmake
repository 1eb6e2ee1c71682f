# Finds troupe's dependencies (Debian 12 packages; see scripts/setup.sh) and
# exposes each as an imported target named troupe::<dep>.

find_package(Threads REQUIRED)

# LibTorch: Debian's CPU build here; on a GPU machine the installed PyTorch's
# (pass -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')).
find_package(Torch REQUIRED)
add_library(troupe_torch INTERFACE)
target_link_libraries(troupe_torch INTERFACE ${TORCH_LIBRARIES})
target_include_directories(troupe_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
separate_arguments(_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(troupe_torch INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${_torch_flags}>)
add_library(troupe::torch ALIAS troupe_torch)
# Whether this LibTorch was built with CUDA (the at::Tensor -> launcher glue needs it).
set(TROUPE_TORCH_HAS_CUDA OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(TROUPE_TORCH_HAS_CUDA ON)
endif()

# CAF 0.17 ships no CMake config: find headers and libraries directly.
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIBRARY caf_core REQUIRED)
find_library(CAF_IO_LIBRARY caf_io REQUIRED)
add_library(troupe_caf INTERFACE)
target_include_directories(troupe_caf SYSTEM INTERFACE ${CAF_INCLUDE_DIR})
target_link_libraries(troupe_caf INTERFACE ${CAF_IO_LIBRARY} ${CAF_CORE_LIBRARY} Threads::Threads)
add_library(troupe::caf ALIAS troupe_caf)

find_package(yaml-cpp REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(SQLite3 REQUIRED)
# cpp-httplib (the dashboard's HTTP server): Debian builds it with OpenSSL,
# zlib and brotli, and its pkg-config flags must match that build.
find_package(PkgConfig REQUIRED)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET GLOBAL cpp-httplib)
# Oniguruma: the regex engine of Hugging Face tokenizers (tokenizer.json Split /
# Replace patterns, NOTE [tokenizer patterns]).
pkg_check_modules(ONIGURUMA REQUIRED IMPORTED_TARGET GLOBAL oniguruma)

# OpenMP: the CPU decode's team (NOTE [decode team]) runs on the OpenMP pool
# ATen's operators use; only the files that need it get the flag.
find_package(OpenMP REQUIRED COMPONENTS C CXX)

# CUDA: compile the .cu kernels when nvcc is there (build machines have CUDA
# 13 without a GPU; kernels are tested on a GPU machine).
set(TROUPE_WITH_CUDA OFF)
if(TROUPE_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(TROUPE_WITH_CUDA ON)
  endif()
endif()
message(STATUS "troupe: CUDA kernels ${TROUPE_WITH_CUDA}; LibTorch with CUDA ${TROUPE_TORCH_HAS_CUDA}")
