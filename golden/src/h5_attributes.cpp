// A group's attributes (dsv32/golden/h5.hpp): scalar strings and integers, written as h5py
// reads them and read back strictly (one value, the right class, a bounded length).
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "dsv32/golden/h5.hpp"

namespace dsv32::h5 {
namespace {

/// The longest string attribute read (a config JSON is about 1 KB).
constexpr std::size_t kMaxAttributeBytes = std::size_t{1} << 20;

}  // namespace

void Group::require_one_value(const Handle& attr, const std::string& name) const {
  if (!attr.valid()) throw GoldenError(where() + ": cannot open attribute " + name);
  Handle space(H5Aget_space(attr.get()), H5Sclose);
  if (!space.valid() || H5Sget_simple_extent_npoints(space.get()) != 1)
    throw GoldenError(where() + ": attribute " + name + " must hold one value");
}

bool Group::has_attr(const std::string& name) const {
  return H5Aexists(h_.get(), name.c_str()) > 0;
}

void Group::set_attr(const std::string& name, const std::string& value) const {
  // Variable-length UTF-8: h5py returns it as str.
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle a(H5Acreate2(h_.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
           H5Aclose);
  const char* p = value.c_str();
  if (!a.valid() || H5Awrite(a.get(), type.get(), &p) < 0)
    throw GoldenError(where() + ": cannot write attribute " + name);
}

void Group::set_attr(const std::string& name, std::int64_t value) const {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle a(H5Acreate2(h_.get(), name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
           H5Aclose);
  if (!a.valid() || H5Awrite(a.get(), H5T_NATIVE_INT64, &value) < 0)
    throw GoldenError(where() + ": cannot write attribute " + name);
}

std::string Group::attr_string(const std::string& name) const {
  if (H5Aexists(h_.get(), name.c_str()) <= 0)
    throw GoldenError(where() + ": missing attribute " + name);
  Handle a(H5Aopen(h_.get(), name.c_str(), H5P_DEFAULT), H5Aclose);
  require_one_value(a, name);
  Handle type(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING)
    throw GoldenError(where() + ": attribute " + name + " is not a string");
  if (H5Tis_variable_str(type.get()) > 0) {
    Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(),
                H5Tget_cset(type.get()) == H5T_CSET_UTF8 ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
    char* p = nullptr;
    if (H5Aread(a.get(), mem.get(), &p) < 0 || !p)
      throw GoldenError(where() + ": cannot read attribute " + name);
    std::string s(p);
    H5free_memory(p);
    return s;
  }
  const std::size_t size = H5Tget_size(type.get());
  if (size == 0 || size > kMaxAttributeBytes)
    throw GoldenError(where() + ": attribute " + name + " is a string of " + std::to_string(size) +
                      " bytes (at most " + std::to_string(kMaxAttributeBytes) + ")");
  std::string s(size, '\0');
  if (H5Aread(a.get(), type.get(), s.data()) < 0)
    throw GoldenError(where() + ": cannot read attribute " + name);
  s.resize(s.find('\0') == std::string::npos ? s.size() : s.find('\0'));
  return s;
}

std::int64_t Group::attr_int(const std::string& name) const {
  if (H5Aexists(h_.get(), name.c_str()) <= 0)
    throw GoldenError(where() + ": missing attribute " + name);
  Handle a(H5Aopen(h_.get(), name.c_str(), H5P_DEFAULT), H5Aclose);
  require_one_value(a, name);
  Handle type(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER)
    throw GoldenError(where() + ": attribute " + name + " is not an integer");
  std::int64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0)
    throw GoldenError(where() + ": cannot read attribute " + name);
  return v;
}

}  // namespace dsv32::h5
