// One file's processing in a tool's loop over files (mok-golden check, mok-verify).
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace mok::golden {

// Runs `work`, the processing of `file`, and returns the message of what it threw, or nothing. Any
// std::exception is that file's error, not the run's end: a std::bad_alloc or std::filesystem_error from a
// library call used to escape the loop, leaving the files after it unexamined and the report unwritten. A
// mok::Error's message is returned as it is (read_golden's and a backend's, as mok-verify wraps them,
// name the file); any other's what(), which knows no file, after the file's display_name.
std::optional<std::string> file_error(const std::filesystem::path& file, const std::function<void()>& work);

}  // namespace mok::golden
