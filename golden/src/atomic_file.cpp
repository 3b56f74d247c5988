#include "mok/golden/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "mok/core/config.h"

namespace mok::golden {
namespace {

std::atomic<unsigned> temp_counter{0};

std::string os_error() { return std::strerror(errno); }

}  // namespace

AtomicFile::AtomicFile(std::filesystem::path target) : target_(std::move(target)) {
  const std::filesystem::path dir = target_.has_parent_path() ? target_.parent_path() : ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw Error("mok: cannot write " + target_.string() + ": directory " + dir.string() + " does not exist");
  // ".<name>.tmp.<pid>.<n>", appended piecewise (GCC 12 warns falsely on "." + std::string temporaries).
  std::string name = ".";
  name += target_.filename().string();
  name += ".tmp." + std::to_string(getpid()) + "." + std::to_string(temp_counter++);
  temp_ = dir / name;
}

AtomicFile::~AtomicFile() {
  if (!committed_) {
    std::error_code ec;
    std::filesystem::remove(temp_, ec);
  }
}

void AtomicFile::commit() {
  const int fd = ::open(temp_.c_str(), O_RDONLY);
  if (fd < 0) throw Error("mok: cannot reopen " + temp_.string() + " to sync it: " + os_error());
  const bool synced = ::fsync(fd) == 0;
  const std::string sync_error = synced ? "" : os_error();
  ::close(fd);
  if (!synced) throw Error("mok: cannot sync " + temp_.string() + ": " + sync_error);
  if (std::rename(temp_.c_str(), target_.c_str()) != 0)
    throw Error("mok: cannot rename " + temp_.string() + " to " + target_.string() + ": " + os_error());
  committed_ = true;
}

void write_text_atomically(const std::filesystem::path& path, const std::string& text) {
  AtomicFile file(path);
  const int fd = ::open(file.temp_path().c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) throw Error("mok: cannot create " + file.temp_path().string() + ": " + os_error());
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      const std::string why = os_error();
      ::close(fd);
      throw Error("mok: cannot write " + file.temp_path().string() + ": " + why);
    }
    done += size_t(n);
  }
  if (::close(fd) != 0) throw Error("mok: cannot close " + file.temp_path().string() + ": " + os_error());
  file.commit();
}

}  // namespace mok::golden
