#include "mok/golden/file_error.h"

#include <exception>

#include "mok/core/config.h"

namespace mok::golden {

std::optional<std::string> file_error(const std::filesystem::path& file, const std::function<void()>& work) {
  try {
    work();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return display_name(file.string()) + ": " + e.what();
  }
  return std::nullopt;
}

}  // namespace mok::golden
