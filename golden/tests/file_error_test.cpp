// file_error, the per-file guard of mok-golden check's and mok-verify's loops: any std::exception is the
// file's error, not the run's end (a std::bad_alloc or std::filesystem_error used to end the loop,
// leaving the files after it unexamined and mok-verify's JSON report unwritten).
#include "mok/golden/file_error.h"

#include <gtest/gtest.h>

#include <new>
#include <stdexcept>
#include <system_error>

#include "mok/core/config.h"

namespace mok::golden {
namespace {

const std::filesystem::path kFile = "/goldens/a\nb.h5";

TEST(FileError, NoneWhenTheWorkReturns) {
  EXPECT_EQ(file_error(kFile, [] {}), std::nullopt);
}

// mok's own errors name their file already: their message is kept as it is.
TEST(FileError, AMokErrorIsItsMessage) {
  EXPECT_EQ(file_error(kFile, [] { throw Error("mok: golden file x.h5: corrupt"); }), "mok: golden file x.h5: corrupt");
}

TEST(FileError, AnyOtherExceptionIsTheFilesErrorNamingIt) {
  EXPECT_EQ(file_error(kFile, [] { throw std::runtime_error("boom"); }), "'/goldens/a\\x0ab.h5': boom");
  EXPECT_EQ(file_error(kFile, [] { throw std::bad_alloc(); }), "'/goldens/a\\x0ab.h5': std::bad_alloc");
  const auto fs_error = file_error(kFile, [] {
    throw std::filesystem::filesystem_error("cannot stat", std::make_error_code(std::errc::permission_denied));
  });
  ASSERT_TRUE(fs_error);
  EXPECT_EQ(fs_error->rfind("'/goldens/a\\x0ab.h5': filesystem error: cannot stat", 0), 0u) << *fs_error;
}

}  // namespace
}  // namespace mok::golden
