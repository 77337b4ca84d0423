#include "jit/trace.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <string_view>

#include <fmt/format.h>
#include <nvtx3/nvToolsExt.h>
#include <nlohmann/json.hpp>

#include "jit/file_io.h"
#include "jit/json_text.h"
#include "jit/status_helpers.h"
#include "jit/warnings.h"

namespace kjit::jit {

namespace {

constexpr size_t kDefaultMaxEvents = 100000;
// How long a process waits for the others sharing its trace file to write theirs.
constexpr std::chrono::seconds kMergeLockTimeout{30};

size_t MaxEventsFromEnv() {
  const char* v = std::getenv("KJIT_TRACE_MAX_EVENTS");
  if (v == nullptr || *v == '\0') return kDefaultMaxEvents;
  // from_chars, not strtoull: that one takes "-1" as 2^64-1, and leading blanks or '+'.
  const std::string_view text = v;
  size_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n == 0) {
    WarnOnceToStderr(fmt::format("KJIT_TRACE_MAX_EVENTS={} is not a positive integer; using {}", v,
                                 kDefaultMaxEvents));
    return kDefaultMaxEvents;
  }
  return n;
}

uint64_t ThreadId() { return static_cast<uint64_t>(pthread_self()) % 1000000; }

// Blocks SIGPIPE on this thread while alive, and discards the one its writes raised: a reader that
// quits early must cost the trace, not the traced program (SIGPIPE's default action ends it, and
// the trace is written at exit, where a killed process loses its exit status).
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    // One already pending is someone else's, left for them.
    was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe_, &old_) == 0;
  }
  ~SigpipeBlocked() {
    if (!blocked_) return;
    if (!was_pending_) {
      const timespec now{};
      while (sigtimedwait(&pipe_, nullptr, &now) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false, blocked_ = false;
};

// Writes into a FIFO or a character device named as the trace (a FIFO that a viewer reads,
// `--trace /dev/null`): renaming a file over it would replace it, and its reader would get nothing.
absl::Status WriteInPlace(const std::string& path, bool fifo, std::string_view text) {
  // O_NONBLOCK: opening a FIFO that nobody reads would wait for a reader forever, at exit.
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd.get() < 0 && errno == ENXIO && fifo) {
    return absl::FailedPreconditionError(fmt::format(
        "{} is a FIFO with no reader, so the trace was not written; start its reader first", path));
  }
  if (fd.get() < 0) return ErrnoStatus(errno, fmt::format("cannot open {}", path));
  // Blocking writes from here on: a reader slower than us is waited for, not cut off.
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return ErrnoStatus(errno, fmt::format("cannot write {}", path));
  }
  SigpipeBlocked no_sigpipe;
  if (int err = WriteAll(fd.get(), text)) {
    return ErrnoStatus(err, fmt::format("cannot write {}", path));
  }
  if (fd.Close() != 0) return ErrnoStatus(errno, fmt::format("cannot write {}", path));
  return absl::OkStatus();
}

// The most of an existing trace file that is read to merge it (a larger one is replaced).
constexpr size_t kMaxMergedBytes = size_t{1} << 30;

// `doc` with the events of the kjit trace already in the regular file at `path` (open as `fd`)
// put first, its dropped events counted in; a file that is not a kjit trace (another program's,
// or empty: a writer that died) adds nothing and is replaced.
void MergeExisting(int fd, nlohmann::json& doc) {
  std::string text;
  if (ReadAll(fd, text, kMaxMergedBytes) != 0 || text.size() > kMaxMergedBytes) return;
  nlohmann::json old = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!old.is_object() || !old.contains("traceEvents") || !old["traceEvents"].is_array() ||
      !old.contains("otherData") || !old["otherData"].is_object() ||
      old["otherData"].value("producer", "") != "kjit") {
    return;
  }
  nlohmann::json& events = old["traceEvents"];
  for (nlohmann::json& e : doc["traceEvents"]) events.push_back(std::move(e));
  doc["traceEvents"] = std::move(events);
  const nlohmann::json& dropped = old["otherData"]["dropped_events"];
  if (dropped.is_number_unsigned()) {
    doc["otherData"]["dropped_events"] =
        doc["otherData"]["dropped_events"].get<uint64_t>() + dropped.get<uint64_t>();
  }
}

// A regular file (or a new one) gets the events of every process that writes it: under an flock
// on the file itself (LockFile retakes it when a writer has renamed a new file over the one
// locked), what is there is read, merged and replaced through a temporary and a rename.
absl::Status MergeIntoFile(const std::string& path, nlohmann::json doc) {
  struct stat st {};
  std::optional<FileLock> lock;
  if (::lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) {  // not through a symlink
    // Created here (as any file a program creates) so that a path that cannot be written is said
    // so, rather than as a lock LockFile could not open.
    if (UniqueFd created(::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666));
        created.get() < 0) {
      return ErrnoStatus(errno, fmt::format("cannot write {}", path));
    }
    KJIT_ASSIGN_OR_RETURN(FileLock held, LockFile(path, kMergeLockTimeout));
    lock.emplace(std::move(held));
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() >= 0) MergeExisting(fd.get(), doc);
  }
  // 0666 less the umask, as any file a program creates.
  return WriteFileAtomically(path, JsonText(doc) + "\n", 0666);
}

absl::Status WriteTrace(const std::string& path, nlohmann::json doc) {
  // stat, not lstat: through a link to a device (/dev/stdout to a pipe) is still into the device.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) {
    return MergeIntoFile(path, std::move(doc));
  }
  if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
    return WriteInPlace(path, S_ISFIFO(st.st_mode), JsonText(doc) + "\n");
  }
  // A directory, a socket (open cannot write one) or a block device (a disk).
  return absl::FailedPreconditionError(fmt::format(
      "{} is not a regular file, a FIFO or a character device; name a file to write", path));
}

}  // namespace

Tracer& Tracer::Global() {
  static Tracer* tracer = [] {
    const char* path = std::getenv("KJIT_TRACE");
    const char* launches = std::getenv("KJIT_TRACE_LAUNCHES");
    auto* t =
        new Tracer(path != nullptr ? path : "",
                   launches != nullptr && std::string_view(launches) == "1", MaxEventsFromEnv());
    if (t->enabled()) {
      std::atexit([] {
        absl::Status s = Global().Flush();
        if (!s.ok()) WarnOnceToStderr(ToStd(s.message()));
      });
    }
    return t;
  }();
  return *tracer;
}

Tracer::Tracer(std::string path, bool launches, size_t max_events)
    : path_(std::move(path)), launches_(launches), max_events_(max_events) {}

int64_t Tracer::NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Tracer::Add(Event e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (flushed_ || events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(e));
}

void Tracer::Complete(std::string_view name, std::string_view category, int64_t start_us,
                      int64_t dur_us, TraceArgs args) {
  if (!enabled()) return;
  Add({std::string(name), std::string(category), 'X', start_us, dur_us, ThreadId(),
       std::move(args)});
}

void Tracer::Instant(std::string_view name, std::string_view category, TraceArgs args) {
  if (!enabled()) return;
  Add({std::string(name), std::string(category), 'i', NowUs(), 0, ThreadId(), std::move(args)});
}

absl::Status Tracer::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled() || flushed_) return absl::OkStatus();
  flushed_ = true;
  nlohmann::json events = nlohmann::json::array();
  const int pid = static_cast<int>(::getpid());
  for (const Event& e : events_) {
    nlohmann::json args = nlohmann::json::object();
    for (const auto& [k, v] : e.args) args[k] = v;
    nlohmann::json j = {{"name", e.name}, {"cat", e.category}, {"ph", std::string(1, e.phase)},
                        {"ts", e.ts_us},  {"pid", pid},        {"tid", e.tid},
                        {"args", args}};
    if (e.phase == 'X') j["dur"] = e.dur_us;
    if (e.phase == 'i') j["s"] = "t";
    events.push_back(std::move(j));
  }
  const nlohmann::json doc = {
      {"traceEvents", events},
      {"displayTimeUnit", "ms"},
      {"otherData",
       {{"producer", "kjit"}, {"max_events", max_events_}, {"dropped_events", dropped_}}}};
  events_.clear();
  return Annotate(WriteTrace(path_, doc), "KJIT_TRACE");
}

void StartTraceFile(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) ::unlink(path.c_str());
  ::setenv("KJIT_TRACE", path.c_str(), 1);
}

namespace {
nvtxDomainHandle_t KjitDomain() {
  static nvtxDomainHandle_t domain = nvtxDomainCreateA("kjit");
  return domain;
}
}  // namespace

NvtxRange::NvtxRange(const std::string& name) {
  nvtxEventAttributes_t attr{};
  attr.version = NVTX_VERSION;
  attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attr.message.ascii = name.c_str();
  nvtxDomainRangePushEx(KjitDomain(), &attr);
}

NvtxRange::~NvtxRange() { nvtxDomainRangePop(KjitDomain()); }

TraceSpan::TraceSpan(std::string_view name, std::string_view category, TraceArgs args)
    : tracer_(Tracer::Global()), name_(name), nvtx_(name_) {
  if (!tracer_.enabled()) return;
  category_ = category;
  args_ = std::move(args);
  start_us_ = Tracer::NowUs();
}

TraceSpan::~TraceSpan() {
  if (!tracer_.enabled()) return;
  tracer_.Complete(name_, category_, start_us_, Tracer::NowUs() - start_us_, std::move(args_));
}

void TraceSpan::AddArg(std::string key, std::string value) {
  if (tracer_.enabled()) args_.emplace_back(std::move(key), std::move(value));
}

}  // namespace kjit::jit
