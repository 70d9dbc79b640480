// Writes the tensors that golden_h5py_test.py reads back with h5py: non-square, non-symmetric,
// one per stored dtype, values given by a formula both sides know.
#include <cstdio>

#include "dsv32/golden/h5.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.h5\n", argv[0]);
    return 2;
  }
  using dsv32::DType;
  using dsv32::Tensor;
  dsv32::h5::File f = dsv32::h5::File::create(argv[1]);
  const dsv32::h5::Group g = f.root();
  // v[i, j, k] = i * 100 + j * 10 + k - 7 + 0.5: exact in bf16 for these sizes? use / 8 to fit.
  const auto make = [](const char* name, std::vector<std::int64_t> shape, DType dt, double scale) {
    Tensor t{name, shape, {}, dt};
    for (std::int64_t n = 0; n < t.numel(); ++n)
      t.data.push_back(scale * (static_cast<double>(n % 37) - 11.0));
    return t;
  };
  g.write(make("bf16_3x5", {3, 5}, DType::bfloat16, 0.125));
  g.write(make("f32_2x3x4", {2, 3, 4}, DType::float32, 0.3));
  g.write(make("f64_4x3", {4, 3}, DType::float64, 0.1));
  g.write(make("i32_5x2", {5, 2}, DType::int32, 1.0));
  g.write(make("e4m3_2x6", {2, 6}, DType::float8_e4m3fn, 0.5));
  g.set_attr("note", std::string("roundtrip"));
  f.commit();
  return 0;
}
