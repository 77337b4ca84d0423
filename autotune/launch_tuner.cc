#include "autotune/launch_tuner.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "jit/printable.h"

namespace kjit::autotune {
namespace {

// $KJIT_TUNE_BIN, else the first kjit-tune on PATH; "" when there is none.
std::string TuneBinary() {
  if (const char* bin = std::getenv("KJIT_TUNE_BIN"); bin != nullptr && *bin != '\0') return bin;
  const char* path = std::getenv("PATH");
  for (std::string_view rest = path ? path : ""; !rest.empty();) {
    const std::string_view dir = rest.substr(0, rest.find(':'));
    rest.remove_prefix(std::min(rest.size(), dir.size() + 1));
    const std::string candidate = fmt::format("{}/kjit-tune", dir.empty() ? "." : dir);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// How long a tuning may take: $KJIT_AUTOTUNE_TIMEOUT seconds, else 15 minutes (a model's whole
// preset takes about one on an H200).
absl::StatusOr<int> TimeoutSeconds() {
  const char* env = std::getenv("KJIT_AUTOTUNE_TIMEOUT");
  if (env == nullptr || *env == '\0') return 900;
  const std::string_view text(env);
  int seconds = 0;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (err != std::errc() || end != text.data() + text.size() || seconds < 1 || seconds > 86400) {
    return absl::InvalidArgumentError(fmt::format(
        "KJIT_AUTOTUNE_TIMEOUT: {} is not a number of seconds from 1 to 86400", jit::Quoted(text)));
  }
  return seconds;
}

// Waits for pid for at most `seconds`, then kills it and every process of its group (pid leads
// one, RunChild's): its wait status, or nullopt when killed.
std::optional<int> WaitAtMost(pid_t pid, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) return status;
    ::usleep(20000);
  }
  // The group, not pid alone: kjit-tune's workers (its children) would go on holding the GPU. The
  // leader is not reaped yet, so the group's id cannot have been reused.
  ::kill(-pid, SIGKILL);
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return std::nullopt;
}

// Runs argv in a process group of its own, with stdout discarded (the JSON report) and stderr
// shared (its progress), and waits at most `seconds`: its exit status (128 + the signal that ended
// it), the error that kept it from starting, or DeadlineExceeded.
absl::StatusOr<int> RunChild(const std::vector<std::string>& args, int seconds) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);  // a new group, led by the child
  pid_t pid = 0;
  const int err = ::posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    return absl::InternalError(fmt::format("{} could not start: {}", args[0], std::strerror(err)));
  }
  const std::optional<int> status = WaitAtMost(pid, seconds);
  if (!status) {
    return absl::DeadlineExceededError(fmt::format(
        "{} did not finish within {} s (KJIT_AUTOTUNE_TIMEOUT); it was stopped", args[0], seconds));
  }
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
}

}  // namespace

absl::Status ChildProcessTuner::Tune(const TuneRequest& request) {
  const std::string bin = TuneBinary();
  if (bin.empty()) {
    return absl::NotFoundError(
        "KJIT_AUTOTUNE is set but kjit-tune is not on PATH (or in KJIT_TUNE_BIN)");
  }
  KJIT_ASSIGN_OR_RETURN(const int seconds, TimeoutSeconds());
  request.warnings(
      fmt::format("tuning {} at {} rows with {} (KJIT_AUTOTUNE); the launch waits for it",
                  request.spec_json, request.rows, bin));
  const absl::StatusOr<int> status =
      RunChild({bin, "--spec", request.spec_json, "--tokens", std::to_string(request.rows), "--db",
                request.tuning_db, "--device", std::to_string(request.device)},
               seconds);
  if (!status.ok()) return status.status();
  if (*status != 0)
    return absl::InternalError(fmt::format("{} exited with status {}", bin, *status));
  return absl::OkStatus();
}

}  // namespace kjit::autotune

extern "C" {
int kjit_launch_tuner_installed = [] {
  kjit::SetDefaultTuner(std::make_shared<kjit::autotune::ChildProcessTuner>());
  return 1;
}();
}
