// h5::scan: every object, attribute and dataset of a file read through libhdf5 and dropped, the
// pass a contained child makes before a reader parses the file in this process (h5::contain).
#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "dsv32/golden/h5.hpp"

namespace dsv32::h5 {
namespace {

constexpr int kMaxDepth = 64;               // a golden is 5 deep
constexpr double kSlab = 16.0 * (1 << 20);  // bytes of a dataset read at a time

/// Each attribute of `g` read as the readers read them (a string or an integer; other kinds are
/// left to the reader, which refuses what it cannot use). Errors are the reader's to report.
void scan_attributes(const Group& g) {
  std::vector<std::pair<std::string, H5T_class_t>> attrs;
  const auto collect = [](hid_t loc, const char* name, const H5A_info_t*, void* data) -> herr_t {
    auto* out = static_cast<std::vector<std::pair<std::string, H5T_class_t>>*>(data);
    const hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0) return 0;
    const hid_t t = H5Aget_type(a);
    out->emplace_back(name, t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS);
    if (t >= 0) H5Tclose(t);
    H5Aclose(a);
    return out->size() < 4096 ? 0 : 1;
  };
  H5Aiterate2(g.id(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &attrs);
  for (const auto& [name, cls] : attrs) try {
      if (cls == H5T_STRING) (void)g.attr_string(name);
      if (cls == H5T_INTEGER) (void)g.attr_int(name);
    } catch (const GoldenError&) {
    }
}

/// Dataset `ds`'s values, a slab of whole rows at a time, in its own native type.
void scan_values(hid_t ds, double max_bytes) {
  const hid_t ftype = H5Dget_type(ds);
  if (ftype < 0) return;
  const H5T_class_t cls = H5Tget_class(ftype);
  const hid_t native =
      cls == H5T_INTEGER || cls == H5T_FLOAT ? H5Tget_native_type(ftype, H5T_DIR_ASCEND) : -1;
  H5Tclose(ftype);
  if (native < 0) return;
  const hid_t space = H5Dget_space(ds);
  const int rank = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
  std::vector<hsize_t> dims(std::max(rank, 0));
  if (rank > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  const double size = static_cast<double>(H5Tget_size(native));
  double elements = 1, row = 1;
  for (int i = 0; i < rank; ++i) {
    elements *= static_cast<double>(dims[i]);
    if (i > 0) row *= static_cast<double>(dims[i]);
  }
  if (rank >= 0 && size > 0 && elements * size <= max_bytes && row * size <= 4.0 * kSlab) {
    if (rank == 0) {
      std::vector<unsigned char> buf(static_cast<std::size_t>(size));
      H5Dread(ds, native, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
    } else if (elements > 0) {
      // At most the dataset itself: a small one allocates only its own size.
      const hsize_t rows = std::min<hsize_t>(
          dims[0], std::max<hsize_t>(1, static_cast<hsize_t>(kSlab / (row * size))));
      std::vector<unsigned char> buf(
          static_cast<std::size_t>(static_cast<double>(rows) * row * size));
      std::vector<hsize_t> start(rank, 0), count = dims;
      for (hsize_t r0 = 0; r0 < dims[0]; r0 += rows) {
        start[0] = r0;
        count[0] = std::min(rows, dims[0] - r0);
        const hid_t mem = H5Screate_simple(rank, count.data(), nullptr);
        const bool ok = H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr,
                                            count.data(), nullptr) >= 0 &&
                        H5Dread(ds, native, mem, space, H5P_DEFAULT, buf.data()) >= 0;
        H5Sclose(mem);
        if (!ok) break;  // the reader names the failure
      }
    }
  }
  if (space >= 0) H5Sclose(space);
  H5Tclose(native);
}

void scan_group(const Group& g, int depth, double max_bytes) {
  scan_attributes(g);
  if (depth >= kMaxDepth) return;
  std::vector<std::string> names;
  try {
    names = g.names();
  } catch (const GoldenError&) {
    return;
  }
  for (const std::string& name : names) {
    const hid_t obj = H5Oopen(g.id(), name.c_str(), H5P_DEFAULT);
    if (obj < 0) continue;
    const H5I_type_t kind = H5Iget_type(obj);
    if (kind == H5I_GROUP) {
      scan_group(Group(Handle(obj, H5Oclose), "", ""), depth + 1, max_bytes);
      continue;
    }
    const Group view(Handle(obj, H5Oclose), "", "");
    if (kind != H5I_DATASET) continue;
    scan_attributes(view);
    scan_values(obj, max_bytes);
  }
}

}  // namespace

void scan(const std::string& path, double max_bytes) {
  const File f = File::open(path, max_bytes);
  scan_group(f.root(), 0, max_bytes);
}

}  // namespace dsv32::h5
