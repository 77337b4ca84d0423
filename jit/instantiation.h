// Instantiate: the NVRTC name expression of one kernel template instantiation, rendered from typed
// arguments (jitify2's `Template("k").instantiate(Type<T>(), 4)`), so that no format string counts
// its `{}` by hand and a dtype, an index type or a bool is spelled one way in every op.
//
//   std::string e = jit::Instantiate("kjit::rms_norm_forward", DType::kBF16, DType::kBF16, 4096,
//                                    256, 1, 8, RmsNormCasting::kLlama, false);
//   // "kjit::rms_norm_forward<kjit::bf16, kjit::bf16, 4096, 256, 1, 8, 0, false>"
//
// Arguments the kernels of several instantiations share travel as one TemplateArgs, spliced where
// it stands:
//   const jit::TemplateArgs shape = {DType::kF32, IndexType::kInt64, 128256};
//   jit::Instantiate("kjit::cross_entropy_backward", shape, jit::TemplateArg::Name("kjit::Nop"));
#pragma once

#include <concepts>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kjit/dtype.h"
#include "kjit/tensor.h"

namespace kjit::jit {

// One template argument, as the kernel's source spells it.
class TemplateArg {
 public:
  TemplateArg(DType t);      // its device type: "float", "kjit::f16", "kjit::bf16"
  TemplateArg(IndexType t);  // "int", "long long"
  // Exactly a bool: "true" or "false" (a pointer or an integer does not convert).
  template <std::same_as<bool> B>
  TemplateArg(B b) : text_(b ? "true" : "false") {}
  template <std::integral I>
  requires(!std::same_as<I, bool>) TemplateArg(I value) : text_(std::to_string(value)) {}
  // An enum the kernel takes as an int (RmsNormCasting): its value. DType and IndexType take the
  // overloads above; an enum the kernel names (a reduction) goes through Name.
  template <typename E>
  requires std::is_enum_v<E> TemplateArg(E e)
      : TemplateArg(static_cast<std::underlying_type_t<E>>(e)) {}

  // A device-side name taken as it is written: "kjit::NoClassWeight", "kjit::kCeMean".
  static TemplateArg Name(std::string name) { return TemplateArg(std::move(name)); }

  const std::string& text() const { return text_; }

 private:
  explicit TemplateArg(std::string text) : text_(std::move(text)) {}
  std::string text_;
};

using TemplateArgs = std::vector<TemplateArg>;

// "kernel<arg, arg, ...>", the arguments in order.
std::string Instantiate(std::string_view kernel, const TemplateArgs& args);

// The same, each argument a TemplateArg (or what converts to one) or a TemplateArgs spliced in.
template <typename... Args>
std::string Instantiate(std::string_view kernel, const Args&... args) {
  TemplateArgs all;
  auto append = [&all](const auto& arg) {
    if constexpr (std::same_as<std::decay_t<decltype(arg)>, TemplateArgs>) {
      all.insert(all.end(), arg.begin(), arg.end());
    } else {
      all.push_back(TemplateArg(arg));
    }
  };
  (append(args), ...);
  return Instantiate(kernel, all);
}

}  // namespace kjit::jit
