# Included by ctest (TEST_INCLUDE_FILES) after a GPU test binary's tests are discovered: gives
# each of them its CTest resource groups, so that `ctest -L gpu -j N --resource-spec-file SPEC`
# spreads them over the GPUs of SPEC (docs/GPU.md). The test's main binds it to the GPUs CTest
# assigns (tests/support/test_main.cpp).
#
# A test whose gtest name ends in `tp<N>` (N > 1) needs N whole GPUs: N groups of every slot of
# a GPU.
# It gets them only when the spec at SPEC_FILE (what `dsv32 resource-spec` writes by default)
# lists N GPUs; otherwise it gets none, runs alone on what it sees and skips itself, saying why.
# Every other test needs one slot of one GPU. Without --resource-spec-file, ctest ignores groups.
function(dsv32_assign_gpus spec_file)
  set(gpus 0)
  set(slots 1)
  if(EXISTS "${spec_file}")
    file(READ "${spec_file}" json)
    string(JSON gpus ERROR_VARIABLE err LENGTH "${json}" local 0 gpus)
    if(err)
      message(WARNING "dsv32: ${spec_file}: ${err}; multi-GPU tests get no resource groups")
      set(gpus 0)
    elseif(gpus GREATER 0)
      string(JSON slots ERROR_VARIABLE err GET "${json}" local 0 gpus 0 slots)
      if(err)
        set(slots 1)
      endif()
    endif()
  endif()
  foreach(name IN LISTS ARGN)
    if(name MATCHES "tp([0-9]+)( |$)" AND CMAKE_MATCH_1 GREATER 1)
      if(CMAKE_MATCH_1 GREATER gpus)
        continue()
      endif()
      set(groups "${CMAKE_MATCH_1},gpus:${slots}")
    else()
      set(groups "gpus:1")
    endif()
    set_tests_properties("${name}" PROPERTIES RESOURCE_GROUPS "${groups}")
  endforeach()
  dsv32_share_host(${gpus} ${slots} ${ARGN})
endfunction()

# dsv32_share_host(GPUS SLOTS NAME...): with a spec of GPUS GPUs of SLOTS slots, up to GPUS x
# SLOTS tests run at once; each gets that share of the host's cores for its OpenMP threads (the
# oracle's judging, torch's CPU work), with passive waits. Without the share each of them would
# start a thread a core, and six tests on 16 cores ran 3x slower each (docs/DECISIONS.md). A
# caller's OMP_NUM_THREADS wins; without a spec (GPUS 0) nothing changes. Tests whose names end in
# _one_gpu (ranks on one GPU) also get CUDA_MODULE_LOADING=EAGER (gpu/tp.hpp says why).
function(dsv32_share_host gpus slots)
  set(share "")
  if(gpus GREATER 0 AND NOT DEFINED ENV{OMP_NUM_THREADS})
    cmake_host_system_information(RESULT cores QUERY NUMBER_OF_LOGICAL_CORES)
    math(EXPR threads "${cores} / (${gpus} * ${slots})")
    if(threads LESS 1)
      set(threads 1)
    endif()
    set(share "OMP_NUM_THREADS=set:${threads};OMP_WAIT_POLICY=set:PASSIVE")
  endif()
  foreach(name IN LISTS ARGN)
    set(env "${share}")
    # Ranks on one GPU need every kernel loaded before they wait for each other (gpu/tp.hpp).
    if(name MATCHES "_one_gpu( |$)")
      list(APPEND env "CUDA_MODULE_LOADING=set:EAGER")
    endif()
    if(env)
      set_tests_properties("${name}" PROPERTIES ENVIRONMENT_MODIFICATION "${env}")
    endif()
  endforeach()
endfunction()
