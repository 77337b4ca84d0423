#include <algorithm>

#include "autotune/host_convert.h"
#include "tools/bench.h"

namespace kjit::tools {

absl::StatusOr<DeviceBuffer> UploadValues(const Runtime& rt, const std::vector<double>& values,
                                          DType dtype) {
  const std::vector<unsigned char> bytes = autotune::Encode(values, dtype);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(rt, bytes.size()));
  KJIT_RETURN_IF_ERROR(b.Upload(bytes.data(), bytes.size()));
  return b;
}

absl::StatusOr<std::vector<double>> DownloadValues(const DeviceBuffer& buffer, DType dtype,
                                                   size_t offset_bytes, size_t bytes) {
  bytes = std::min(bytes, buffer.size() - std::min(offset_bytes, buffer.size()));
  std::vector<unsigned char> raw(bytes);
  KJIT_RETURN_IF_ERROR(buffer.Download(raw.data(), raw.size(), offset_bytes));
  return autotune::Decode(raw, dtype);
}

nlohmann::json BenchEntry(const BenchCase& c, const autotune::Timing& t, double copy_gbps) {
  const double gbps = c.bytes / (t.median_us * 1e3);
  nlohmann::json e = {{"op", c.op},           {"pass", c.pass},
                      {"shape", c.shape},     {"dtype", Name(c.dtype)},
                      {"config", c.config},   {"heuristic", c.heuristic},
                      {"median_us", t.median_us}, {"p10_us", t.p10_us},
                      {"p90_us", t.p90_us},   {"repeats", t.repeats},
                      {"bytes", c.bytes},     {"gbps", gbps},
                      {"ratio_to_copy", gbps / copy_gbps}, {"checked", true}};
  e.update(c.extra);
  return e;
}

}  // namespace kjit::tools
