// What a path names, for messages about files and directories that are not what a tool can use.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace mok::golden {

// "" for a regular file (symbolic links followed); otherwise what the path is, as a phrase that
// completes "PATH ...": "no such file", "is a directory, not a regular file", "is a FIFO, not a regular file", ...
std::string not_a_regular_file(const std::filesystem::path& path);

// "" for a directory (symbolic links followed); otherwise what the path is, as a phrase that completes
// "PATH ...": "does not exist", "is a symbolic link to nothing (it dangles)", "is not a directory",
// "cannot be examined: WHY".
std::string not_a_directory(const std::filesystem::path& path);

// "" when an AtomicFile can write `path`: its directory exists and takes a new file (one is made there
// and removed), and the path names nothing or a regular file (a symbolic link is not followed); otherwise
// why not, as a phrase that completes "cannot write PATH: ...". For a tool to refuse an output before its
// work rather than after it.
std::string cannot_write_file(const std::filesystem::path& path);

// Throws mok::Error("mok: cannot write PATH: WHY") where cannot_write_file gives a reason: AtomicFile's
// check, and a tool's before the work whose result it would write.
void require_writable_file(const std::filesystem::path& path);

// "" when `path` is a directory or std::filesystem::create_directories can make it one (the nearest of
// it and its parents that exists is a directory); otherwise what is in the way, as a phrase that
// completes "PATH ...".
std::string cannot_make_directory(const std::filesystem::path& path);

// The directory's *.h5 files (golden files, by name), sorted. Throws mok::Error("mok: cannot list directory DIR:
// WHY") where it cannot be read (mok-golden check and mok-verify name the directory alike).
std::vector<std::filesystem::path> h5_files_in(const std::filesystem::path& dir);

// Whether the two paths name one existing file (links followed): a tool's output that would be written
// over one of its inputs.
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);

}  // namespace mok::golden
