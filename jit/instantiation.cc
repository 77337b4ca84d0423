#include "jit/instantiation.h"

#include "jit/dtype.h"

namespace kjit::jit {

TemplateArg::TemplateArg(DType t) : text_(DeviceTypeName(t)) {}
TemplateArg::TemplateArg(IndexType t) : text_(t == IndexType::kInt32 ? "int" : "long long") {}

std::string Instantiate(std::string_view kernel, const TemplateArgs& args) {
  std::string out(kernel);
  out += '<';
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) out += ", ";
    out += args[i].text();
  }
  out += '>';
  return out;
}

}  // namespace kjit::jit
