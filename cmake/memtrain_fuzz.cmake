# libFuzzer harnesses for memtrain's file readers (tests/fuzz/, run by scripts/fuzz.sh), built when
# MEMTRAIN_FUZZ is ON. clang only: libFuzzer is part of clang's runtime.
#
# The fuzz build compiles a few dozen of the library's sources a second time, not the ~180 of
# libmemtrain.so, so a clean CI clone builds every fuzzer in a few minutes on 2 cores:
# - memtrain_fuzz_readers: the readers and what they call, with libFuzzer's coverage instrumentation,
#   AddressSanitizer and UndefinedBehaviorSanitizer. Each function in its own section, and the fuzzers
#   link with --gc-sections, so what a reader's TU defines but no harness reaches (nn::GPT loading in
#   hf_gpt2.cpp, optimizer construction in spec.cpp) is dropped with its references to the rest of the
#   library.
# - memtrain_fuzz_core: the tensor core that safetensors and IDX allocate with, and the TUs where a few
#   settings' defaults and names live among tensor code. Tensor::empty reaches the CPU backend object,
#   whose vtable names every CPU kernel, and the kernels the ops layer: the whole library. These sources
#   are built for link-time optimisation with virtual function elimination, which removes the vtable slots
#   no code calls (the kernels), so of the backend only the allocator's host memory source is linked. Calls
#   into the backend are made only from these LTO sources (the readers call Tensor's functions, never a
#   Backend), so the compiler sees every one; a slot removed in error would hold 0 and crash the fuzzer,
#   never pass silently. ASan and UBSan only: coverage of the core is not what these fuzzers look for (and
#   clang 14's coverage tables do not survive this LTO link: "Undefined temporary symbol").
#
# Build the `memtrain_fuzzers` target, never `all` (which would build the whole library as well):
#   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DMEMTRAIN_FUZZ=ON ...
#   cmake --build build-fuzz --target memtrain_fuzzers
if(NOT MEMTRAIN_FUZZ)
  return()
endif()
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "MEMTRAIN_FUZZ=ON needs clang (libFuzzer), but CMAKE_CXX_COMPILER is "
                      "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER}: configure a fresh build directory with "
                      "-DCMAKE_CXX_COMPILER=clang++ (scripts/fuzz.sh does)")
endif()

set(MEMTRAIN_FUZZ_READER_SOURCES
  src/io/safetensors.cpp src/io/atomic_file.cpp src/io/json_file.cpp
  src/train/trainer_config.cpp
  src/data/bpe_io.cpp src/data/bpe_tokenizer.cpp src/data/bpe_pretokenize.cpp src/data/bpe_train.cpp
  src/data/text_file.cpp
  src/data/token_shard.cpp
  src/data/idx.cpp
  src/nn/hf_gpt2.cpp
  src/nn/lora_config.cpp
  # the parsers of the settings TrainerConfig reads by name
  src/optim/spec_json.cpp src/amp/precision.cpp src/amp/fp8_state.cpp src/ckpt/policy.cpp src/ckpt/op_label.cpp)
set(MEMTRAIN_FUZZ_CORE_SOURCES
  src/core/tensor.cpp src/core/tensor_source.cpp src/core/storage.cpp src/core/state_arena.cpp src/core/allocator.cpp
  src/core/segment_pool.cpp src/core/size_class_cache.cpp src/core/backend_registry.cpp src/core/cuda_module_loader.cpp
  src/cpu/cpu_backend.cpp src/meta/meta_backend.cpp
  # a setting's default or name, in a TU that is mostly tensor code (TrainerConfig, GPTConfig::validate)
  src/optim/spec.cpp src/optim/adamw.cpp src/optim/optimizer.cpp src/optim/galore_projector.cpp
  src/amp/loss_scaler.cpp src/ckpt/checkpoint.cpp src/nn/gpt_config.cpp)
list(TRANSFORM MEMTRAIN_FUZZ_READER_SOURCES PREPEND ${PROJECT_SOURCE_DIR}/)
list(TRANSFORM MEMTRAIN_FUZZ_CORE_SOURCES PREPEND ${PROJECT_SOURCE_DIR}/)

# -O1 -g: quick to build, and sanitizer reports keep line numbers. Every sanitizer report aborts, so
# libFuzzer records each one as a crash.
set(MEMTRAIN_FUZZ_FLAGS -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=all)
set(MEMTRAIN_FUZZ_VFE -flto -fwhole-program-vtables -fvirtual-function-elimination)

add_library(memtrain_fuzz_core STATIC ${MEMTRAIN_FUZZ_CORE_SOURCES})
target_compile_options(memtrain_fuzz_core PRIVATE ${MEMTRAIN_FUZZ_FLAGS} ${MEMTRAIN_FUZZ_VFE} -fvisibility=hidden
                       -fsanitize=address,undefined)
target_include_directories(memtrain_fuzz_core PUBLIC ${PROJECT_SOURCE_DIR}/include
                           PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(memtrain_fuzz_core PUBLIC fmt::fmt Threads::Threads ${CMAKE_DL_LIBS})

add_library(memtrain_fuzz_readers STATIC ${MEMTRAIN_FUZZ_READER_SOURCES})
target_compile_options(memtrain_fuzz_readers PUBLIC ${MEMTRAIN_FUZZ_FLAGS}
                       PRIVATE -ffunction-sections -fdata-sections -fsanitize=fuzzer-no-link,address,undefined)
target_include_directories(memtrain_fuzz_readers PUBLIC ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(memtrain_fuzz_readers PUBLIC memtrain_fuzz_core nlohmann_json::nlohmann_json ZLIB::ZLIB)
target_link_options(memtrain_fuzz_readers INTERFACE ${MEMTRAIN_FUZZ_VFE} -fuse-ld=lld -Wl,--gc-sections)

add_custom_target(memtrain_fuzzers)

# One fuzzer per reader: tests/fuzz/fuzz_<name>.cpp -> fuzz_<name>, seeds in tests/fuzz/corpus/<name>/
# (scripts/fuzz.sh lists the same names).
set(MEMTRAIN_FUZZ_TARGETS safetensors trainer_config bpe_gpt2 bpe_load token_shard idx idx_gz hf_config)
foreach(name IN LISTS MEMTRAIN_FUZZ_TARGETS)
  add_executable(fuzz_${name} ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_${name}.cpp)
  target_compile_options(fuzz_${name} PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_${name} PRIVATE memtrain_fuzz_readers)
  target_link_options(fuzz_${name} PRIVATE -fsanitize=fuzzer,address,undefined)
  add_dependencies(memtrain_fuzzers fuzz_${name})
endforeach()

# Writes the seeds of tests/fuzz/corpus/ with memtrain's own writers; built and run by hand (its header says
# how), not part of memtrain_fuzzers. save_safetensors copies each tensor to contiguous CPU bytes through
# the ops layer (detach, to, contiguous): those TUs too, built like memtrain_fuzz_core.
set(MEMTRAIN_FUZZ_WRITER_SOURCES src/ops/views.cpp src/autograd/tensor_autograd.cpp src/autograd/node.cpp
                                 src/autograd/grad_mode.cpp src/core/convert.cpp src/cpu/strided.cpp)
list(TRANSFORM MEMTRAIN_FUZZ_WRITER_SOURCES PREPEND ${PROJECT_SOURCE_DIR}/)
add_library(memtrain_fuzz_writers STATIC EXCLUDE_FROM_ALL ${MEMTRAIN_FUZZ_WRITER_SOURCES})
target_compile_options(memtrain_fuzz_writers PRIVATE ${MEMTRAIN_FUZZ_FLAGS} ${MEMTRAIN_FUZZ_VFE} -fvisibility=hidden
                       -fsanitize=address,undefined)
target_include_directories(memtrain_fuzz_writers PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(memtrain_fuzz_writers PUBLIC memtrain_fuzz_core)
add_executable(fuzz_make_corpus EXCLUDE_FROM_ALL ${PROJECT_SOURCE_DIR}/tests/fuzz/make_corpus.cpp)
target_compile_options(fuzz_make_corpus PRIVATE -fsanitize=address,undefined)
target_link_libraries(fuzz_make_corpus PRIVATE memtrain_fuzz_readers memtrain_fuzz_writers)
target_link_options(fuzz_make_corpus PRIVATE -fsanitize=fuzzer-no-link,address,undefined)
