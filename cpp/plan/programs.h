/*!
 * \file plan/programs.h
 * \brief The plan's two step programs while they are made: init (run once when the weights are
 *        prepared) and run (per call), the reorders and host byte copies between layouts, and their
 *        compilation into PlannedSteps (implementation names, layouts, scratchpad sizes).
 *
 * The planner owns one Programs; the parts that place values append steps to it.
 */
#ifndef BYOC_HETERO_PLAN_PROGRAMS_H_
#define BYOC_HETERO_PLAN_PROGRAMS_H_

#include <string>
#include <vector>

#include "buffers.h"

namespace byoc_hetero {
namespace planning {

class Programs {
 public:
  Programs(const dnnl::engine& engine, const Buffers& buffers) : engine_(engine), buffers_(buffers) {}

  /*!
   * \brief A step writing src's elements into dst's layout: a oneDNN reorder for float and 8-bit
   *        values, a host byte copy (two plain strided descriptors of one type and shape) for
   *        int64 / int32 / bool bytes.
   */
  Step MakeReorder(const MemRef& src, const MemRef& dst, const std::string& label) const;

  /*!
   * \brief Append \p step to the init program (\p at_init; it completes the shared buffer of
   *        \p writes_slot, when that is one) or to the run program.
   */
  void Add(bool at_init, Step step, int writes_slot);
  void AddReorder(bool at_init, const MemRef& src, const MemRef& dst, const std::string& label) {
    Add(at_init, MakeReorder(src, dst, label), dst.slot);
  }

  /*! \brief Both programs -> plan->init_steps / run_steps and their scratchpad sizes; empties them. */
  void Compile(Plan* plan);

 private:
  /*! \brief A step and the shared buffer it completes (init program), before compilation. */
  struct Pending {
    Step step;
    int writes = -1;
  };

  void CompileProgram(std::vector<Pending>* pending, std::vector<PlannedStep>* out, size_t* scratch) const;

  const dnnl::engine& engine_;
  const Buffers& buffers_;
  std::vector<Pending> init_, run_;
};

}  // namespace planning
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_PLAN_PROGRAMS_H_
