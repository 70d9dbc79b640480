// Thin RAII over the HDF5 C API: row-major datasets with a logical `dtype` attribute,
// no object timestamps, errors as GoldenError naming the file and object.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsv32/oracle/tensor.hpp"

namespace dsv32::h5 {

/// Any failure reading or writing a golden file; the message names the file and the object.
struct GoldenError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// An owned HDF5 identifier (file, group, dataset, ...), closed with its matching close call.
class Handle {
 public:
  using Closer = int (*)(std::int64_t);
  Handle() = default;
  Handle(std::int64_t id, Closer close) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle();
  std::int64_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  std::int64_t id_ = -1;
  Closer close_ = nullptr;
};

/// A group (or a file's root group) with the file's name for messages.
class Group {
 public:
  Group(Handle h, std::string file, std::string path)
      : h_(std::move(h)), file_(std::move(file)), path_(std::move(path)) {}
  /// Opens child group `name`, creating it when `create` is true.
  Group child(const std::string& name, bool create) const;
  bool has(const std::string& name) const;
  /// The names of the group's members (datasets and groups), in name order.
  std::vector<std::string> names() const;

  /// Writes a tensor as a dataset of its dtype's storage type (bf16 -> uint16 bits,
  /// e4m3 -> uint8 codes, int32, float32, float64) with attribute dtype.
  void write(const Tensor& t) const;
  /// Reads dataset `name` as dtype `want`: a dataset of another logical dtype is converted where
  /// every value is exactly a `want` value (bfloat16 read as float32, ...). Refuses a missing
  /// dataset, an inexact conversion and, when `shape` is given, any other shape. Messages name
  /// the dataset.
  Tensor read(const std::string& name, DType want,
              const std::optional<std::vector<std::int64_t>>& shape = std::nullopt) const;
  /// The logical dtype (attribute `dtype`) of dataset `name`.
  DType dtype(const std::string& name) const;
  bool has_attr(const std::string& name) const;

  void set_attr(const std::string& name, const std::string& value) const;
  void set_attr(const std::string& name, std::int64_t value) const;
  std::string attr_string(const std::string& name) const;
  std::int64_t attr_int(const std::string& name) const;

  std::string where(const std::string& name = "") const;  // "file.h5:/steps/step0/name"
  std::int64_t id() const { return h_.get(); }

 private:
  Handle h_;
  std::string file_, path_;
};

/// An open file; create() writes to `path.tmp` and commit() renames it to `path`, so an
/// interrupted writer never leaves a file under the final name.
class File {
 public:
  static File create(const std::string& path);
  static File open(const std::string& path);
  Group root() const;
  /// Flushes, closes and renames the temporary file to its final name.
  void commit();
  ~File();
  File(File&&) noexcept = default;

 private:
  File(Handle h, std::string path, std::string tmp)
      : h_(std::move(h)), path_(std::move(path)), tmp_(std::move(tmp)) {}
  Handle h_;
  std::string path_, tmp_;
};

}  // namespace dsv32::h5
