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
 */
#ifndef BYOC_HETERO_THREADING_H_
#define BYOC_HETERO_THREADING_H_

#include <cstdint>

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
