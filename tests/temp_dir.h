// TempDir: a fresh directory under $TMPDIR (else /tmp) for one test, removed with everything in it
// when the test ends, even where the test took the owner's permissions away (read-only cache
// tests do).
//
//   class CacheTest : public ::testing::Test {
//     kjit::testing::TempDir tmp_{"kjit_cache_test"};   // /tmp/kjit_cache_test_XXXXXX
//   };
//   ASSERT_TRUE(tmp_.ok());  std::string cache = tmp_.path() + "/cache";
#pragma once

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

namespace kjit::testing {

class TempDir {
 public:
  explicit TempDir(std::string_view prefix) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" +
                          std::string(prefix) + "_XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) {
      path_ = pattern;
    } else {
      ADD_FAILURE() << "mkdtemp " << pattern << ": " << std::strerror(errno);
    }
  }
  ~TempDir() {
    if (path_.empty()) return;
    namespace fs = std::filesystem;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(path_, ec); !ec && it != fs::end(it);
         it.increment(ec)) {
      if (it->is_directory(ec))
        fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
    }
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace kjit::testing
