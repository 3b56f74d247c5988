#include "mok/golden/file_kind.h"

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
  if (type == fs::file_type::not_found) return "does not exist";
  return ec ? "cannot be examined: " + ec.message() : "is not a directory";
}

bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;  // either missing (or not examinable): no file of the other is overwritten
  const bool same = std::filesystem::equivalent(a, b, ec);
  return !ec && same;
}

}  // namespace mok::golden
