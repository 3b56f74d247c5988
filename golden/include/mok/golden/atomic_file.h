// Atomic file replacement: write under a temporary name in the target's directory, then rename.
#pragma once

#include <filesystem>
#include <string>

namespace mok::golden {

// The temporary file's name is reserved on construction; the caller writes it (any API), then
// commit() syncs it to disk and renames it over the target. Destroyed uncommitted, the temporary is
// removed and the target is left as it was. Errors are mok::Error naming the file.
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
  bool committed_ = false;
};

void write_text_atomically(const std::filesystem::path& path, const std::string& text);

}  // namespace mok::golden
