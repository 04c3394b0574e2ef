/*!
 * \file threading.cc
 * \brief Thread knob, OpenMP thread scopes and the admission gate (see threading.h).
 */
#include "threading.h"

#include <dlfcn.h>
#include <sched.h>
#include <sys/resource.h>
#include <tvm/ffi/error.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace byoc_hetero {

namespace {

// libgomp is loaded with libdnnl; look its entry points up instead of linking it (the wheel's
// oneDNN decides which OpenMP runtime the process uses).
using GetIntFn = int (*)();
using SetIntFn = void (*)(int);

struct Omp {
  GetIntFn get_max_threads = nullptr;
  SetIntFn set_num_threads = nullptr;
  Omp() {
    get_max_threads = reinterpret_cast<GetIntFn>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    set_num_threads = reinterpret_cast<SetIntFn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    if (get_max_threads == nullptr || set_num_threads == nullptr) {
      get_max_threads = nullptr;
      set_num_threads = nullptr;
    }
  }
};

const Omp& GetOmp() {
  static Omp omp;
  return omp;
}

int ParsePositive(const char* text) {
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);  // OMP_NUM_THREADS may be a list "4,2": take the first
  if (end == text || v < 1) return 0;
  return static_cast<int>(std::min<long>(v, 4096));
}

int DefaultThreads() {
  if (int n = ParsePositive(std::getenv("BYOC_HETERO_NUM_THREADS"))) return n;
  if (int n = ParsePositive(std::getenv("OMP_NUM_THREADS"))) return n;
  return AvailableCpus();
}

std::atomic<int>& ThreadsSetting() {
  static std::atomic<int> threads{DefaultThreads()};
  return threads;
}

struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  int active_threads = 0;
  int active_calls = 0;
  ConcurrencyStats stats;
};

Gate& GetGate() {
  static Gate gate;
  return gate;
}

// ---- adaptation to contention (threading.h) ------------------------------------------------------

// After a drop, the first try of a larger count comes 100 ms later; each failed try doubles the
// wait up to 2 s.  Under a twin a try costs one slow call (the 2-thread call meets the twin's
// thread on its core), so at most one call in 2 s pays it; when the other process stops, the
// module is back to its full count within 2 s.
constexpr int64_t kFirstProbeNs = 100'000'000;
constexpr int64_t kMaxProbeNs = 2'000'000'000;
// A watched call is contended when the kernel preempted one of the process's threads during it
// (involuntary context switches) and the process got less than this share of threads x wall
// CPU time.  Alone, oneDNN's threads work or spin through a call: close to 100% (a quiet-ish
// ResNet-18 call at 2 threads: 10 ms of CPU in 5.7 ms, 88%); with a twin or a busy loop on 2 cores
// they got 10-30% (bench/CONTENTION.md, "before" rows: cpu / (2 x median)).  The preemption condition
// keeps a passive OpenMP wait policy (threads sleeping at barriers, below 100% without any
// contention) from reading as contention.
constexpr double kContendedShare = 0.75;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Usage {
  int64_t cpu_us = 0;
  int64_t nivcsw = 0;
};

Usage ProcessUsage() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return {};
  auto us = [](const timeval& t) { return static_cast<int64_t>(t.tv_sec) * 1000000 + t.tv_usec; };
  return {us(ru.ru_utime) + us(ru.ru_stime), static_cast<int64_t>(ru.ru_nivcsw)};
}

/*! \brief Levels that still halve module_threads: 2 -> 1, 4 -> 2, 16 -> 4. */
int MaxLevel(int module_threads) {
  int level = 0;
  while ((module_threads >> level) > 1) ++level;
  return level;
}

ThreadAdaptation DefaultAdaptation() {
  const char* env = std::getenv("BYOC_HETERO_ADAPT_THREADS");
  if (env == nullptr || *env == '\0') return ThreadAdaptation::kAuto;
  return ParseThreadAdaptation(env);
}

/*!
 * \brief Idle time of the CPUs this process may use, from /proc/stat (USER_HZ ticks), summed;
 *        -1 when unreadable.
 */
int64_t IdleTicksOfOurCpus() {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0) return -1;
  struct Close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Close> f(std::fopen("/proc/stat", "r"));
  if (!f) return -1;
  int64_t idle = 0;
  char line[512];
  while (std::fgets(line, sizeof(line), f.get()) != nullptr) {
    if (std::strncmp(line, "cpu", 3) != 0) break;  // the cpu lines come first
    int cpu = -1;
    long long user, nice, system, idle_ticks, iowait;
    if (std::sscanf(line, "cpu%d %lld %lld %lld %lld %lld", &cpu, &user, &nice, &system, &idle_ticks,
                    &iowait) == 6 &&
        cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &mine)) {
      idle += idle_ticks + iowait;
    }
  }
  return idle;
}

struct Adaptation {
  std::atomic<ThreadAdaptation> mode{DefaultAdaptation()};
  std::atomic<int> level{0};
  std::atomic<int64_t> next_probe_ns{0};
  std::atomic<int64_t> probe_interval_ns{kFirstProbeNs};
  std::atomic<int64_t> watched{0}, contended{0}, reduced{0}, probes{0};
  // While reduced: the idle ticks of our CPUs at idle_since_ns, and tries made early because
  // CPUs were idle that failed in a row.
  std::atomic<int64_t> idle_since_ns{0}, idle_ticks{-1}, early_failures{0};
};

// While reduced, every 50 ms or more a call reads /proc/stat (about 10 us): when our CPUs were
// idle for at least half a CPU per thread we gave up, the other process has probably stopped and
// the next call tries more threads at once instead of after the backoff.  A try made so that fails
// counts; after two such in a row only the backoff tries again (CPUs that look idle but are not
// ours to take, e.g. under a CPU quota).
constexpr int64_t kIdleWindowNs = 50'000'000;
constexpr int64_t kMaxEarlyFailures = 2;

/*! \brief Whether our CPUs had `cpus` idle CPUs' worth of time since the last look. */
bool CpusWereIdle(Adaptation& a, int64_t now, double cpus) {
  int64_t since = a.idle_since_ns.load();
  if (now - since < kIdleWindowNs || !a.idle_since_ns.compare_exchange_strong(since, now)) return false;
  const int64_t ticks = IdleTicksOfOurCpus();
  const int64_t before = a.idle_ticks.exchange(ticks);
  if (ticks < 0 || before < 0 || since == 0) return false;
  static const double kTicksPerSecond = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double idle_cpus = static_cast<double>(ticks - before) / kTicksPerSecond /
                           (static_cast<double>(now - since) * 1e-9);
  return idle_cpus >= cpus;
}

Adaptation& GetAdaptation() {
  static Adaptation adaptation;
  return adaptation;
}

}  // namespace

int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

int RegionThreads() { return ThreadsSetting().load(); }

void SetRegionThreads(int n) {
  if (n < 1) TVM_FFI_THROW(ValueError) << "byoc_hetero: the number of threads must be >= 1, got " << n;
  ThreadsSetting().store(n);
}

int MaxConcurrentCalls(int threads) { return std::max(1, AvailableCpus() / std::max(1, threads)); }

ConcurrencyStats GetConcurrencyStats() {
  Gate& g = GetGate();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.stats;
}

void ResetConcurrencyStats() {
  Gate& g = GetGate();
  std::lock_guard<std::mutex> lock(g.mu);
  g.stats = ConcurrencyStats{};
}

ThreadAdaptation ParseThreadAdaptation(const std::string& name) {
  if (name == "off") return ThreadAdaptation::kOff;
  if (name == "auto") return ThreadAdaptation::kAuto;
  if (name == "reduced") return ThreadAdaptation::kReduced;
  TVM_FFI_THROW(ValueError) << "byoc_hetero: thread adaptation must be 'auto', 'off' or 'reduced' "
                               "(BYOC_HETERO_ADAPT_THREADS / set_thread_adaptation), got '"
                            << name << "'";
  TVM_FFI_UNREACHABLE();
}

const char* ThreadAdaptationName(ThreadAdaptation mode) {
  switch (mode) {
    case ThreadAdaptation::kOff:
      return "off";
    case ThreadAdaptation::kReduced:
      return "reduced";
    default:
      return "auto";
  }
}

ThreadAdaptation GetThreadAdaptation() { return GetAdaptation().mode.load(); }
void SetThreadAdaptation(ThreadAdaptation mode) { GetAdaptation().mode.store(mode); }

AdaptationStats GetAdaptationStats() {
  const Adaptation& a = GetAdaptation();
  AdaptationStats s;
  s.watched = a.watched.load();
  s.contended = a.contended.load();
  s.reduced = a.reduced.load();
  s.probes = a.probes.load();
  s.level = a.level.load();
  return s;
}

void ResetAdaptation() {
  Adaptation& a = GetAdaptation();
  a.level = 0;
  a.next_probe_ns = 0;
  a.probe_interval_ns = kFirstProbeNs;
  a.watched = a.contended = a.reduced = a.probes = a.early_failures = 0;
  a.idle_since_ns = 0;
  a.idle_ticks = -1;
}

AdaptiveCall::AdaptiveCall(int module_threads, bool watch)
    : threads_(std::max(1, module_threads)), level_(0), probe_(false), watch_(false) {
  Adaptation& a = GetAdaptation();
  wall0_ns_ = NowNs();
  const ThreadAdaptation mode = a.mode.load(std::memory_order_relaxed);
  if (threads_ == 1 || mode == ThreadAdaptation::kOff) return;
  if (mode == ThreadAdaptation::kReduced) {
    level_ = 1;
  } else {
    level_ = std::min(a.level.load(), MaxLevel(threads_));
    if (level_ > 0) {
      int64_t due = a.next_probe_ns.load();
      // One try at a time: the claim pushes the next one out until this one reports.
      const int dropped = (threads_ >> (level_ - 1)) - (threads_ >> level_);
      if (wall0_ns_ < due && a.early_failures.load() < kMaxEarlyFailures &&
          CpusWereIdle(a, wall0_ns_, 0.5 * dropped)) {
        early_ = true;
        due = a.next_probe_ns.load();
        if (wall0_ns_ < due && a.next_probe_ns.compare_exchange_strong(due, wall0_ns_)) due = wall0_ns_;
      }
      if (wall0_ns_ >= due && a.next_probe_ns.compare_exchange_strong(due, wall0_ns_ + kMaxProbeNs)) {
        probe_ = true;
        --level_;
        a.probes.fetch_add(1, std::memory_order_relaxed);
      }
    }
    watch_ = watch || probe_;
  }
  const int full = threads_;
  threads_ = std::max(1, full >> level_);
  if (threads_ < full) a.reduced.fetch_add(1, std::memory_order_relaxed);
  if (watch_) {
    const Usage u = ProcessUsage();
    cpu0_us_ = u.cpu_us;
    nivcsw0_ = u.nivcsw;
  }
}

double AdaptiveCall::elapsed() const { return static_cast<double>(NowNs() - wall0_ns_) * 1e-9; }

AdaptiveCall::~AdaptiveCall() {
  if (!watch_) return;
  Adaptation& a = GetAdaptation();
  if (ignored_) {
    if (probe_) a.next_probe_ns.store(0);  // the claim pushed the next try 2 s out: try at the next call
    return;
  }
  const Usage u = ProcessUsage();
  const int64_t now = NowNs();
  const double wall_us = static_cast<double>(now - wall0_ns_) * 1e-3;
  const bool contended = u.nivcsw > nivcsw0_ &&
                         static_cast<double>(u.cpu_us - cpu0_us_) < kContendedShare * threads_ * wall_us;
  a.watched.fetch_add(1, std::memory_order_relaxed);
  if (contended) a.contended.fetch_add(1, std::memory_order_relaxed);
  if (probe_) {
    int64_t interval = kFirstProbeNs;
    if (contended) {
      interval = std::min(2 * a.probe_interval_ns.load(), kMaxProbeNs);
      if (early_) a.early_failures.fetch_add(1);
    } else {
      a.early_failures.store(0);
      a.idle_since_ns.store(0);  // the next reduced spell starts its own idle window
      a.idle_ticks.store(-1);
      int expected = level_ + 1;  // the larger count ran undisturbed: adopt it
      a.level.compare_exchange_strong(expected, level_);
    }
    a.probe_interval_ns.store(interval);
    a.next_probe_ns.store(now + interval);
  } else if (contended && threads_ > 1) {
    int expected = level_;
    if (a.level.compare_exchange_strong(expected, level_ + 1)) {
      a.next_probe_ns.store(now + a.probe_interval_ns.load());
    }
  }
}

OmpThreadsScope::OmpThreadsScope(int n) {
  const Omp& omp = GetOmp();
  if (omp.get_max_threads == nullptr) return;
  const int current = omp.get_max_threads();
  if (current != n) {
    saved_ = current;
    omp.set_num_threads(n);
  }
}

OmpThreadsScope::~OmpThreadsScope() {
  if (saved_ > 0) GetOmp().set_num_threads(saved_);
}

ExecutionSlot::ExecutionSlot(int threads) : threads_(std::max(1, threads)) {
  Gate& g = GetGate();
  const int cpus = AvailableCpus();
  std::unique_lock<std::mutex> lock(g.mu);
  // Admit when the threads fit, or when nothing runs (a call wider than the machine still runs).
  auto fits = [&] { return g.active_calls == 0 || g.active_threads + threads_ <= cpus; };
  if (!fits()) {
    ++g.stats.waited;
    g.cv.wait(lock, fits);
  }
  ++g.active_calls;
  g.active_threads += threads_;
  ++g.stats.calls;
  g.stats.max_active = std::max<int64_t>(g.stats.max_active, g.active_calls);
  g.stats.max_active_threads = std::max<int64_t>(g.stats.max_active_threads, g.active_threads);
}

ExecutionSlot::~ExecutionSlot() {
  Gate& g = GetGate();
  {
    std::lock_guard<std::mutex> lock(g.mu);
    --g.active_calls;
    g.active_threads -= threads_;
  }
  g.cv.notify_all();
}

}  // namespace byoc_hetero
