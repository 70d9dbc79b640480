#include "dsv32/golden/files.hpp"

#include <fcntl.h>
#include <pthread.h>
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
#include <memory>
#include <stdexcept>

namespace dsv32::files {
namespace {

/// Temporary files being written, for remove_pending_files: a fixed table of pointers to paths
/// that their registrations own, so a signal handler may walk it without allocating.
constexpr std::size_t kSlots = 4096;
std::array<std::atomic<const char*>, kSlots> g_pending{};

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

/// A temporary name of this writer's own beside `path`: `path.PID-N.tmp`.
std::string temporary_name(const std::string& path) {
  static std::atomic<unsigned> serial{0};
  return path + "." + std::to_string(::getpid()) + "-" + std::to_string(serial.fetch_add(1)) +
         ".tmp";
}

/// Commits under way, and a signal that came during one (to be raised when the last ends): a
/// signal delivered to another thread (an OpenMP worker's mask is not the committing thread's)
/// must not cut a commit short either.
std::atomic<int> g_committing{0}, g_deferred{0};

void on_signal(int sig) {
  if (g_committing.load() > 0) {
    g_deferred.store(sig);
    return;
  }
  remove_pending_files();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

// Not in the anonymous namespace: StagedFiles::Entry holds one.
namespace detail {

/// Registers `path` while alive; WriteError when every slot is taken.
class Pending {
 public:
  explicit Pending(const std::string& path) : path_(new char[path.size() + 1]) {
    std::memcpy(path_.get(), path.c_str(), path.size() + 1);
    for (std::atomic<const char*>& s : g_pending) {
      const char* expected = nullptr;
      if (s.load() == nullptr && s.compare_exchange_strong(expected, path_.get())) {
        slot_ = &s;
        return;
      }
    }
    throw WriteError(path + ": cannot write: more than " + std::to_string(kSlots) +
                     " files are being written at once");
  }
  ~Pending() { slot_->store(nullptr); }
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;

 private:
  std::unique_ptr<char[]> path_;
  std::atomic<const char*>* slot_ = nullptr;
};

}  // namespace detail

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
  StagedFiles one;
  one.add(path, bytes, progress, verify);
  one.commit();
}

std::uint64_t fnv1a64(std::string_view bytes) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ull;
  }
  return h;
}

/// A staged file: its temporary (registered while it exists) and, during commit(), the link
/// that keeps the file it replaced.
struct StagedFiles::Entry {
  File file;
  std::filesystem::path same;  // the path made absolute and normal, links resolved
  std::string tmp, backup;
  std::unique_ptr<detail::Pending> pending;
  bool replaced = false, renamed = false;
};

StagedFiles::StagedFiles() = default;

StagedFiles::~StagedFiles() {
  if (committed_) return;
  for (const auto& e : entries_) ::unlink(e->tmp.c_str());
}

StagedFiles::File StagedFiles::add(const std::string& path, std::string_view bytes,
                                   const std::function<void(std::size_t, std::size_t)>& progress,
                                   const std::function<void(const std::string&)>& verify) {
  if (committed_) throw std::logic_error("StagedFiles::add after commit");
  if (is_directory(path)) throw WriteError(path + ": cannot write: is a directory");
  auto e = std::make_unique<Entry>();
  e->file.path = path;
  std::error_code ec;
  e->same = std::filesystem::absolute(path, ec).lexically_normal();
  if (const std::filesystem::path real = std::filesystem::weakly_canonical(e->same, ec); !ec)
    e->same = real;
  for (const auto& other : entries_)
    if (other->same == e->same)
      throw WriteError(path + ": cannot write: written twice in one run (also as " +
                       other->file.path + ")");
  remove_stale_temporaries(path);
  e->tmp = temporary_name(path);
  e->pending = std::make_unique<detail::Pending>(e->tmp);
  const std::string& tmp = e->tmp;
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
  e->file.bytes = bytes.size();
  e->file.fnv1a64 = fnv1a64(bytes);
  entries_.push_back(std::move(e));
  return entries_.back()->file;
}

void StagedFiles::commit() {
  if (committed_) return;
  // A signal now would leave some files renamed and others not: it waits until the end (blocked
  // in this thread; deferred by the handler in any other).
  sigset_t block{}, old{};
  sigemptyset(&block);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&block, sig);
  ::pthread_sigmask(SIG_BLOCK, &block, &old);
  g_committing.fetch_add(1);
  std::string error;
  for (const auto& e : entries_) {
    const std::string& path = e->file.path;
    if (is_directory(path)) {
      error = path + ": cannot write: is a directory";
      break;
    }
    // The file replaced is kept (a second link to it) until every rename is done; one file
    // alone needs none (its rename happens or not), nor a file system without hard links.
    struct stat st {};
    e->replaced = ::lstat(path.c_str(), &st) == 0;
    if (e->replaced && entries_.size() > 1) {
      e->backup = temporary_name(path);
      if (::link(path.c_str(), e->backup.c_str()) != 0) e->backup.clear();
    }
    if (::rename(e->tmp.c_str(), path.c_str()) != 0) {
      error = e->tmp + ": cannot rename to " + path + ": " + reason(errno);
      break;
    }
    e->renamed = true;
  }
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    Entry& e = **it;
    if (!error.empty() && e.renamed) {  // put the file it replaced back, or none
      if (e.replaced && e.backup.empty())
        error += "; " + e.file.path + " could not be put back (no second link to it was made)";
      else if (e.backup.empty() ? ::unlink(e.file.path.c_str()) != 0
                                : ::rename(e.backup.c_str(), e.file.path.c_str()) != 0)
        error += "; " + e.file.path + " could not be put back: " + reason(errno);
    }
    if (!e.backup.empty()) ::unlink(e.backup.c_str());
    if (!e.renamed) ::unlink(e.tmp.c_str());
    e.pending.reset();
  }
  committed_ = true;
  if (g_committing.fetch_sub(1) == 1)
    if (const int sig = g_deferred.exchange(0)) std::raise(sig);
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (!error.empty()) throw WriteError(error);
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
  for (const std::atomic<const char*>& s : g_pending)
    if (const char* path = s.load()) ::unlink(path);
}

void install_signal_cleanup() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  std::signal(SIGXFSZ, SIG_IGN);
}

}  // namespace dsv32::files
