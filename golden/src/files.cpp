#include "dsv32/golden/files.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <limits>

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

/// Removes `path`'s temporary files (`path.PID-N.tmp`) whose writer no longer runs: what a
/// SIGKILL left behind. A live writer's (this process's too) is left alone.
void remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const std::string prefix = p.filename().string() + ".";
  std::error_code ec;
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() + 4 || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - 4, 4, ".tmp") != 0)
      continue;
    const std::string middle = name.substr(prefix.size(), name.size() - prefix.size() - 4);
    const std::size_t dash = middle.find('-');
    if (dash == std::string::npos || dash == 0 || dash > 10 ||
        middle.find_first_not_of("0123456789-") != std::string::npos)
      continue;
    // Never a pid of 0 or one that wraps negative: kill() would then name a process group.
    const long long pid = std::stoll(middle.substr(0, dash));
    if (pid < 1 || pid > std::numeric_limits<pid_t>::max()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ::unlink(it->path().c_str());
  }
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
                      const std::function<void(std::size_t, std::size_t)>& progress,
                      const std::function<void(const std::string&)>& verify) {
  if (is_directory(path)) throw WriteError(path + ": cannot write: is a directory");
  remove_stale_temporaries(path);
  static std::atomic<unsigned> serial{0};
  const std::string tmp =
      path + "." + std::to_string(::getpid()) + "-" + std::to_string(serial.fetch_add(1)) + ".tmp";
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
  if (verify) {
    try {
      verify(tmp);
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename to " + path, errno);
}

DirectoryLock::DirectoryLock(const std::string& dir) {
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) throw WriteError(dir + ": cannot lock: " + reason(errno));
  while (::flock(fd_, LOCK_EX) != 0)
    if (errno != EINTR) {
      const int err = errno;
      ::close(fd_);
      throw WriteError(dir + ": cannot lock: " + reason(err));
    }
}

DirectoryLock::~DirectoryLock() {
  ::close(fd_);  // releases the lock
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
