// Take: a string kjit returned through a char** out (kjit_build's JSON, kjit_op_spec's, a config),
// copied and freed with kjit_free, for the C API's tests.
//
//   EXPECT_EQ(kjit_op_spec(op, &json), KJIT_OK);
//   const std::string spec = kjit::Take(json);
#pragma once

#include <memory>
#include <string>

#include "kjit/kjit_c.h"

namespace kjit {

inline std::string Take(char* s) {
  std::unique_ptr<char, decltype(&kjit_free)> owned(s, kjit_free);
  return s != nullptr ? s : "";
}

}  // namespace kjit
