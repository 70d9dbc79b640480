#!/usr/bin/env bash
# The test main's binding to the GPUs CTest assigns (tests/support/test_main.cpp), without a GPU:
# a test binary run with resource-group variables must log the devices it was given (mapped
# through the caller's CUDA_VISIBLE_DEVICES), and malformed variables must stop it with code 2.
# Usage: test_gpu_binding.sh TEST_BINARY GTEST_FILTER WORKDIR
set -uo pipefail
bin=$1 filter=$2 dir=$3
mkdir -p "$dir"
log="$dir/binding.log"
fail() { echo "FAIL: $*"; exit 1; }

rm -f "$log"
env CTEST_RESOURCE_GROUP_COUNT=2 CTEST_RESOURCE_GROUP_0=gpus CTEST_RESOURCE_GROUP_0_GPUS=id:1,slots:1 \
  CTEST_RESOURCE_GROUP_1=gpus CTEST_RESOURCE_GROUP_1_GPUS=id:0,slots:2 CUDA_VISIBLE_DEVICES=5,7 \
  DSV32_GPU_BINDING_LOG="$log" "$bin" --gtest_filter="$filter" >/dev/null || fail "bound run failed"
[ "$(cat "$log")" = "gpus=7,5 $filter" ] || fail "logged '$(cat "$log")', want 'gpus=7,5 $filter'"

rm -f "$log"
env -u CUDA_VISIBLE_DEVICES CTEST_RESOURCE_GROUP_COUNT=1 CTEST_RESOURCE_GROUP_0=gpus \
  CTEST_RESOURCE_GROUP_0_GPUS=id:3,slots:1 DSV32_GPU_BINDING_LOG="$log" "$bin" --gtest_filter="$filter" >/dev/null \
  || fail "unmapped run failed"
[ "$(cat "$log")" = "gpus=3 $filter" ] || fail "logged '$(cat "$log")', want 'gpus=3 $filter'"

expect_refusal() {  # VAR=VALUE ...: the binary must exit 2 and say why on stderr
  local err
  err=$(env "$@" "$bin" --gtest_filter="$filter" 2>&1 >/dev/null)
  local rc=$?
  [ $rc -eq 2 ] || fail "exit $rc (want 2) for $*"
  [[ $err == *"test main:"* ]] || fail "no message for $*: $err"
}
expect_refusal CTEST_RESOURCE_GROUP_COUNT=x
expect_refusal CTEST_RESOURCE_GROUP_COUNT=1 CTEST_RESOURCE_GROUP_0=cpus CTEST_RESOURCE_GROUP_0_CPUS=id:0,slots:1
expect_refusal CTEST_RESOURCE_GROUP_COUNT=1 CTEST_RESOURCE_GROUP_0=gpus CTEST_RESOURCE_GROUP_0_GPUS=slots:1
expect_refusal CTEST_RESOURCE_GROUP_COUNT=1 CTEST_RESOURCE_GROUP_0=gpus CTEST_RESOURCE_GROUP_0_GPUS=id:z,slots:1
expect_refusal CTEST_RESOURCE_GROUP_COUNT=1 CTEST_RESOURCE_GROUP_0=gpus CTEST_RESOURCE_GROUP_0_GPUS=id:4,slots:1 CUDA_VISIBLE_DEVICES=0,1
echo "binding: mapped, unmapped and 5 malformed cases as expected"
