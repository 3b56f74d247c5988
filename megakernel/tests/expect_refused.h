// The megakernel's tests' check of a refusal: the Error must name the rule, not just be thrown (another
// rule refusing the same call would pass an EXPECT_THROW).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "mok/core/config.h"

namespace mok::gpu {

// `call` is refused: it throws an Error whose message names `what`.
inline void expect_refused(const std::function<void()>& call, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

}  // namespace mok::gpu
