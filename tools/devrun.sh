export DSV32_TOOL=$PWD/build/gpu/tools/dsv32
[ -x $DSV32_TOOL ] || { cmake --preset gpu >/dev/null && cmake --build --preset gpu -j16 --target dsv32 | tail -1; }
export PYTHONPATH=$PWD/python DSV32_SCRATCH=$OUT/scratch; mkdir -p $DSV32_SCRATCH
timeout 400 python3 tests/python/run_pytest.py tests/python/test_torch_layer.py -v 2>&1 > $OUT/pytest.log; echo "pytest rc $?"; grep -c PASSED $OUT/pytest.log; grep "FAILED\|SKIPPED\|passed\|failed" $OUT/pytest.log | tail -8
python3 python/examples/torch_layer.py fixtures/default.h5 --mode narrow --device cuda --bug fresh-output | tail -4
rm -rf $OUT/scratch
