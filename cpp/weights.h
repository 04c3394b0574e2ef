/*!
 * \file weights.h
 * \brief Prepared weights: the constants of a module copied, reordered, transformed and folded
 *        into the layouts its plans want, once, and shared by every plan.
 *
 * A buffer is named by its plan-independent key (planner.h: tensor, layout, transform), so two
 * plans of one module that want a constant in the same layout read one copy.  A buffer is
 * allocated (zero-filled) when the first plan wanting it is made, so that a weight too large to
 * allocate fails the module's creation; it is filled by that plan's init program when the
 * constants arrive (executor.h) and stays read-only while calls run.
 */
#ifndef BYOC_HETERO_WEIGHTS_H_
#define BYOC_HETERO_WEIGHTS_H_

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "planner.h"

namespace byoc_hetero {

/*! \brief 64-byte aligned, zero-filled bytes (zero padding of blocked layouts starts valid). */
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  /*! \throws RuntimeError "<what>: out of memory: ..." when the allocation fails. */
  AlignedBuffer(size_t bytes, const std::string& what);
  void* get() const { return ptr_.get(); }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> ptr_;
};

class PreparedWeights {
 public:
  /*!
   * \brief The buffers of plan.shared, in order: existing ones by key, missing ones allocated.
   *        The addresses stay valid as long as this object.
   */
  std::vector<void*> Reserve(const Plan& plan);
  /*! \brief Whether plan.shared[i] has been filled since the constants last changed. */
  std::vector<bool> Filled(const Plan& plan) const;
  void MarkFilled(const Plan& plan, const std::vector<bool>& which);
  /*! \brief New constants are coming: every buffer must be filled again. */
  void Invalidate();

  size_t count() const { return entries_.size(); }
  int64_t bytes() const;

 private:
  struct Entry {
    size_t bytes;
    AlignedBuffer buffer;
    bool filled = false;
  };
  std::map<std::string, Entry> entries_;
};

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_WEIGHTS_H_
