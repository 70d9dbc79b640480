// Thin RAII over the HDF5 C API: row-major datasets with a logical `dtype` attribute,
// no object timestamps, errors as GoldenError naming the file and object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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
/// A dataset whose shape is not the one asked for ("FILE:/path: shape [..], expected [..]").
struct ShapeError : GoldenError {
  using GoldenError::GoldenError;
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

/// The bytes a reader may hold for a file's datasets: every read takes its share (8 bytes an
/// element, as doubles, and as much again while converting) before it allocates, and a read
/// that would pass the bound is refused by name. A file's declared shapes are not its size: a
/// lazily allocated dataset of 10^9 elements takes a few bytes on disk.
class Budget {
 public:
  explicit Budget(double max_bytes) : max_(max_bytes) {}
  /// Takes `bytes` for good, refusing (GoldenError naming `where`) when `bytes + transient`
  /// would not fit in what is left.
  void take(double bytes, double transient, const std::string& where);
  double used() const { return used_; }
  double max() const { return max_; }

 private:
  double max_, used_ = 0;
};

/// A group (or a file's root group) with the file's name for messages.
class Group {
 public:
  Group(Handle h, std::string file, std::string path, std::shared_ptr<Budget> budget = nullptr)
      : h_(std::move(h)),
        file_(std::move(file)),
        path_(std::move(path)),
        budget_(std::move(budget)) {}
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
  /// dataset, an inexact conversion, when `shape` is given any other shape, and when
  /// `max_elements` is given (>= 0) a dataset of more elements; all of that before the values
  /// are read. Messages name the dataset.
  Tensor read(const std::string& name, DType want,
              const std::optional<std::vector<std::int64_t>>& shape = std::nullopt,
              std::int64_t max_elements = -1) const;
  /// As read with `shape`, the values written to storage(elements) (called once the shape,
  /// type and budget are checked) instead of the returned tensor's data (left empty): a matrix
  /// of a large dataset filled without a second copy.
  Tensor read_into(const std::string& name, DType want, const std::vector<std::int64_t>& shape,
                   const std::function<double*(std::size_t)>& storage) const;
  /// The logical dtype (attribute `dtype`) of dataset `name`.
  DType dtype(const std::string& name) const;
  bool has_attr(const std::string& name) const;

  void set_attr(const std::string& name, const std::string& value) const;
  void set_attr(const std::string& name, std::int64_t value) const;
  std::string attr_string(const std::string& name) const;
  std::int64_t attr_int(const std::string& name) const;

  std::string where(const std::string& name = "") const;  // "file.h5:/steps/step0/name"
  std::int64_t id() const { return h_.get(); }
  /// The reader's budget (null when unbounded: the writer's own groups).
  Budget* budget() const { return budget_.get(); }

 private:
  Tensor read_to(const std::string& name, DType want,
                 const std::optional<std::vector<std::int64_t>>& shape, std::int64_t max_elements,
                 const std::function<double*(std::size_t)>& storage) const;
  void require_one_value(const Handle& attr, const std::string& name) const;
  /// The path of member `name` ("/steps/step0/name"; this group's own for "").
  std::string child_path(const std::string& name) const;
  Handle h_;
  std::string file_, path_;
  std::shared_ptr<Budget> budget_;
};

/// An open file. create() builds the file in memory; commit() writes it whole to `path.tmp`
/// and renames it to `path` (files::write_atomically), so a failed or interrupted writer never
/// leaves a file under the final name. Write failures throw files::WriteError.
class File {
 public:
  static File create(const std::string& path);
  /// Opens a regular file read-only (a FIFO, a directory or a device is refused by name); its
  /// datasets' reads share one Budget of `max_bytes`.
  static File open(const std::string& path, double max_bytes);
  Group root() const;
  /// Writes the file out (see above); without it nothing is written. `verify` (may be empty)
  /// is called on the whole temporary file before the rename (files::write_atomically).
  void commit(const std::function<void(const std::string&)>& verify = {});
  /// The bytes commit() would write, from a file being built (nothing is written).
  std::string image() const;
  /// The bytes commit() would write, the in-memory file closed (so the two are not held at
  /// once): for a caller that writes them itself (files::StagedFiles).
  std::string release_image();
  File(File&&) noexcept = default;

 private:
  File(Handle h, std::string path, bool writing, std::shared_ptr<Budget> budget = nullptr)
      : h_(std::move(h)), path_(std::move(path)), writing_(writing), budget_(std::move(budget)) {}
  Handle h_;
  std::string path_;
  bool writing_ = false;
  std::shared_ptr<Budget> budget_;
};

/// Runs `parse` (which reads `path` through this library) in a child process first, so that a
/// file corrupt in a way libhdf5 does not survive (a crash, an endless loop or an unbounded
/// allocation inside the library on a damaged heap or B-tree; docs/BAD_INPUT.md) is reported as
/// a GoldenError naming the file instead of taking this process down. Returns when the child
/// parsed the file; throws the child's GoldenError message when it refused it, and names the
/// signal, the time limit (10 s + 1 s per 5 MB) or the memory bound (`max_bytes` more than this
/// process holds) when libhdf5 did not come back.
void contain(const std::string& path, const std::function<void()>& parse, double max_bytes);
/// Reads every object, attribute and dataset of `path` through libhdf5 and drops the values
/// (a dataset a slab at a time): what a contained child does before a reader parses the file
/// in this process, in a fraction of the reader's time and memory. Refuses only what File::open
/// refuses; every other error is left to the reader, which names it.
void scan(const std::string& path, double max_bytes);
/// The same, for a `parse` whose answer is all the caller needs: returns what it returned in
/// the child (at most 64 KiB), so that the file is parsed once, not again in this process.
std::string contain_report(const std::string& path, const std::function<std::string()>& parse,
                           double max_bytes);

}  // namespace dsv32::h5
