#include "autotune/worker_pool.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <boost/process.hpp>
#include <nlohmann/json.hpp>

#include "jit/file_io.h"
#include "jit/status_helpers.h"

namespace kjit::autotune {

namespace {

namespace bp = boost::process;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr auto kPoll = std::chrono::milliseconds(5);
constexpr std::streamoff kLogTail = 4096;
// A pool's directory in TMPDIR is "kjit-workers-XXXXXX", holding "owner.lock", flocked by the pool
// for its whole life: the kernel drops the lock when the process dies, even by SIGKILL, so a
// directory whose lock anyone can take is a leftover. Without the lock file (a kjit before it, or
// one killed between mkdtemp and taking it) age decides.
constexpr std::string_view kDirPrefix = "kjit-workers-";
constexpr const char* kOwnerLock = "owner.lock";
constexpr auto kUnlockedStaleAge = std::chrono::hours(1);

// Removes the worker directories in `tmp` that killed runs of this user left behind. Only real
// directories (not symlinks) owned by this user, named as ours; nothing inside is followed.
void RemoveStaleDirs(const std::string& tmp) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(tmp, ec)) {
    const std::string name = e.path().filename().string();
    if (!std::string_view(name).starts_with(kDirPrefix)) continue;
    const std::string path = e.path().string();
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
      continue;
    }
    // Held while removing, so that two new pools do not both work on it. Unavailable: its pool
    // is alive.
    const absl::StatusOr<jit::FileLock> lock = jit::TryLockExistingFile(path + "/" + kOwnerLock);
    if (!lock.ok() && (!absl::IsNotFound(lock.status()) ||
                       std::chrono::system_clock::now() -
                               std::chrono::system_clock::from_time_t(st.st_mtim.tv_sec) <
                           kUnlockedStaleAge)) {
      continue;
    }
    (void)jit::RemoveTree(path);  // best effort: a leftover must not stop this run
  }
}

std::string Tail(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size <= 0) return "";
  in.seekg(std::max<std::streamoff>(0, size - kLogTail));
  std::string s(static_cast<size_t>(std::min(size, kLogTail)), '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  return s;
}

std::string ExitDescription(int status) {
  if (WIFSIGNALED(status)) {
    return fmt::format("crashed: signal {} ({})", WTERMSIG(status), ::strsignal(WTERMSIG(status)));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    return fmt::format("worker exited with status {} before answering", WEXITSTATUS(status));
  }
  return "worker exited before answering";
}

// One child process and the batch of tasks it was given. Its stdout goes to a file the parent
// reads as it grows: no pipe to fill up or to leak into other children.
struct Worker {
  std::vector<size_t> batch;      // task indices; position i is the worker's task i
  std::vector<bool> finished;     // per position: answered or failed
  std::optional<size_t> current;  // position begun and not ended
  fs::path out_path, err_path;
  std::ifstream out;
  std::string partial;  // an incomplete last line
  Clock::time_point last_heard;
  std::unique_ptr<bp::child> child;
};

class Pool {
 public:
  Pool(const std::vector<std::string>& tasks, const WorkerPoolOptions& o)
      : tasks_(tasks), o_(o), outcomes_(tasks.size()) {
    for (size_t i = 0; i < tasks.size(); ++i) pending_.push_back(i);
  }
  ~Pool() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  std::vector<TaskOutcome> Run() {
    // Requests, answers and logs of the workers.
    const char* env = std::getenv("TMPDIR");
    const std::string tmp = env && *env ? env : "/tmp";
    RemoveStaleDirs(tmp);
    std::string pattern = fmt::format("{}/{}XXXXXX", tmp, kDirPrefix);
    if (::mkdtemp(pattern.data()) == nullptr) {
      const std::string why = fmt::format("could not create {}: {}", pattern, std::strerror(errno));
      for (size_t i = 0; i < tasks_.size(); ++i) Finish(i, {.failure = why});
      return std::move(outcomes_);
    }
    dir_ = pattern;
    TakeOwnerLock();
    while (!pending_.empty() || !workers_.empty()) {
      while (static_cast<int>(workers_.size()) < std::max(1, o_.jobs) && !pending_.empty()) Start();
      std::this_thread::sleep_for(kPoll);
      for (auto it = workers_.begin(); it != workers_.end();) {
        it = Service(**it) ? workers_.erase(it) : std::next(it);
      }
    }
    return std::move(outcomes_);
  }

 private:
  void Start() {
    auto w = std::make_unique<Worker>();
    while (w->batch.size() < static_cast<size_t>(std::max(1, o_.batch)) && !pending_.empty()) {
      w->batch.push_back(pending_.front());
      pending_.pop_front();
    }
    w->finished.assign(w->batch.size(), false);
    const int id = started_++;
    const fs::path in_path = dir_ / fmt::format("request-{}.json", id);
    w->out_path = dir_ / fmt::format("answers-{}.jsonl", id);
    w->err_path = dir_ / fmt::format("stderr-{}.log", id);
    nlohmann::json request = {{"tasks", nlohmann::json::array()}};
    for (size_t i : w->batch) {
      request["tasks"].push_back(
          nlohmann::json::parse(tasks_[i], nullptr, /*allow_exceptions=*/false));
    }
    if (absl::Status written = jit::WriteFileAtomically(in_path, request.dump() + "\n", 0600);
        !written.ok()) {
      for (size_t i : w->batch) {
        Finish(i, {.failure = fmt::format("could not write the worker's request: {}",
                                          ToStd(written.message()))});
      }
      return;
    }
    w->last_heard = Clock::now();
    try {
      std::vector<std::string> args(o_.command.begin() + 1, o_.command.end());
      w->child = std::make_unique<bp::child>(
          bp::exe = o_.command.at(0), bp::args = args,
          bp::std_in<in_path.string(), bp::std_out> w->out_path.string(),
          bp::std_err > w->err_path.string());
    } catch (const std::exception& e) {
      for (size_t i : w->batch) {
        Finish(i, {.failure = fmt::format("could not start the worker {}: {}", o_.command.at(0),
                                          e.what())});
      }
      return;
    }
    w->out.open(w->out_path, std::ios::binary);
    workers_.push_back(std::move(w));
  }

  // Locked before it gets its name, so that no RemoveStaleDirs of another pool ever finds the
  // lock file free while this pool lives. Best effort: without it the age rule applies.
  void TakeOwnerLock() {
    if (absl::StatusOr<jit::FileLock> lock = jit::CreateLockedFile((dir_ / kOwnerLock).string());
        lock.ok()) {
      owner_lock_ = std::move(*lock);
    }
  }

  void Finish(size_t task, TaskOutcome outcome) {
    outcomes_[task] = std::move(outcome);
    if (o_.on_done) o_.on_done(task, outcomes_[task]);
  }

  // Reads the lines the worker has written since last time.
  void ReadAnswers(Worker& w) {
    if (!w.out.is_open()) w.out.open(w.out_path, std::ios::binary);
    w.out.clear();
    char buf[4096];
    while (w.out.read(buf, sizeof buf) || w.out.gcount() > 0) {
      w.partial.append(buf, static_cast<size_t>(w.out.gcount()));
    }
    size_t start = 0;
    for (size_t nl; (nl = w.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      Answer(w, std::string_view(w.partial).substr(start, nl - start));
    }
    w.partial.erase(0, start);
  }

  void Answer(Worker& w, std::string_view line) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return;
    auto position = [&](const char* field) -> std::optional<size_t> {
      auto it = j.find(field);
      if (it == j.end() || !it->is_number_unsigned() || it->get<size_t>() >= w.batch.size()) {
        return std::nullopt;
      }
      return it->get<size_t>();
    };
    if (auto p = position("begin")) {
      w.current = *p;
      w.last_heard = Clock::now();
    } else if (auto e = position("end"); e && !w.finished[*e]) {
      w.finished[*e] = true;
      if (w.current == e) w.current.reset();
      w.last_heard = Clock::now();
      Finish(w.batch[*e], {.answered = true, .result = j.value("result", nlohmann::json()).dump()});
    }
  }

  // Fails the task the worker was on and requeues the others. A worker that dies between tasks
  // (after a GPU fault it reported, say) fails none; one that dies before answering anything fails
  // its first task, so that a worker that cannot start is not restarted forever.
  void Abandon(Worker& w, const std::string& why) {
    std::optional<size_t> blamed = w.current;
    const bool answered_any =
        std::find(w.finished.begin(), w.finished.end(), true) != w.finished.end();
    for (size_t p = 0; !blamed && !answered_any && p < w.batch.size(); ++p) {
      if (!w.finished[p]) blamed = p;
    }
    const std::string log = Tail(w.err_path);
    for (size_t p = w.batch.size(); p-- > 0;) {
      if (w.finished[p]) continue;
      if (p == blamed) {
        Finish(w.batch[p], {.failure = why, .log = log});
      } else {
        pending_.push_front(w.batch[p]);
      }
    }
  }

  // True when the worker is gone.
  bool Service(Worker& w) {
    ReadAnswers(w);
    std::error_code ec;
    if (!w.child->running(ec)) {
      ReadAnswers(w);  // lines written just before it exited
      if (std::find(w.finished.begin(), w.finished.end(), false) != w.finished.end()) {
        Abandon(w, ExitDescription(w.child->native_exit_code()));
      }
      return true;
    }
    if (Clock::now() - w.last_heard > o_.task_timeout) {
      w.child->terminate(ec);
      w.child->wait(ec);
      ReadAnswers(w);
      Abandon(w, fmt::format("hung: no answer in {:.0f} s, killed",
                             std::chrono::duration<double>(o_.task_timeout).count()));
      return true;
    }
    return false;
  }

  const std::vector<std::string>& tasks_;
  const WorkerPoolOptions& o_;
  std::vector<TaskOutcome> outcomes_;
  std::deque<size_t> pending_;
  std::vector<std::unique_ptr<Worker>> workers_;
  fs::path dir_;
  std::optional<jit::FileLock> owner_lock_;  // dir_/owner.lock, flocked while the pool lives
  int started_ = 0;
};

}  // namespace

std::vector<TaskOutcome> RunInWorkers(const std::vector<std::string>& tasks,
                                      const WorkerPoolOptions& options) {
  if (tasks.empty()) return {};
  return Pool(tasks, options).Run();
}

}  // namespace kjit::autotune
