#include "dsv32/golden/h5.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <type_traits>

#include "dsv32/golden/files.hpp"
#include "dsv32/oracle/numerics.hpp"

namespace dsv32::h5 {
namespace {

static_assert(std::is_same_v<hid_t, std::int64_t>, "HDF5 >= 1.10 uses 64-bit identifiers");

/// HDF5 prints its own error stack by default; we report through exceptions instead.
struct Silence {
  Silence() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }
};
const Silence kSilence;

hid_t storage_type(DType dt) {
  switch (dt) {
    case DType::bfloat16:
      return H5T_STD_U16LE;
    case DType::float8_e4m3fn:
      return H5T_STD_U8LE;
    case DType::int32:
      return H5T_STD_I32LE;
    case DType::float32:
      return H5T_IEEE_F32LE;
    case DType::float64:
      return H5T_IEEE_F64LE;
  }
  return H5T_IEEE_F64LE;
}

Handle plist(hid_t cls) {
  return Handle(H5Pcreate(cls), H5Pclose);
}

/// t's values as dtype `want` where every one of them is exactly a `want` value (bf16 values
/// as float32 or float64, float64 values that are bf16 as bfloat16, integral values as int32,
/// ...); else refuses, naming the dataset and the first value that is not. NaN converts to a
/// floating type.
void convert_exactly(Tensor& t, DType want, const std::string& where) {
  const auto exact = [want](double v) {
    if (std::isnan(v)) return want != DType::int32;
    switch (want) {
      case DType::float64:
        return true;
      case DType::float32:
        return static_cast<double>(static_cast<float>(v)) == v;
      case DType::bfloat16:
        return round_bf16(v) == v;
      case DType::float8_e4m3fn:
        return std::fabs(v) <= 448.0 && round_e4m3(v) == v;
      case DType::int32:
        return v == std::floor(v) && v >= INT32_MIN && v <= INT32_MAX;
    }
    return false;
  };
  for (std::size_t i = 0; i < t.data.size(); ++i)
    if (!exact(t.data[i]))
      throw GoldenError(where + ": dtype " + std::string(to_string(t.dtype)) + ", expected " +
                        std::string(to_string(want)) + ", and the value at " +
                        t.index_string(static_cast<std::int64_t>(i)) + " is not exactly a " +
                        std::string(to_string(want)) + " value");
  t.dtype = want;
}

/// The first filter of dataset `ds`'s pipeline that this libhdf5 cannot decode, as "lzf (id
/// 32000)", or "": its read would fail as if the file were corrupt (h5py's `compression='lzf'`
/// needs a plugin that libhdf5 does not ship).
std::string undecodable_filter(hid_t ds) {
  Handle dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (!dcpl.valid()) return "";
  const int n = H5Pget_nfilters(dcpl.get());
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, config = 0;
    std::size_t cd_count = 0;
    char name[256] = {};
    const H5Z_filter_t id = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &cd_count,
                                           nullptr, sizeof name, name, &config);
    if (id < 0) return "number " + std::to_string(i) + " (unreadable)";
    unsigned info = 0;
    if (H5Zfilter_avail(id) > 0 && H5Zget_filter_info(id, &info) >= 0 &&
        (info & H5Z_FILTER_CONFIG_DECODE_ENABLED) != 0)
      continue;
    return std::string(name[0] ? name : "unnamed") + " (id " + std::to_string(id) + ")";
  }
  return "";
}

}  // namespace

void Budget::take(double bytes, double transient, const std::string& where) {
  if (!(used_ + bytes + transient <= max_)) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  ": %.3g GiB more would pass the reader's limit of %.3g GiB (%.3g GiB held; "
                  "raise it with --max-gib)",
                  (bytes + transient) / gib, max_ / gib, used_ / gib);
    throw GoldenError(where + buf);
  }
  used_ += bytes;
}

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    if (id_ >= 0 && close_) close_(id_);
    id_ = o.id_;
    close_ = o.close_;
    o.id_ = -1;
  }
  return *this;
}

Handle::~Handle() {
  if (id_ >= 0 && close_) close_(id_);
}

std::string Group::child_path(const std::string& name) const {
  if (name.empty()) return path_;
  return path_ == "/" ? "/" + name : path_ + "/" + name;
}

std::string Group::where(const std::string& name) const {
  return file_ + ":" + child_path(name);
}

bool Group::has(const std::string& name) const {
  return H5Lexists(h_.get(), name.c_str(), H5P_DEFAULT) > 0;
}

Group Group::child(const std::string& name, bool create) const {
  hid_t g = -1;
  if (create && !has(name)) {
    Handle gcpl = plist(H5P_GROUP_CREATE);
    H5Pset_obj_track_times(gcpl.get(), false);
    g = H5Gcreate2(h_.get(), name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT);
  } else {
    if (!has(name)) throw GoldenError(where(name) + ": missing group");
    g = H5Gopen2(h_.get(), name.c_str(), H5P_DEFAULT);
  }
  if (g < 0) throw GoldenError(where(name) + ": cannot open group");
  return Group(Handle(g, H5Gclose), file_, child_path(name), budget_);
}

namespace {
constexpr std::int64_t kChunkElements = std::int64_t{1} << 20;
}  // namespace

void Group::write(const Tensor& t) const {
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Handle dcpl = plist(H5P_DATASET_CREATE);
  H5Pset_obj_track_times(dcpl.get(), false);
  if (t.numel() >= 1024) {  // chunked, byte-shuffled and deflated: h5py reads it natively
    // One chunk, or, past kChunkElements, chunks of whole rows of about that many elements: a
    // dataset of a DSv3.2-size golden (a 117M-value weight, a 131072-position prefix) is
    // deflated and read a chunk at a time, not through buffers of its whole size.
    std::vector<hsize_t> chunk = dims;
    if (t.numel() > kChunkElements && !dims.empty()) {
      const hsize_t row = static_cast<hsize_t>(t.numel()) / std::max<hsize_t>(dims[0], 1);
      chunk[0] = std::max<hsize_t>(1, kChunkElements / std::max<hsize_t>(row, 1));
    }
    H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    H5Pset_shuffle(dcpl.get());
    // Level 4; level 1 for the chunked ones (random weights and codes: as small, 3x faster).
    H5Pset_deflate(dcpl.get(), chunk == dims ? 4 : 1);
  }
  const hid_t type = storage_type(t.dtype);
  Handle ds(
      H5Dcreate2(h_.get(), t.name.c_str(), type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
      H5Dclose);
  if (!ds.valid()) throw GoldenError(where(t.name) + ": cannot create dataset");
  herr_t rc = 0;
  const std::size_t n = t.data.size();
  switch (t.dtype) {
    case DType::bfloat16: {
      std::vector<std::uint16_t> b(n);
      for (std::size_t i = 0; i < n; ++i) b[i] = bf16_bits(static_cast<float>(t.data[i]));
      rc = H5Dwrite(ds.get(), H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, b.data());
      break;
    }
    case DType::float8_e4m3fn: {
      std::vector<std::uint8_t> b(n);
      for (std::size_t i = 0; i < n; ++i) b[i] = e4m3_bits(t.data[i]);
      rc = H5Dwrite(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, b.data());
      break;
    }
    case DType::int32: {
      std::vector<std::int32_t> b(n);
      for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::int32_t>(t.data[i]);
      rc = H5Dwrite(ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, b.data());
      break;
    }
    case DType::float32: {
      std::vector<float> b(n);
      for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<float>(t.data[i]);
      rc = H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, b.data());
      break;
    }
    case DType::float64:
      rc = H5Dwrite(ds.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data.data());
      break;
  }
  if (rc < 0) throw GoldenError(where(t.name) + ": write failed");
  Group self(Handle(H5Oopen(h_.get(), t.name.c_str(), H5P_DEFAULT), H5Oclose), file_,
             child_path(t.name));
  self.set_attr("dtype", std::string(to_string(t.dtype)));
}

Tensor Group::read(const std::string& name, DType want,
                   const std::optional<std::vector<std::int64_t>>& shape,
                   std::int64_t max_elements) const {
  return read_to(name, want, shape, max_elements, nullptr);
}

Tensor Group::read_into(const std::string& name, DType want, const std::vector<std::int64_t>& shape,
                        const std::function<double*(std::size_t)>& storage) const {
  return read_to(name, want, shape, -1, storage);
}

Tensor Group::read_to(const std::string& name, DType want,
                      const std::optional<std::vector<std::int64_t>>& shape,
                      std::int64_t max_elements,
                      const std::function<double*(std::size_t)>& storage) const {
  if (!has(name)) throw GoldenError(where(name) + ": missing dataset");
  Handle ds(H5Dopen2(h_.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) throw GoldenError(where(name) + ": not a dataset");
  Group obj(Handle(H5Oopen(h_.get(), name.c_str(), H5P_DEFAULT), H5Oclose), file_,
            child_path(name));
  DType dt;
  try {
    dt = parse_dtype(obj.attr_string("dtype"));
  } catch (const std::invalid_argument& e) {
    throw GoldenError(where(name) + ": " + e.what());
  }
  Handle space(H5Dget_space(ds.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw GoldenError(where(name) + ": unreadable dataspace");
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  double elements = 1;
  std::string declared;
  for (const hsize_t d : dims) {
    elements *= static_cast<double>(d);
    declared += (declared.empty() ? "" : ", ") + std::to_string(d);
  }
  if (elements > static_cast<double>(INT64_MAX / 16) ||
      (max_elements >= 0 && elements > static_cast<double>(max_elements)))
    throw GoldenError(where(name) + ": shape (" + declared + ") has more elements than " +
                      (max_elements >= 0
                           ? "the " + std::to_string(max_elements) + " the reader takes here"
                           : std::string("can be read")));
  Tensor t;
  t.name = name;
  t.dtype = dt;
  t.shape.assign(dims.begin(), dims.end());
  if (shape && t.shape != *shape) {
    Tensor want_shape;
    want_shape.shape = *shape;
    throw ShapeError(where(name) + ": shape " + t.shape_string() + ", expected " +
                     want_shape.shape_string());
  }
  // The stored type must hold the dtype: bfloat16 and e4m3 as their 16- and 8-bit codes;
  // int32 as any integer type, float32 and float64 as any float type (each value converted
  // exactly, or refused: numpy's defaults are int64 and float64).
  Handle ftype(H5Dget_type(ds.get()), H5Tclose);
  const H5T_class_t cls = H5Tget_class(ftype.get());
  const bool stored_ok = dt == DType::int32 ? cls == H5T_INTEGER
                         : dt == DType::float32 || dt == DType::float64
                             ? cls == H5T_FLOAT
                             : H5Tequal(ftype.get(), storage_type(dt)) > 0;
  if (!stored_ok)
    throw GoldenError(where(name) + ": stored type does not match dtype " +
                      std::string(to_string(dt)));
  if (const std::string filter = undecodable_filter(ds.get()); !filter.empty())
    throw GoldenError(where(name) + ": uses the HDF5 filter " + filter +
                      ", which this libhdf5 cannot decode: write it uncompressed or with gzip");
  if (budget_) budget_->take(8.0 * elements, 8.0 * elements, where(name));
  const std::size_t n = static_cast<std::size_t>(t.numel());
  // A value needing conversion to `want` goes through the tensor, then into the storage.
  double* const into = storage ? storage(n) : nullptr;
  const bool direct = into && dt == want;
  if (!direct) t.data.resize(n);
  double* const out = direct ? into : t.data.data();
  herr_t rc = 0;
  switch (dt) {
    case DType::bfloat16: {
      std::vector<std::uint16_t> b(n);
      rc = H5Dread(ds.get(), H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, b.data());
      for (std::size_t i = 0; i < n; ++i) out[i] = bf16_value(b[i]);
      break;
    }
    case DType::float8_e4m3fn: {
      std::vector<std::uint8_t> b(n);
      rc = H5Dread(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, b.data());
      for (std::size_t i = 0; i < n; ++i) out[i] = e4m3_value(b[i]);
      break;
    }
    case DType::int32: {
      std::vector<std::int64_t> b(n);
      rc = H5Dread(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, b.data());
      for (std::size_t i = 0; i < n && rc >= 0; ++i) {
        if (b[i] < INT32_MIN || b[i] > INT32_MAX)
          throw GoldenError(where(name) + ": int32 value " + std::to_string(b[i]) +
                            " out of range at " + t.index_string(static_cast<std::int64_t>(i)));
        out[i] = static_cast<double>(b[i]);
      }
      break;
    }
    case DType::float32: {
      rc = H5Dread(ds.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out);
      for (std::size_t i = 0; i < n && rc >= 0; ++i)
        if (!std::isnan(out[i]) && static_cast<double>(static_cast<float>(out[i])) != out[i])
          throw GoldenError(where(name) + ": dtype float32, but the value at " +
                            t.index_string(static_cast<std::int64_t>(i)) + " is not a float32");
      break;
    }
    case DType::float64:
      rc = H5Dread(ds.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out);
      break;
  }
  if (rc < 0) throw GoldenError(where(name) + ": read failed (truncated or corrupt file?)");
  if (dt != want) convert_exactly(t, want, where(name));
  if (into && !direct) {
    std::copy(t.data.begin(), t.data.end(), into);
    t.data.clear();
    t.data.shrink_to_fit();
  }
  return t;
}

std::vector<std::string> Group::names() const {
  H5G_info_t info{};
  if (H5Gget_info(h_.get(), &info) < 0) throw GoldenError(where() + ": unreadable group");
  std::vector<std::string> out;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len =
        H5Lget_name_by_idx(h_.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) throw GoldenError(where() + ": unreadable member " + std::to_string(i));
    std::string name(static_cast<std::size_t>(len), '\0');
    H5Lget_name_by_idx(h_.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size() + 1,
                       H5P_DEFAULT);
    out.push_back(std::move(name));
  }
  return out;
}

DType Group::dtype(const std::string& name) const {
  if (!has(name)) throw GoldenError(where(name) + ": missing dataset");
  const Group obj(Handle(H5Oopen(h_.get(), name.c_str(), H5P_DEFAULT), H5Oclose), file_,
                  child_path(name));
  try {
    return parse_dtype(obj.attr_string("dtype"));
  } catch (const std::invalid_argument& e) {
    throw GoldenError(where(name) + ": " + e.what());
  }
}

File File::create(const std::string& path) {
  // Built in memory (the core driver, no backing store) and written out whole by commit():
  // HDF5 never writes to the disk, so a full disk or a size limit is our own checked write's
  // error, and no half-written file is left for HDF5's exit-time cleanup to flush again.
  Handle fcpl = plist(H5P_FILE_CREATE);
  Handle fapl = plist(H5P_FILE_ACCESS);
  if (H5Pset_fapl_core(fapl.get(), std::size_t{16} << 20, false) < 0)
    throw files::WriteError(path + ": cannot set up the in-memory HDF5 file");
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get());
  if (f < 0) throw files::WriteError(path + ": cannot create the in-memory HDF5 file");
  return File(Handle(f, H5Fclose), path, true);
}

File File::open(const std::string& path, double max_bytes) {
  if (const std::string why = files::not_regular_file_reason(path); !why.empty())
    throw GoldenError(path + ": " + why);
  Handle fapl = plist(H5P_FILE_ACCESS);
  H5Pset_file_locking(fapl.get(), false, true);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (f < 0) throw GoldenError(path + ": not a readable HDF5 file (truncated or corrupt?)");
  return File(Handle(f, H5Fclose), path, false, std::make_shared<Budget>(max_bytes));
}

Group File::root() const {
  hid_t g = H5Gopen2(h_.get(), "/", H5P_DEFAULT);
  if (g < 0) throw GoldenError(path_ + ": cannot open root group");
  return Group(Handle(g, H5Gclose), path_, "/", budget_);
}

void File::commit(const std::function<void(const std::string&)>& verify) {
  if (!writing_) return;
  files::write_atomically(path_, release_image(), {}, verify);
}

std::string File::release_image() {
  std::string bytes = image();
  h_ = Handle();
  writing_ = false;
  return bytes;
}

std::string File::image() const {
  if (H5Fflush(h_.get(), H5F_SCOPE_GLOBAL) < 0)
    throw files::WriteError(path_ + ": cannot flush the in-memory HDF5 file");
  const ssize_t size = H5Fget_file_image(h_.get(), nullptr, 0);
  if (size < 0) throw files::WriteError(path_ + ": cannot take the in-memory HDF5 image");
  std::string image(static_cast<std::size_t>(size), '\0');
  if (H5Fget_file_image(h_.get(), image.data(), image.size()) != size)
    throw files::WriteError(path_ + ": cannot take the in-memory HDF5 image");
  return image;
}

}  // namespace dsv32::h5
