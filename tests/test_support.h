// Shared by the CPU suites: the toolkit's stub libcuda, a scoped environment variable, listing a
// directory, and running the built `kjit` binary as a subprocess.
//
//   kjit::testing::ScopedEnv cache("KJIT_CACHE_DIR", dir.c_str());
//   kjit::testing::CliResult r = kjit::testing::RunKjit({"--version"}, {}, scratch_dir);
//   EXPECT_EQ(r.exit_code, 0) << r.Describe();
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#ifndef KJIT_STUB_LIBCUDA
#error "KJIT_STUB_LIBCUDA must name the toolkit's stubs/libcuda.so"
#endif

extern char** environ;

namespace kjit::testing {

inline bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Where the build found the toolkit, else where a runtime image keeps the stub (some toolkits have
// lib64/ only), so the suite also runs on a machine other than the one that built it.
inline std::string StubLibcuda() {
  for (const char* p : {KJIT_STUB_LIBCUDA, "/usr/local/cuda/lib64/stubs/libcuda.so"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return KJIT_STUB_LIBCUDA;
}

// Sets (or, with nullptr, unsets) a variable and restores it on destruction.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Names in `dir` starting with `prefix`, in no order; none when it cannot be read. Files may come
// and go meanwhile (other processes).
inline std::vector<std::string> NamesWithPrefix(const std::string& dir, std::string_view prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.starts_with(prefix)) out.push_back(name);
  }
  return out;
}

struct CliResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string out;
  std::string err;
  std::string all() const { return out + err; }
  // For failure messages.
  std::string Describe() const {
    return "exit " + std::to_string(exit_code) +
           (signal ? " signal " + std::to_string(signal) : "") + "\n--- stdout ---\n" + out +
           "--- stderr ---\n" + err;
  }
};

// Where a program's stdout goes: captured (CliResult::out), or somewhere every write fails.
enum class Stdout {
  kCaptured,
  kFull,        // /dev/full: ENOSPC
  kClosed,      // no file descriptor 1: EBADF
  kBrokenPipe,  // a pipe without a reader, SIGPIPE ignored (as Python's os.system runs it): EPIPE
};

// Runs `program` with `args`, stdin from /dev/null, stdout (unless `to` says otherwise) and stderr
// captured through files in `scratch_dir`. The environment is this process's with `env` applied
// (an empty value unsets).
inline CliResult RunProgram(const std::string& program, const std::vector<std::string>& args,
                            const std::map<std::string, std::string>& env,
                            const std::string& scratch_dir, Stdout to = Stdout::kCaptured) {
  const std::string out_path = scratch_dir + "/stdout", err_path = scratch_dir + "/stderr";
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (!env.count(kv.substr(0, kv.find('=')))) env_strings.push_back(kv);
  }
  for (const auto& [name, value] : env) {
    if (!value.empty()) env_strings.push_back(name + "=" + value);
  }
  std::vector<std::string> argv_strings = {program};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  CliResult r;
  int broken_pipe[2] = {-1, -1};
  if (to == Stdout::kBrokenPipe) {
    if (::pipe(broken_pipe) != 0) {
      r.err = std::string("pipe failed: ") + std::strerror(errno);
      return r;
    }
    ::close(broken_pipe[0]);  // no reader
  }
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    r.err = std::string("fork failed: ") + std::strerror(errno);
    if (broken_pipe[1] >= 0) ::close(broken_pipe[1]);
    return r;
  }
  if (pid == 0) {
    const int out = to == Stdout::kFull ? ::open("/dev/full", O_WRONLY)
                    : to == Stdout::kBrokenPipe
                        ? broken_pipe[1]
                        : ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int in = ::open("/dev/null", O_RDONLY);
    if (out < 0 || err < 0 || in < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    if (to == Stdout::kClosed) ::close(1);
    if (to == Stdout::kBrokenPipe) ::signal(SIGPIPE, SIG_IGN);  // kept across execve
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (broken_pipe[1] >= 0) ::close(broken_pipe[1]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  if (to == Stdout::kCaptured) r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  return r;
}

#ifdef KJIT_CLI_PATH
// The built kjit, run as RunProgram does.
inline CliResult RunKjit(const std::vector<std::string>& args,
                         const std::map<std::string, std::string>& env,
                         const std::string& scratch_dir, Stdout to = Stdout::kCaptured) {
  return RunProgram(KJIT_CLI_PATH, args, env, scratch_dir, to);
}
#endif

}  // namespace kjit::testing
