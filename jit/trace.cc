#include "jit/trace.h"

#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <nvtx3/nvToolsExt.h>

namespace kjit::jit {

namespace {

constexpr size_t kDefaultMaxEvents = 100000;

size_t MaxEventsFromEnv() {
  const char* v = std::getenv("KJIT_TRACE_MAX_EVENTS");
  if (v == nullptr || *v == '\0') return kDefaultMaxEvents;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*end != '\0' || n == 0) {
    fmt::print(stderr, "kjit: warning: KJIT_TRACE_MAX_EVENTS={} is not a positive integer; using {}\n",
               v, kDefaultMaxEvents);
    return kDefaultMaxEvents;
  }
  return static_cast<size_t>(n);
}

uint64_t ThreadId() { return static_cast<uint64_t>(pthread_self()) % 1000000; }

}  // namespace

Tracer& Tracer::Global() {
  static Tracer* tracer = [] {
    const char* path = std::getenv("KJIT_TRACE");
    const char* launches = std::getenv("KJIT_TRACE_LAUNCHES");
    auto* t = new Tracer(path != nullptr ? path : "",
                         launches != nullptr && std::string_view(launches) == "1", MaxEventsFromEnv());
    if (t->enabled()) {
      std::atexit([] {
        absl::Status s = Global().Flush();
        if (!s.ok()) fmt::print(stderr, "kjit: warning: {}\n", ToStd(s.message()));
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
  Add({std::string(name), std::string(category), 'X', start_us, dur_us, ThreadId(), std::move(args)});
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
                        {"ts", e.ts_us}, {"pid", pid}, {"tid", e.tid}, {"args", args}};
    if (e.phase == 'X') j["dur"] = e.dur_us;
    if (e.phase == 'i') j["s"] = "t";
    events.push_back(std::move(j));
  }
  const nlohmann::json doc = {
      {"traceEvents", events},
      {"displayTimeUnit", "ms"},
      {"otherData", {{"producer", "kjit"}, {"max_events", max_events_}, {"dropped_events", dropped_}}}};
  events_.clear();
  const std::string tmp = fmt::format("{}.tmp-{}", path_, pid);
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!out.good()) {
      std::remove(tmp.c_str());
      return absl::InternalError(fmt::format("KJIT_TRACE: cannot write {}", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(fmt::format("KJIT_TRACE: cannot write {}", path_));
  }
  return absl::OkStatus();
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
