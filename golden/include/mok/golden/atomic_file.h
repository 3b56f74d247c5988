// Atomic file replacement: write under a temporary name in the target's directory, then rename.
#pragma once

#include <csignal>
#include <filesystem>
#include <string>

namespace mok::golden {

// The signals whose default action ends a process without a core dump or with one (a closed terminal's
// SIGHUP, Ctrl-C, Ctrl-\, kill, a closed pipe, timers, the user signals, and the file-size and CPU-time
// limits: a write past `ulimit -f` is SIGXFSZ).
inline constexpr int kTerminatingSignals[] = {SIGHUP,  SIGINT,  SIGQUIT, SIGTERM, SIGPIPE,   SIGALRM,
                                              SIGUSR1, SIGUSR2, SIGXFSZ, SIGXCPU, SIGVTALRM, SIGPROF};

// The temporary file's name is reserved on construction; the caller writes it (any API), then
// commit() syncs it to disk and renames it over the target. Destroyed uncommitted, the temporary is
// removed and the target is left as it was; killed meanwhile by one of kTerminatingSignals (where the
// program left it at its default action), the process unlinks it before it dies. A target that exists
// must be a regular file (a FIFO, a device or a symbolic link is refused on construction). Errors are
// mok::Error naming the file.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path target);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::filesystem::path& temp_path() const { return temp_; }
  void commit();

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  int slot_ = -1;  // where the signal handler finds temp_, -1 if nowhere
  bool committed_ = false;
};

// `bytes` (text or not) as the whole of the file at `path`, through an AtomicFile.
void write_bytes_atomically(const std::filesystem::path& path, const std::string& bytes);

}  // namespace mok::golden
