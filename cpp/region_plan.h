/*!
 * \file region_plan.h
 * \brief A region compiled for oneDNN: primitives, memories and the two step programs.
 *
 * Build() creates every primitive and allocates every intermediate and scratch buffer once.
 * LoadConstants() runs the init program (constants copied and reordered into the layouts the
 * primitives prefer).  Execute() binds the caller's buffers and runs the run program.  Both
 * take the region's mutex, so one CompiledRegion can be shared by concurrent callers.
 *
 * This header keeps oneDNN out of its includers.
 */
#ifndef BYOC_HETERO_REGION_PLAN_H_
#define BYOC_HETERO_REGION_PLAN_H_

#include <memory>
#include <string>
#include <vector>

#include "region_graph.h"

namespace byoc_hetero {

class CompiledRegion {
 public:
  /*!
   * \brief Validate the ops of \p graph and build the oneDNN plan.
   * \throws tvm::ffi::Error: ValueError for attrs/shapes the ops reject, RuntimeError when
   *         oneDNN cannot create a primitive; messages name the region and the node.
   */
  explicit CompiledRegion(const RegionGraph& graph);
  ~CompiledRegion();
  CompiledRegion(const CompiledRegion&) = delete;
  CompiledRegion& operator=(const CompiledRegion&) = delete;

  /*!
   * \brief Copy/reorder the constants into the module's own buffers.
   * \param data One pointer per graph.constants entry: the plain row-major float32 data.
   *        The pointers need to stay valid only during the call.
   */
  void LoadConstants(const std::vector<const void*>& data);
  /*! \brief True once LoadConstants succeeded, or when the region has no constants. */
  bool ready() const;

  /*!
   * \brief Run the region.
   * \param buffers The region inputs then the region outputs, plain row-major float32, already
   *        checked by the caller against the graph's shapes.
   */
  void Execute(const std::vector<void*>& buffers);

  /*! \brief One line per step of both programs: label, oneDNN implementation, layouts. */
  std::vector<std::string> Describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_REGION_PLAN_H_
