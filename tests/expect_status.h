// ExpectInvalid: the check every spec and argument test makes: InvalidArgument, with a message that
// starts by naming the bad field.
//
//   ExpectInvalid(ValidateCrossEntropySpec({.vocab = 0}), "vocab:");
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "jit/status_helpers.h"
#include "kjit/status.h"

namespace kjit::testing {

inline void ExpectInvalid(const absl::Status& s, const std::string& prefix) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(ToStd(s.message()).rfind(prefix, 0), 0u)
      << "expected the message to start with '" << prefix << "': " << s;
}

}  // namespace kjit::testing
