// h5::contain: a file parsed in a forked child first, bounded in time and memory, so that a
// file which crashes or hangs libhdf5 is an error naming it (docs/BAD_INPUT.md).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <string>

#include "dsv32/golden/h5.hpp"

namespace dsv32::h5 {

namespace {

/// This process's virtual size in bytes (0 when unknown).
double virtual_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long pages = 0;
  const int got = std::fscanf(f, "%lu", &pages);
  std::fclose(f);
  return got == 1 ? static_cast<double>(pages) * static_cast<double>(::sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace

void contain(const std::string& path, const std::function<void()>& parse, double max_bytes) {
  contain_report(
      path,
      [&] {
        parse();
        return std::string();
      },
      max_bytes);
}

std::string contain_report(const std::string& path, const std::function<std::string()>& parse,
                           double max_bytes) {
  int fds[2];
  if (::pipe(fds) != 0) throw GoldenError(path + ": cannot make a pipe to read it safely");
  // The bounds, computed before fork (the child only reads and exits).
  const double limit = virtual_bytes() + 2.0 * max_bytes + 512.0 * (1 << 20);
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  const double seconds = 10.0 + (ec ? 0.0 : static_cast<double>(size) / 5e6);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw GoldenError(path + ": cannot fork to read it safely");
  }
  if (pid == 0) {  // the child: parse, report, and leave without running exit-time cleanup
    ::close(fds[0]);
#if !defined(__SANITIZE_ADDRESS__)
    if (limit > 0 && limit < 1e18) {
      const rlimit rl{static_cast<rlim_t>(limit), static_cast<rlim_t>(limit)};
      ::setrlimit(RLIMIT_AS, &rl);
    }
#endif
    const rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);
    std::string message;
    int code = 0;
    try {
      message = parse();
    } catch (const GoldenError& e) {
      message = e.what();
      code = 2;
    } catch (const std::bad_alloc&) {
      code = 3;
    } catch (const std::exception& e) {
      message = path + ": " + e.what();
      code = 2;
    }
    for (std::size_t done = 0; done < message.size();) {
      const ssize_t w = ::write(fds[1], message.data() + done, message.size() - done);
      if (w <= 0) break;
      done += static_cast<std::size_t>(w);
    }
    ::_exit(code);
  }
  ::close(fds[1]);
  // The child's message is drained while it runs: one longer than the pipe holds would block
  // its write, and its silence would then read as a hang in the library.
  ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
  std::string message;
  const auto drain = [&] {
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
      if (message.size() < (std::size_t{1} << 16)) message.append(buf, static_cast<std::size_t>(n));
  };
  int status = 0;
  bool timed_out = false;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    drain();
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    ::usleep(2000);
  }
  drain();
  ::close(fds[0]);
  if (timed_out)
    throw GoldenError(path + ": the HDF5 library gave no answer in " +
                      std::to_string(static_cast<int>(seconds)) +
                      " s reading this file (a damaged heap can make it loop): the file is "
                      "corrupt");
  if (WIFSIGNALED(status))
    throw GoldenError(path + ": the HDF5 library crashed (" + strsignal(WTERMSIG(status)) +
                      ") reading this file: the file is corrupt in a way its own checks miss");
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 0) return message;
  if (code == 3)
    throw GoldenError(path + ": reading this file would take more than the reader's memory bound " +
                      "(a damaged size inside the file?)");
  if (code == 2 && !message.empty()) throw GoldenError(message);
  // A sanitizer's report of a fault inside the library ends the child with its own exit code.
  throw GoldenError(path + ": the HDF5 library crashed (exit status " + std::to_string(code) +
                    ") reading this file: the file is corrupt in a way its own checks miss");
}

}  // namespace dsv32::h5
