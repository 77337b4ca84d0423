// The device templates (templates/*.cuh), embedded at build time by cmake/EmbedTemplates.cmake.
//
//   const std::string* text = FindEmbeddedTemplate("rms_norm.cuh");
#pragma once

#include <string>
#include <vector>

namespace kjit::jit {

struct EmbeddedFile {
  std::string name;  // file name as the kernels #include it, e.g. "common.cuh"
  std::string text;
};

const std::vector<EmbeddedFile>& EmbeddedTemplates();

// nullptr when no template has that name.
inline const std::string* FindEmbeddedTemplate(const std::string& name) {
  for (const EmbeddedFile& f : EmbeddedTemplates()) {
    if (f.name == name) return &f.text;
  }
  return nullptr;
}

}  // namespace kjit::jit
