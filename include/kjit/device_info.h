// DeviceInfo: the facts about a GPU that kjit uses, as Runtime::device() reports them.
//
//   const kjit::DeviceInfo& d = rt.device();   // d.name == "NVIDIA H200", d.compute_capability()
//   == 90
#pragma once

#include <cstddef>
#include <string>

namespace kjit {

// The GPU a runtime launches on.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;  // "NVIDIA H200"
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  int max_shared_per_block_optin = 0;
  size_t total_memory = 0;
  int compute_capability() const { return cc_major * 10 + cc_minor; }
};

}  // namespace kjit
