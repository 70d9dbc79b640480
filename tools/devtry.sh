export DSV32_TOOL=$PWD/build/gpu/tools/dsv32
[ -x $DSV32_TOOL ] || { cmake --preset gpu >/dev/null && cmake --build --preset gpu -j16 --target dsv32 | tail -1; }
export PYTHONPATH=$PWD/python DSV32_SCRATCH=$OUT/scratch; mkdir -p $DSV32_SCRATCH
timeout 330 python3 -m pytest -q -rs -p dsv32.pytest_plugin tests/python/test_torch_layer.py --durations=5 2>&1 | tail -60 > $OUT/pytest.log; tail -40 $OUT/pytest.log
python3 tools/bench_torch_runner.py fixtures/default.h5 --device cuda --json $OUT/bench.json 2>&1 | tee $OUT/bench.log
DSV32_DEEPSEEK_REF=$PWD/.ref/deepseek DSV32_FOREIGN_DEVICE=cuda timeout 120 python3 tests/python/test_foreign_layer.py deepseek fixtures $OUT/ds 2>&1 | grep -v "^note" | tee $OUT/deepseek.log
rm -rf $OUT/scratch $OUT/ds
