// python/kjit/model_families.json, the table of model families (by Hugging Face model_type) that
// kjit-tune --config and the Python package's apply_to both read, embedded into the build
// (autotune/CMakeLists.txt) so that an installed kjit-tune needs no source tree.
#pragma once

#include <string_view>

namespace kjit::autotune {

// The file's text as it was when the build was configured.
std::string_view ModelFamiliesJson();

}  // namespace kjit::autotune
