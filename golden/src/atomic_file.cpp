#include "mok/golden/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <mutex>
#include <utility>

#include "mok/core/config.h"
#include "mok/golden/file_kind.h"

namespace mok::golden {
namespace {

std::atomic<unsigned> temp_counter{0};

std::string os_error() { return std::strerror(errno); }

// The temporaries being written, for the handler of kTerminatingSignals to unlink: an interrupted write must
// leave no hidden ".NAME.tmp.PID.N" behind. Fixed slots of plain chars, since a handler may only read
// memory and call async-signal-safe functions (unlink, signal, raise). A slot is free, being filled, or
// live; the handler unlinks the live ones.
constexpr int kTempSlots = 16;
enum SlotState : int { kFree = 0, kFilling = 1, kLive = 2 };

struct TempSlot {
  std::atomic<int> state{kFree};
  char path[PATH_MAX];
};

TempSlot temp_slots[kTempSlots];

extern "C" void unlink_temporaries(int sig) {
  for (TempSlot& slot : temp_slots)
    if (slot.state.load() == kLive) ::unlink(slot.path);
  std::signal(sig, SIG_DFL);  // then die of the signal as if it had not been caught
  std::raise(sig);
}

// Installs the handler for kTerminatingSignals, where they still have the default action (a program
// that handles or ignores them keeps its choice).
void install_handler_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const int sig : kTerminatingSignals) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;
      struct sigaction now {};
      now.sa_handler = unlink_temporaries;
      sigemptyset(&now.sa_mask);
      ::sigaction(sig, &now, nullptr);
    }
  });
}

// The slot now holding `path` for the handler, or -1 when all are taken or the path is too long (that
// temporary is then only removed by the destructor).
int register_temporary(const std::filesystem::path& path) {
  install_handler_once();
  const std::string& text = path.native();
  if (text.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kTempSlots; ++i) {
    int expected = kFree;
    if (!temp_slots[i].state.compare_exchange_strong(expected, kFilling)) continue;
    std::memcpy(temp_slots[i].path, text.c_str(), text.size() + 1);
    temp_slots[i].state.store(kLive);
    return i;
  }
  return -1;
}

void release_temporary(int slot) {
  if (slot >= 0) temp_slots[slot].state.store(kFree);
}

}  // namespace

AtomicFile::AtomicFile(std::filesystem::path target) : target_(std::move(target)) {
  const std::filesystem::path dir = target_.has_parent_path() ? target_.parent_path() : ".";
  require_writable_file(target_);
  // ".<name>.tmp.<pid>.<n>", appended piecewise (GCC 12 warns falsely on "." + std::string temporaries).
  // The name cut so that the whole stays within NAME_MAX: a target of 230-255 bytes, a name the
  // system takes, failed as "cannot create .<name>.tmp...: File name too long" once the work was done
  // (pid and counter keep the temporary unique).
  constexpr size_t kSuffixBytes = 1 + 5 + 10 + 1 + 10;  // ".", ".tmp.", pid, ".", counter (at most)
  std::string name = ".";
  name += target_.filename().string().substr(0, NAME_MAX - kSuffixBytes);
  name += ".tmp." + std::to_string(getpid()) + "." + std::to_string(temp_counter++);
  temp_ = dir / name;
  slot_ = register_temporary(temp_);
}

// Removed before the slot is released: a signal in between unlinks a name that is already gone.
AtomicFile::~AtomicFile() {
  if (!committed_) {
    std::error_code ec;
    std::filesystem::remove(temp_, ec);
  }
  release_temporary(slot_);
}

void AtomicFile::commit() {
  const int fd = ::open(temp_.c_str(), O_RDONLY);
  if (fd < 0) throw Error("mok: cannot reopen " + display_name(temp_.string()) + " to sync it: " + os_error());
  // A file replaced keeps its permissions (a private 0600 report became 0644 when it was written again),
  // set before the sync that makes them durable with the bytes.
  struct stat old {};
  const bool replaced = ::stat(target_.c_str(), &old) == 0;
  const bool moded = !replaced || ::fchmod(fd, old.st_mode & 0777) == 0;
  const std::string mode_error = moded ? "" : os_error();
  const bool synced = moded && ::fsync(fd) == 0;
  const std::string sync_error = synced || !moded ? "" : os_error();
  ::close(fd);
  if (!moded)
    throw Error("mok: cannot give " + display_name(temp_.string()) + " the permissions of " +
                display_name(target_.string()) + ": " + mode_error);
  if (!synced) throw Error("mok: cannot sync " + display_name(temp_.string()) + ": " + sync_error);
  if (std::rename(temp_.c_str(), target_.c_str()) != 0)
    throw Error("mok: cannot rename " + display_name(temp_.string()) + " to " + display_name(target_.string()) + ": " +
                os_error());
  committed_ = true;
  release_temporary(std::exchange(slot_, -1));
}

void write_bytes_atomically(const std::filesystem::path& path, const std::string& bytes) {
  AtomicFile file(path);
  const int fd = ::open(file.temp_path().c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) throw Error("mok: cannot create " + display_name(file.temp_path().string()) + ": " + os_error());
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      const std::string why = os_error();
      ::close(fd);
      throw Error("mok: cannot write " + display_name(file.temp_path().string()) + ": " + why);
    }
    done += size_t(n);
  }
  if (::close(fd) != 0) throw Error("mok: cannot close " + display_name(file.temp_path().string()) + ": " + os_error());
  file.commit();
}

}  // namespace mok::golden
