// Private: the text of a mok::Error without its leading "mok: ", for wrapping it in more context.
#pragma once

#include <exception>
#include <string>

namespace mok::golden {

inline std::string reason_of(const std::exception& e) {
  const std::string what = e.what();
  return what.rfind("mok: ", 0) == 0 ? what.substr(5) : what;
}

}  // namespace mok::golden
