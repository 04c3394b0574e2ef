/*!
 * \file threading.h
 * \brief How many OpenMP threads oneDNN uses for a region, and how many regions run at once.
 *
 * The knob: BYOC_HETERO_NUM_THREADS (environment, read once) or SetRegionThreads() (the
 * Python function byoc_hetero._C.set_num_threads; python_module.cc binds these functions).
 * Default: OMP_NUM_THREADS if set, else the number of CPUs this process may run on.
 *
 * A module builds its oneDNN primitives for the thread count in force when it is created (oneDNN
 * partitions the work of some primitives at creation) and runs them with that count, whatever
 * the calling thread's OpenMP settings are.
 *
 * Oversubscription: each region call occupies `threads` cores.  At most max(1, cpus / threads)
 * region calls execute at the same time in the process; further concurrent callers (other VMs,
 * other threads) wait for a slot.  So two VMs running at once on a 2-core machine with the
 * default (2 threads per call) take turns inside regions, and with BYOC_HETERO_NUM_THREADS=1 they
 * run side by side, one core each.  TVM's own thread pool (TVM_NUM_THREADS) is not used by the
 * llvm code of the default relax.build pipeline, which emits no parallel loops.
 *
 * Contention from other processes (BYOC_HETERO_ADAPT_THREADS=auto|off|reduced, read once, or
 * SetThreadAdaptation): oneDNN's OpenMP primitives split their work statically between the team
 * and meet at barriers; libgomp's threads spin there (GOMP_SPINCOUNT, 300000 pauses by default)
 * before they sleep.  When another process wants the same cores, a call waits at every barrier
 * for a thread the kernel has descheduled while its own spinning threads burn the CPU the others
 * need (measured in bench/CONTENTION.md: ResNet-18 with a twin process, 2 threads each, p90 0.5 s
 * for a 6 ms call, the process burning 80 ms of CPU per call).  The gate above cannot see other
 * processes.  So each region call is watched (its wall time, the process's CPU time and
 * involuntary context switches, one getrusage before and after): a call whose threads were
 * preempted and got well under their share of CPU marks the machine contended, and later calls
 * run with half the threads (a plan made for that count, see region_module.cc), down to one.
 * Now and then (after 100 ms, doubling up to 2 s while it fails) one call tries the next larger
 * count, and an uncontended try moves back up; while reduced, CPUs found idle in /proc/stat
 * (checked every 50 ms) bring the try forward, so a quiet machine gets its threads back at once.  "off" always uses the module's count; "reduced"
 * always uses half of it (for tests).
 */
#ifndef BYOC_HETERO_THREADING_H_
#define BYOC_HETERO_THREADING_H_

#include <cstdint>
#include <string>

namespace byoc_hetero {

/*! \brief Threads per region call for modules created from now on. */
int RegionThreads();
/*! \brief Set it (n >= 1); existing modules keep theirs. */
void SetRegionThreads(int n);
/*! \brief CPUs this process may run on (its affinity mask). */
int AvailableCpus();
/*! \brief How many region calls may execute at once for a thread count. */
int MaxConcurrentCalls(int threads);

/*! \brief Counters of the admission gate (for tests and reports). */
struct ConcurrencyStats {
  int64_t calls = 0;         // region executions admitted
  int64_t waited = 0;        // of which had to wait for a slot
  int64_t max_active = 0;    // most executions at once
  int64_t max_active_threads = 0;  // most OpenMP threads busy at once (sum over executions)
};
ConcurrencyStats GetConcurrencyStats();
void ResetConcurrencyStats();

/*! \brief How region calls react to contention (see the file comment). */
enum class ThreadAdaptation { kOff, kAuto, kReduced };
ThreadAdaptation GetThreadAdaptation();
void SetThreadAdaptation(ThreadAdaptation mode);
/*! \brief "off" | "auto" | "reduced" -> mode; ValueError naming the three otherwise. */
ThreadAdaptation ParseThreadAdaptation(const std::string& name);
const char* ThreadAdaptationName(ThreadAdaptation mode);

/*! \brief Counters of the adaptation (for tests and reports). */
struct AdaptationStats {
  int64_t watched = 0;      // calls whose contention was measured
  int64_t contended = 0;    // of which found contended
  int64_t reduced = 0;      // calls run with fewer threads than their module was made for
  int64_t probes = 0;       // calls that tried a larger count
  int64_t level = 0;        // now: threads = module's >> level (at least 1)
};
AdaptationStats GetAdaptationStats();
void ResetAdaptation();

/*!
 * \brief RAII around one region call of a module made for `module_threads`: threads() is the
 *        count this call runs with; the destructor measures whether the call was contended and
 *        updates the process-wide level.  `watch` false skips the measurement (the caller samples
 *        short calls, for which two getrusage calls, about 1 us each, would be a visible cost).
 */
class AdaptiveCall {
 public:
  AdaptiveCall(int module_threads, bool watch);
  ~AdaptiveCall();
  AdaptiveCall(const AdaptiveCall&) = delete;
  AdaptiveCall& operator=(const AdaptiveCall&) = delete;
  int threads() const { return threads_; }
  /*! \brief Wall seconds of the call so far. */
  double elapsed() const;
  /*!
   * \brief The call did one-time work (made a plan, prepared weights: primitive creation, reorders,
   *        first touch of fresh pages, partly on one thread): its CPU share measures that, not
   *        contention, so it does not count; a probe it was is tried again at the next call.
   */
  void Ignore() { ignored_ = true; }

 private:
  int threads_;
  int level_;       // the level this call's count belongs to
  bool probe_;
  bool early_ = false;  // a try brought forward because our CPUs were idle
  bool watch_;
  bool ignored_ = false;
  int64_t wall0_ns_ = 0, cpu0_us_ = 0, nivcsw0_ = 0;
};

/*!
 * \brief RAII: the calling thread's OpenMP thread count set to n (restored on exit).
 *        Used around primitive creation and execution.
 */
class OmpThreadsScope {
 public:
  explicit OmpThreadsScope(int n);
  ~OmpThreadsScope();
  OmpThreadsScope(const OmpThreadsScope&) = delete;
  OmpThreadsScope& operator=(const OmpThreadsScope&) = delete;

 private:
  int saved_ = -1;
};

/*! \brief RAII: a slot of the process-wide admission gate for a call using `threads` threads. */
class ExecutionSlot {
 public:
  explicit ExecutionSlot(int threads);
  ~ExecutionSlot();
  ExecutionSlot(const ExecutionSlot&) = delete;
  ExecutionSlot& operator=(const ExecutionSlot&) = delete;

 private:
  int threads_;
};

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_THREADING_H_
