// Files in and out, the way bad input demands (docs/BAD_INPUT.md): only regular files are read,
// every write is checked, a file appears whole under its final name or not at all, and a
// temporary file is removed on failure and (through remove_pending_files from a signal handler)
// on SIGINT and SIGTERM.
#pragma once

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

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
void write_atomically(const std::string& path, std::string_view bytes,
                      const std::function<void(std::size_t, std::size_t)>& progress = {},
                      const std::function<void(const std::string&)>& verify = {});

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

/// Removes every temporary file write_atomically has open right now. Async-signal-safe: for a
/// SIGINT/SIGTERM handler, which then re-raises the signal.
void remove_pending_files() noexcept;

/// Installs handlers for SIGINT, SIGTERM and SIGHUP that call remove_pending_files and then
/// end the process by the same signal, and ignores SIGXFSZ so that a file-size limit is a
/// write error (EFBIG) rather than a kill. For programs (the dsv32 tool), not libraries.
void install_signal_cleanup();

}  // namespace dsv32::files
