#include "tests/gpu/gpu_test_env.h"

#include <algorithm>
#include <cstring>

namespace kjit::testing {

const absl::StatusOr<Runtime>& GpuRuntime() {
  static const auto* rt = new absl::StatusOr<Runtime>(Runtime::Create());
  return *rt;
}

std::vector<unsigned char> IndexBytes(const std::vector<int64_t>& v, IndexType t) {
  std::vector<unsigned char> out(v.size() * SizeOf(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == IndexType::kInt32) {
      const int32_t x = static_cast<int32_t>(v[i]);
      std::memcpy(&out[i * 4], &x, 4);
    } else {
      std::memcpy(&out[i * 8], &v[i], 8);
    }
  }
  return out;
}

std::vector<double> IndexValues(const std::vector<unsigned char>& bytes, IndexType t) {
  std::vector<double> out(bytes.size() / SizeOf(t));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t == IndexType::kInt32) {
      int32_t x;
      std::memcpy(&x, &bytes[i * 4], 4);
      out[i] = x;
    } else {
      int64_t x;
      std::memcpy(&x, &bytes[i * 8], 8);
      out[i] = static_cast<double>(x);
    }
  }
  return out;
}

absl::StatusOr<DeviceBuffer> Upload(const Runtime& rt, const std::vector<unsigned char>& image,
                                    size_t bytes) {
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer b,
                        DeviceBuffer::Create(rt, std::max<size_t>({image.size(), bytes, 16})));
  KJIT_RETURN_IF_ERROR(b.Fill(0xFF));
  if (!image.empty()) KJIT_RETURN_IF_ERROR(b.Upload(image.data(), image.size()));
  return b;
}

absl::StatusOr<std::vector<unsigned char>> Download(const DeviceBuffer& b, size_t bytes) {
  std::vector<unsigned char> out(bytes);
  KJIT_RETURN_IF_ERROR(b.Download(out.data(), bytes));
  return out;
}

}  // namespace kjit::testing
