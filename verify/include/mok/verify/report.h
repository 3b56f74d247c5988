// mok-verify's reports: a text table for people, JSON for machines (docs/golden-format.md).
#pragma once

#include <string>
#include <vector>

#include "mok/verify/compare.h"

namespace mok::verify {

// One line per tensor, then the first mismatch and ULP histogram of every differing tensor; for a
// forward-only run, the reason its backward was skipped and the gradient tensors not compared.
std::string format_text(const CaseReport& report);

// The whole run: every case compared, every error that stopped one (a file that did not read), and
// every golden the backend skipped (Unsupported: its reason). A case of a forward-only run has
// "backward_skipped" (its reason; null otherwise) and "skipped_tensors" (the gradients not compared).
std::string format_json(const std::vector<CaseReport>& cases, const std::vector<std::string>& errors,
                        const std::vector<std::string>& skipped = {});

}  // namespace mok::verify
