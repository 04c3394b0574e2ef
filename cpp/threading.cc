/*!
 * \file threading.cc
 * \brief Thread knob, OpenMP thread scopes and the admission gate (see threading.h).
 */
#include "threading.h"

#include <dlfcn.h>
#include <sched.h>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
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
