// What a path names, for messages about files and directories that are not what a tool can use.
#pragma once

#include <filesystem>
#include <string>

namespace mok::golden {

// "" for a regular file (symbolic links followed); otherwise what the path is, as a phrase that
// completes "PATH ...": "no such file", "is a directory, not a regular file", "is a FIFO, not a regular file", ...
std::string not_a_regular_file(const std::filesystem::path& path);

// "" for a directory (symbolic links followed); otherwise what the path is, as a phrase that completes
// "PATH ...": "does not exist", "is not a directory", "cannot be examined: WHY".
std::string not_a_directory(const std::filesystem::path& path);

// Whether the two paths name one existing file (links followed): a tool's output that would be written
// over one of its inputs.
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);

}  // namespace mok::golden
