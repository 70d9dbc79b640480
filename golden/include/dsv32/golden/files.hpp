// Files in and out, the way bad input demands (docs/BAD_INPUT.md): only regular files are read,
// every write is checked, a file appears whole under its final name or not at all, and a
// temporary file is removed on failure and (through remove_pending_files from a signal handler)
// on SIGINT and SIGTERM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dsv32::files {

/// A file could not be written (no space, no directory, a size limit, ...): the message names
/// the file and the system's reason. Not an input error: the input may be fine.
struct WriteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Why `path` is not an existing regular file (after symbolic links), or "" when it is: "no such
/// file", "is a directory", "is a FIFO (not a regular file)", ... Opening a FIFO would block.
std::string not_regular_file_reason(const std::string& path);

/// Writes `bytes` to a temporary file of its own beside `path` (`path.PID-N.tmp`, so that two
/// writers of one path never rename each other's file), checking every write and the close,
/// then calls `verify` on the temporary file (may be empty; an exception from it is passed on),
/// then renames it to `path`. On any failure the temporary file is removed and WriteError names
/// the file and the reason. While the temporary file exists it is registered for
/// remove_pending_files; the temporary files of writers that no longer run (killed by SIGKILL)
/// are removed first. `progress` (may be empty) gets (bytes written, bytes) every few MiB.
/// (A StagedFiles of one file.)
void write_atomically(const std::string& path, std::string_view bytes,
                      const std::function<void(std::size_t, std::size_t)>& progress = {},
                      const std::function<void(const std::string&)>& verify = {});

/// FNV-1a, 64 bits, of `bytes` (MANIFEST.json's `fnv1a64`).
std::uint64_t fnv1a64(std::string_view bytes);

/// Files written whole or not at all, together: a run's outputs. add() writes a file to a
/// temporary of its own beside its path, as write_atomically does (every write and the close
/// checked, `verify` called on the temporary), and nothing takes its final name until commit()
/// renames them all, in the order added (under the caller's lock, where other writers share
/// them). On a failure in add() or commit(), and on destruction without commit(), every
/// temporary is removed and every file commit() had already replaced is put back as it was.
/// While temporaries exist they are registered for remove_pending_files (SIGINT during a long
/// run removes them all); commit() defers SIGINT, SIGTERM and SIGHUP until it is done. Only the
/// temporaries are on disk: a run of many large files holds none of them in memory.
class StagedFiles {
 public:
  /// What add() wrote: the bytes' count and hash, taken from the bytes written (not from the
  /// path read back later, which another writer may have replaced by then).
  struct File {
    std::string path;
    std::size_t bytes = 0;
    std::uint64_t fnv1a64 = 0;
  };
  StagedFiles();
  ~StagedFiles();
  StagedFiles(const StagedFiles&) = delete;
  StagedFiles& operator=(const StagedFiles&) = delete;
  /// Writes `path`'s temporary (WriteError on failure, naming it; a path that is a directory,
  /// or that this set already holds, is refused first).
  File add(const std::string& path, std::string_view bytes,
           const std::function<void(std::size_t, std::size_t)>& progress = {},
           const std::function<void(const std::string&)>& verify = {});
  /// Renames every temporary to its path; WriteError (the files as they were) on failure.
  void commit();

 private:
  struct Entry;
  std::vector<std::unique_ptr<Entry>> entries_;
  bool committed_ = false;
};

/// An exclusive lock on a directory while alive (flock on the directory itself, so no lock file
/// is left in it): the read-modify-write of a file many writers share, such as MANIFEST.json.
class DirectoryLock {
 public:
  explicit DirectoryLock(const std::string& dir);  // waits for the lock; WriteError if it cannot
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

/// Throws WriteError unless `path`'s directory exists and is a directory (so a long job can
/// refuse an output it could never write before it starts).
void require_writable_location(const std::string& path);

/// Removes every temporary file write_atomically and StagedFiles have open right now (at most
/// 4096 at once: a write past that is refused). Async-signal-safe: for a
/// SIGINT/SIGTERM handler, which then re-raises the signal.
void remove_pending_files() noexcept;

/// Installs handlers for SIGINT, SIGTERM and SIGHUP that call remove_pending_files and then
/// end the process by the same signal, and ignores SIGXFSZ so that a file-size limit is a
/// write error (EFBIG) rather than a kill. For programs (the dsv32 tool), not libraries.
void install_signal_cleanup();

}  // namespace dsv32::files
