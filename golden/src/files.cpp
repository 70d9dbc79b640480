#include "dsv32/golden/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>

namespace dsv32::files {
namespace {

/// Temporary files being written, for remove_pending_files: fixed storage, no allocation, so a
/// signal handler may walk it.
constexpr std::size_t kSlots = 8, kPathMax = 4096;
struct Slot {
  std::atomic<bool> used{false};
  char path[kPathMax] = {};
};
std::array<Slot, kSlots> g_pending;

/// Registers `path` while alive.
class Pending {
 public:
  explicit Pending(const std::string& path) {
    if (path.size() >= kPathMax) return;
    for (Slot& s : g_pending) {
      bool expected = false;
      if (s.used.load() || !s.used.compare_exchange_strong(expected, true)) continue;
      std::memcpy(s.path, path.c_str(), path.size() + 1);
      slot_ = &s;
      return;
    }
  }
  ~Pending() {
    if (slot_) slot_->used.store(false);
  }
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;

 private:
  Slot* slot_ = nullptr;
};

std::string reason(int err) {
  return std::strerror(err);
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void on_signal(int sig) {
  remove_pending_files();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

std::string not_regular_file_reason(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return errno == ENOENT ? "no such file" : "cannot stat: " + reason(errno);
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "is a directory, not a file";
  if (S_ISFIFO(st.st_mode)) return "is a FIFO, not a regular file";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "is a device, not a regular file";
  if (S_ISSOCK(st.st_mode)) return "is a socket, not a regular file";
  return "is not a regular file";
}

void require_writable_location(const std::string& path) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  const std::string d = dir.empty() ? "." : dir.string();
  struct stat st {};
  if (::stat(d.c_str(), &st) != 0)
    throw WriteError(path + ": cannot write: directory " + d + ": " + reason(errno));
  if (!S_ISDIR(st.st_mode)) throw WriteError(path + ": cannot write: " + d + " is not a directory");
  if (is_directory(path)) throw WriteError(path + ": cannot write: is a directory");
  if (::access(d.c_str(), W_OK) != 0)
    throw WriteError(path + ": cannot write: directory " + d + ": " + reason(errno));
}

void write_atomically(const std::string& path, std::string_view bytes,
                      const std::function<void(std::size_t, std::size_t)>& progress) {
  if (is_directory(path)) throw WriteError(path + ": cannot write: is a directory");
  const std::string tmp = path + ".tmp";
  const Pending pending(tmp);
  ::unlink(tmp.c_str());  // a stale one (or a link planted there) is replaced, not followed
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw WriteError(tmp + ": cannot create: " + reason(errno));
  const auto fail = [&](const std::string& what, int err) {
    ::unlink(tmp.c_str());
    throw WriteError(tmp + ": " + what + ": " + reason(err));
  };
  constexpr std::size_t kChunk = std::size_t{4} << 20;
  std::size_t done = 0;
  while (done < bytes.size()) {
    const std::size_t n = std::min(kChunk, bytes.size() - done);
    const ssize_t w = ::write(fd, bytes.data() + done, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : EIO;
      ::close(fd);
      fail("write failed after " + std::to_string(done) + " of " + std::to_string(bytes.size()) +
               " bytes",
           err);
    }
    done += static_cast<std::size_t>(w);
    if (progress) progress(done, bytes.size());
  }
  if (::close(fd) != 0) fail("close failed", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename to " + path, errno);
}

void remove_pending_files() noexcept {
  for (Slot& s : g_pending)
    if (s.used.load()) ::unlink(s.path);
}

void install_signal_cleanup() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  std::signal(SIGXFSZ, SIG_IGN);
}

}  // namespace dsv32::files
