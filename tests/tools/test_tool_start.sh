#!/bin/sh
# The tool starts without loading cuBLAS (gpu/src/stack/blas_api.hpp): every command, and every
# golden the Python package reads (`dsv32 validate`), would pay libcublasLt's start-up work.
# Usage: test_tool_start.sh DSV32
set -u
tool=$1
loaded=$(LD_DEBUG=files "$tool" --version 2>&1 >/dev/null) || { echo "$tool --version failed"; exit 1; }
# The check must be able to see: the loader names the libraries it maps (cudart is linked).
echo "$loaded" | grep -q 'file=libcudart' || { echo "LD_DEBUG named no CUDA library: cannot check"; exit 1; }
if echo "$loaded" | grep -q 'file=libcublas'; then
  echo "dsv32 --version loads cuBLAS at start:"
  echo "$loaded" | grep 'file=libcublas'
  exit 1
fi
echo "dsv32 --version maps no cuBLAS library"
