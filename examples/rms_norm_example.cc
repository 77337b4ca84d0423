// The smallest complete use of kjit: normalize a batch of bf16 rows on the GPU with RMSNorm.
//
//   ./rms_norm_example            # needs a GPU; prints the first outputs and a CPU check
#include <cmath>
#include <cstdio>
#include <vector>

#include <kjit/kjit.h>

int main() {
  constexpr int64_t kRows = 8, kHidden = 4096;
  auto rt = kjit::Runtime::Create();
  if (!rt.ok()) {
    std::fprintf(stderr, "%s\n", std::string(rt.status().message()).c_str());
    return 1;
  }
  auto norm = rt->RmsNorm({.hidden = kHidden, .dtype = kjit::DType::kBF16, .eps = 1e-5f});
  if (!norm.ok()) {
    std::fprintf(stderr, "%s\n", std::string(norm.status().message()).c_str());
    return 1;
  }
  std::vector<double> x(kRows * kHidden), w(kHidden, 1.0);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = kjit::RoundTo(std::sin(0.01 * i), kjit::DType::kBF16);
  const auto x_bytes = kjit::Encode(x, kjit::DType::kBF16);
  const auto w_bytes = kjit::Encode(w, kjit::DType::kBF16);
  auto dx = kjit::DeviceBuffer::Create(*rt, x_bytes.size());
  auto dw = kjit::DeviceBuffer::Create(*rt, w_bytes.size());
  auto dy = kjit::DeviceBuffer::Create(*rt, x_bytes.size());
  if (!dx.ok() || !dw.ok() || !dy.ok()) return 1;
  if (!dx->Upload(x_bytes.data(), x_bytes.size()).ok() ||
      !dw->Upload(w_bytes.data(), w_bytes.size()).ok())
    return 1;

  absl::Status s = norm->Forward(
      /*stream=*/nullptr,
      {.x = kjit::TensorView::Matrix(dx->data(), kjit::DType::kBF16, kRows, kHidden),
       .weight = kjit::TensorView::Vector(dw->data(), kjit::DType::kBF16, kHidden),
       .y = kjit::TensorView::Matrix(dy->data(), kjit::DType::kBF16, kRows, kHidden)});
  std::vector<unsigned char> y_bytes(x_bytes.size());
  if (!s.ok() || !dy->Download(y_bytes.data(), y_bytes.size()).ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  const auto y = kjit::Decode(y_bytes, kjit::DType::kBF16);
  double sumsq = 0;
  for (int64_t c = 0; c < kHidden; ++c) sumsq += x[c] * x[c];
  const double expect = x[1] / std::sqrt(sumsq / kHidden + 1e-5);
  std::printf("y[0][1] = %.5f (CPU: %.5f)\n", y[1], expect);
  return std::fabs(y[1] - expect) <= 1e-2 * std::fabs(expect) + 1e-3 ? 0 : 1;
}
