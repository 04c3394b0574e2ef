/*!
 * \file weights.h
 * \brief Prepared weights: the constants of a module copied, reordered, transformed and folded
 *        into the layouts its plans want, once, and shared by every plan of the module (its own
 *        plans and its plans for fewer threads under contention, threading.h).
 *
 * A buffer is named by its plan-independent key (planner.h: tensor, layout, transform), so two
 * plans of one module that want a constant in the same layout read one copy.  A buffer some
 * plan's run program reads is allocated (zero pages) when the first such plan is made, so that a
 * weight too large to allocate fails the module's creation; it is filled by that plan's init
 * program when the constants arrive (executor.h) and stays read-only while calls run.  A buffer
 * only init programs read (an intermediate such as an RMSNorm weight folded into a dense before
 * the reorder into the dense's layout) is allocated while an init program fills, its pages handed
 * back as soon as the last init step reading it ran (DiscardInitOnly), and freed once the program
 * has: a plan made later that needs it computes it again from the constants, which the store keeps.
 * A constant mapped read-only from a file (a weights file) hands its pages back the same way
 * (ReleaseFilePages): they are read again from the file when a later plan wants them.
 *
 * A constant a run step reads in its own plain layout has no buffer: the steps read its data in
 * place (SharedBuffer::constant; the executor points them at it when the constants arrive).
 *
 * The store also holds the constants themselves (the caller's data, kept alive by an owner) and
 * the lock of everything that reads the buffers: running calls of every plan sharing the store
 * hold it shared, whoever writes a buffer (new constants, a new plan's weights) exclusively.
 */
#ifndef BYOC_HETERO_WEIGHTS_H_
#define BYOC_HETERO_WEIGHTS_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "planner.h"

namespace byoc_hetero {

/*! \brief BYOC_HETERO_HUGE_PAGES=1 (the default; 0: small pages): AlignedBuffers of 2 MiB or more start on a 2 MiB boundary and are advised
 *         MADV_HUGEPAGE (transparent huge pages where the kernel has them in `madvise` or `always` mode), so
 *         that a decode step streaming hundreds of MB of weights walks one TLB entry per 2 MiB, not per 4 KiB
 *         (numpy's own arrays of 4 MiB or more are advised so: bench/generate.py's bandwidth probe reads such
 *         pages).  The default since session 14's quiet A/B (bench/WEIGHT_ONLY.md); read per allocation. */
constexpr const char* kHugePagesVariable = "BYOC_HETERO_HUGE_PAGES";

/*! \brief Frees an AlignedBuffer's bytes: unmaps a mapping of its own, else frees heap. */
struct BufferFree {
  size_t mapped = 0;  // bytes of the mapping, 0: from the heap
  void operator()(void* p) const;
};

/*!
 * \brief 64-byte aligned, zero-filled bytes (zero padding of blocked layouts starts valid).
 *        Large buffers are their own anonymous mapping: the pages cost memory only once written,
 *        and go back to the system when the buffer dies (the allocator would keep freed heap).
 */
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  /*! \throws RuntimeError "<what>: out of memory: ..." when the allocation fails. */
  AlignedBuffer(size_t bytes, const std::string& what);
  void* get() const { return ptr_.get(); }
  /*!
   * \brief Hand the pages of a buffer that is its own mapping back to the system (they read as
   *        zeros again; the address stays valid); a heap buffer (under 1 MiB) is left as it is.
   */
  void Discard();

 private:
  std::unique_ptr<void, BufferFree> ptr_;
};

/*!
 * \brief The address ranges [begin, end) of this process's shared read-only mappings of files
 *        (/proc/self/maps): memory whose pages are the file's, handed back and read again where touched.
 */
std::vector<std::pair<uintptr_t, uintptr_t>> ReadOnlyFileMappings();

/*!
 * \brief Hand back the resident pages wholly inside [\p data, \p data + \p bytes) if the range lies in
 *        one of \p mappings (ReadOnlyFileMappings), else nothing: constants mapped from a weights file
 *        (bh.llm.load, an in-process generator's spilled file) once an init program read them.
 */
void ReleaseFilePages(const void* data, size_t bytes, const std::vector<std::pair<uintptr_t, uintptr_t>>& mappings);

/*! \brief The environment variable of LookupPages (1 | 0, unset: 1), read when a lookup kernel is built. */
constexpr const char* kLookupPagesVariable = "BYOC_HETERO_RELEASE_LOOKUP_PAGES";

/*!
 * \brief What a lookup kernel (take, take_wq: a few rows of a table, read in place) does about the pages
 *        of its table when the table lies in a read-only shared file mapping (a weights file: bh.llm.load,
 *        an in-process generator's spilled file): hands them back every few rows (kRows).
 *
 * Why: a fault on a file mapping maps the whole page-cache folio the page is in (Linux 6.18 maps an
 * entire large folio on fault-around; ext4 and the other large-folio file systems cache a file written or
 * read in large chunks as folios of up to 2 MiB), not 4 KiB: each token's row of an embedding table made
 * up to 2 MiB of it resident, so a prefill of 128 tokens mapped most of the table (SmolLM-135M: 99 of its
 * 108 MiB; Qwen2.5-0.5B: up to 256 of 519) and a long generation all of it, clean file pages counted in
 * the process's resident size beside the weights' prepared copy (bench/GENERATE.md, session 16 s16-mem).
 * Handed back (MADV_DONTNEED over the table: the pages stay in the page cache), the lookup holds at most
 * kRows folios at a time; a later read faults them in again (a decode token: one fault).
 * BYOC_HETERO_RELEASE_LOOKUP_PAGES=0 keeps them (the A/B of its cost).
 */
class LookupPages {
 public:
  /*! \brief Rows read between two hand-backs. */
  static constexpr int64_t kRows = 16;

  /*! \brief Reads BYOC_HETERO_RELEASE_LOOKUP_PAGES. \throws ValueError naming it for anything but 0 / 1. */
  LookupPages();

  /*! \brief Whether [\p data, \p data + \p bytes) is a table whose pages this hands back: lies in a read-only
   *         shared file mapping (ReadOnlyFileMappings, read once per new address) and the variable is not 0. */
  bool Releases(const void* data, size_t bytes);

  /*! \brief Hand back the resident pages of [\p data, \p data + \p bytes) (one for which Releases is true). */
  static void Release(const void* data, size_t bytes);

 private:
  bool enabled_ = true;
  std::mutex mu_;
  const void* checked_ = nullptr;  // the address last checked (guarded by mu_)
  size_t checked_bytes_ = 0;
  bool inside_ = false;
};

class PreparedWeights {
 public:
  /*! \brief Held shared by running calls, exclusively by whoever writes the buffers or constants. */
  std::shared_mutex& mutex() { return mu_; }

  /*!
   * \brief New constants (one pointer per graph constant, owned by \p owner): every buffer must
   *        be filled again.  The same owner as the current constants changes nothing (one __init_
   *        reaches the module's own plans and its contention plans). Caller holds mutex().
   */
  void SetConstants(const std::vector<const void*>& data, std::shared_ptr<const void> owner);
  const std::vector<const void*>& constants() const { return constants_; }
  /*! \brief Bumped by every SetConstants with new constants. */
  int64_t generation() const { return generation_; }
  /*! \brief Whether the constants were loaded (or none are needed) and the load succeeded. */
  bool ready() const { return ready_.load(); }
  void set_ready(bool ready) { ready_ = ready; }

  /*!
   * \brief The buffers of plan.shared, in order, for its run program: existing ones by key,
   *        missing ones allocated; null for those only init programs read.  The addresses stay
   *        valid as long as this object.  Caller holds mutex() exclusively.
   */
  std::vector<void*> Reserve(const Plan& plan);
  /*! \brief Whether plan.shared[i] holds its value for the current constants. */
  std::vector<bool> Filled(const Plan& plan) const;
  /*! \brief The buffers of plan.shared for its init program: those in \p used allocated (an
   *         init-only one again after it was freed), the others as they are (maybe null). */
  std::vector<void*> ForInit(const Plan& plan, const std::vector<bool>& used);
  /*! \brief The data of the constant plan.shared[i] reads in place (null before constants came). */
  void* Constant(const Plan& plan, size_t i) const;
  /*! \brief plan.shared[i] for each \p which[i] now holds its value; then the buffers no run
   *         program reads are freed. */
  void MarkFilled(const Plan& plan, const std::vector<bool>& which);
  /*!
   * \brief Hand back the pages of plan.shared[i] if no run program reads it (an init-only
   *        intermediate whose last reader ran: FillWeights calls it after that step, so that an
   *        init program's intermediates are not all resident at once); else nothing.
   */
  void DiscardInitOnly(const Plan& plan, size_t i);

  size_t count() const { return entries_.size(); }
  /*! \brief Bytes of the buffers allocated now. */
  int64_t bytes() const;

 private:
  struct Entry {
    size_t bytes;
    std::string what;
    AlignedBuffer buffer;
    bool allocated = false;
    bool run = false;  // a plan's run program reads it: never freed
    int64_t filled = -1;  // the generation it was filled for
  };
  Entry& Find(const SharedBuffer& b);
  std::map<std::string, Entry> entries_;
  std::vector<const void*> constants_;
  std::shared_ptr<const void> owner_;
  int64_t generation_ = 0;
  std::atomic<bool> ready_{false};
  std::shared_mutex mu_;
};

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_WEIGHTS_H_
