// mok-verify's run over goldens: every golden compared against a candidate file or a backend's run, the
// text report, the JSON report and the exit status. The tool (tools/mok_verify.cpp) parses its arguments
// and picks the backend; tests drive this with backends of their own.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include "mok/verify/backend.h"

namespace mok::verify {

// Exit statuses (docs/golden-format.md); 77 is ctest's SKIP_RETURN_CODE.
inline constexpr int kExitEqual = 0, kExitMismatch = 1, kExitError = 2, kExitNoGpu = 77;

struct VerifyRequest {
  std::vector<std::filesystem::path> goldens;  // golden files, or directories of them (each *.h5)
  std::string candidate;                       // a golden-format file to compare; empty: the backend's run
  std::string json;                            // where to write the JSON report; empty: none
  int runs = 1;                                // backend runs per golden
  bool quiet = false;                          // no progress lines
};

// Compares each golden of the request against the candidate file, or `backend`'s run on it (backend
// is used only without a candidate), the report to `out`, progress and errors to `err`. Returns
// kExitEqual when every compared golden is bitwise equal, kExitMismatch when one is not, kExitError on
// a file error anywhere, including one golden's processing ending in any std::exception (the goldens
// after it still run and the JSON report stays complete), or when nothing was compared (no golden
// file, or every golden skipped as Unsupported: a verification that compared nothing must not pass),
// and kExitNoGpu when the backend finds no GPU.
int verify_goldens(const VerifyRequest& request, Backend* backend, std::ostream& out, std::ostream& err);

}  // namespace mok::verify
