# One NCCL library per process (docs/python.md, "torch.distributed"). A CUDA build of torch loads the
# libnccl.so.2 of its nvidia-nccl wheel (site-packages/nvidia/nccl/{include,lib}); a process group's
# ncclComm_t is an object of that library, so mok's Layer, which calls NCCL on it (window registration,
# device communicators) and compiles NCCL's device API into its kernels, must be built against the same
# headers and link the same library. With MOK_TORCH and MOK_TORCH_NCCL on, this finds the libnccl.so.2
# that `import torch` loads (read from /proc/self/maps after the import) and, when its folder has NCCL's
# headers beside it (the wheel's layout: lib/ and include/), sets MOK_NCCL_INCLUDE_DIR and
# MOK_NCCL_LIBRARY for the whole build (megakernel/CMakeLists.txt's find_path and find_library take a
# variable that is already set: policy CMP0125). Otherwise the usual search runs (CUDA's NCCL,
# NCCL_ROOT) and mok checks at run time that the versions agree (mok.distributed).
#
# At run time mok._C finds libnccl.so.2 by its soname, which torch has loaded already: the library is
# torch's whatever was linked; what this settles is that the headers (struct layouts, the device API)
# are that library's.
option(MOK_TORCH_NCCL "With MOK_TORCH: build against the NCCL that torch loads (its nvidia-nccl wheel)" ON)

function(mok_use_torch_nccl)
  find_package(Python3 COMPONENTS Interpreter)
  if(NOT Python3_Interpreter_FOUND)
    return()
  endif()
  # The libnccl that `import torch` mapped into the process (torch's libtorch_cuda.so links it).
  string(CONCAT probe "import os, torch; "
                "print(sorted({os.path.realpath(l.split()[-1]) for l in open('/proc/self/maps') "
                "if '/libnccl.so' in l})[0])")
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "${probe}"
    OUTPUT_VARIABLE mok_torch_nccl_library OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE result ERROR_QUIET)
  if(NOT result EQUAL 0 OR NOT EXISTS "${mok_torch_nccl_library}")
    message(STATUS "mok: torch (${Python3_EXECUTABLE}) loads no libnccl: NCCL is searched as usual")
    return()
  endif()
  get_filename_component(lib_dir "${mok_torch_nccl_library}" DIRECTORY)
  get_filename_component(include_dir "${lib_dir}/../include" ABSOLUTE)
  if(NOT EXISTS "${include_dir}/nccl.h" OR NOT EXISTS "${include_dir}/nccl_device.h")
    message(WARNING "mok: torch loads ${mok_torch_nccl_library}, but ${include_dir} has no nccl.h and "
                    "nccl_device.h: NCCL is searched as usual, and a process group's communicator may cross two "
                    "NCCL versions (mok checks the versions when a group is used)")
    return()
  endif()
  set(MOK_NCCL_INCLUDE_DIR "${include_dir}" PARENT_SCOPE)
  set(MOK_NCCL_LIBRARY "${mok_torch_nccl_library}" PARENT_SCOPE)
  message(STATUS "mok: NCCL of torch: ${mok_torch_nccl_library}")
endfunction()

if(MOK_TORCH_NCCL)
  mok_use_torch_nccl()
endif()
