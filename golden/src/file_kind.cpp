#include "mok/golden/file_kind.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "mok/core/config.h"

namespace mok::golden {

std::string not_a_regular_file(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status s = fs::status(path, ec);
  switch (s.type()) {
    case fs::file_type::regular:
      return "";
    case fs::file_type::not_found:
      return "no such file";
    case fs::file_type::directory:
      return "is a directory, not a regular file";
    case fs::file_type::fifo:
      return "is a FIFO, not a regular file";
    case fs::file_type::character:
      return "is a character device, not a regular file";
    case fs::file_type::block:
      return "is a block device, not a regular file";
    case fs::file_type::socket:
      return "is a socket, not a regular file";
    default:
      return ec ? "cannot be examined: " + ec.message() : "is not a regular file";
  }
}

std::string not_a_directory(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_type type = fs::status(path, ec).type();
  if (type == fs::file_type::directory) return "";
  // A dangling link is no path to make: "does not exist" read as "will be made" for mok-fuzz's --repro-dir.
  if (type == fs::file_type::not_found)
    return fs::is_symlink(fs::symlink_status(path, ec)) ? "is a symbolic link to nothing (it dangles)"
                                                        : "does not exist";
  return ec ? "cannot be examined: " + ec.message() : "is not a directory";
}

namespace {

// Whether `dir` takes a new file. Its permissions, a read-only mount and a file system such as /proc say
// no only to a file being made, so one is made (O_EXCL, under a name of this process's) and removed.
std::string cannot_make_file_in(const std::filesystem::path& dir) {
  static std::atomic<unsigned> probes{0};
  const std::filesystem::path probe =
      dir / (".mok-probe." + std::to_string(::getpid()) + "." + std::to_string(probes++));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot make a file in " + display_name(dir.string()) + ": " + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

}  // namespace

std::string cannot_write_file(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  const fs::path dir = path.has_parent_path() ? path.parent_path() : ".";
  if (const std::string kind = not_a_directory(dir); !kind.empty()) return display_name(dir.string()) + " " + kind;
  // The rename replaces whatever has the name: only a regular file, or nothing, may (not a FIFO, a
  // device, or a link, which would become a file while what it points to stays as it was).
  std::error_code ec;
  const fs::file_type there = fs::symlink_status(path, ec).type();
  if (there == fs::file_type::symlink) return "it is a symbolic link, not a regular file (name the file it points to)";
  if (there != fs::file_type::not_found)
    if (const std::string kind = not_a_regular_file(path); !kind.empty()) return "it " + kind;
  return cannot_make_file_in(dir);
}

void require_writable_file(const std::filesystem::path& path) {
  if (const std::string why = cannot_write_file(path); !why.empty())
    throw Error("mok: cannot write " + display_name(path.string()) + ": " + why);
}

std::vector<std::filesystem::path> h5_files_in(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  // Error codes: a directory that cannot be read threw std::filesystem_error, whose text names no tool.
  std::error_code ec;
  std::vector<fs::path> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".h5") files.push_back(it->path());
  if (ec) throw Error("mok: cannot list directory " + display_name(dir.string()) + ": " + ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

std::string cannot_make_directory(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  // Up the parents while they do not exist ("a/b/c" with no "a/b" is made whole); the first that does
  // must be a directory. A relative path's last parent is "" (the current directory: it exists).
  for (fs::path p = path; !p.empty(); p = p.parent_path()) {
    std::error_code ec;  // set for a path that does not exist too
    if (fs::symlink_status(p, ec).type() == fs::file_type::not_found && p.has_relative_path()) continue;
    const std::string kind = not_a_directory(p);
    if (kind.empty()) return "";
    return p == path ? kind : "cannot be made: " + display_name(p.string()) + " " + kind;
  }
  return "";
}

bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;  // either missing (or not examinable): no file of the other is overwritten
  const bool same = std::filesystem::equivalent(a, b, ec);
  return !ec && same;
}

}  // namespace mok::golden
