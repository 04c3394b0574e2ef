/*!
 * \file plan/concat_in_place.h
 * \brief Concat without copies: producers of a concat's inputs write their slices of the
 *        concat's buffer in place, and growing concats (a family: DenseNet's blocks) share one
 *        buffer; the plan notes which inputs were free and which were copied.
 *
 * The planner owns one ConcatInPlace; it places the values it decides in the planner's ValueTable,
 * takes its buffers and slices from the planner's Buffers, and hands inputs it copies to the
 * LayoutResolver and Programs.  Which concats qualify and what was written where is its own.
 */
#ifndef BYOC_HETERO_PLAN_CONCAT_IN_PLACE_H_
#define BYOC_HETERO_PLAN_CONCAT_IN_PLACE_H_

#include <map>
#include <optional>
#include <set>

#include <string>
#include <utility>
#include <vector>

#include "layouts.h"

namespace byoc_hetero {
namespace planning {

class ConcatInPlace {
 public:
  ConcatInPlace(const RegionGraph& g, ValueTable* values, Buffers* buffers, Programs* programs,
                LayoutResolver* layouts)
      : g_(g), values_(*values), buffers_(*buffers), programs_(*programs), layouts_(*layouts) {}

  /*!
   * \brief The concats (ops whose kernels declare KernelTraits::joins_inputs_along) whose inputs
   *        may be written in place: every dim before the axis is 1 (so that in a plain or
   *        channel-blocked layout each input is one contiguous run of the output's bytes) and the
   *        output is no region output.  An input qualifies when it is
   *        the output of a node, read by nothing else, and no region output; whether its producer
   *        writes it in place is decided when the producer is planned (WriteIntoConcat).
   */
  void FindConcatSlices();

  /*! \brief Whether node n is planned by PlanConcat (a concat writing into a shared buffer). */
  bool PlannedAsConcat(size_t n) const { return concat_out_.count(n) != 0 || family_root_.count(n) != 0; }

  /*!
   * \brief Whether \p slot is a slice of a concat's buffer or a concat family's whole buffer: never
   *        overwritten by a sum post-op, since other values live in it (a family's shorter concats
   *        may be read after the longest one dies).
   */
  bool IsConcatStorage(int slot) const;

  /*!
   * \brief The layout node n's output would need to be written into its concat's buffer in place
   *        (the buffer exists already: a concat family's, FindConcatFamilies), or an empty desc.
   */
  memory::desc ConcatSliceLayout(size_t n) const;

  /*!
   * \brief Node n's kernel writes \p layout.  When that is channels-last (acdb) and n's output is
   *        an input of a concat along the channels of a rank-4 tensor whose buffer is not decided
   *        yet, the concat's buffer becomes channels-last (acdb), the layout its producers write and
   *        a conv reading it wants (SegFormer's decode head: four NHWC maps, read by a 1x1 conv), so
   *        that neither side transposes.  Each input is then copied into its run, a strided channel
   *        slice (a same-layout jit reorder), unless its kernel writes exactly that run
   *        (ConcatSliceLayout is its hint): oneDNN 3.2's resampling has only its reference
   *        implementation for a strided destination (ref:any), so the resizes write dense.
   *        Returns whether it made the buffer.
   */
  bool ClaimChannelsLast(size_t n, const OperandLayout& layout);

  /*!
   * \brief Node n's output is a concat input (FindConcatSlices) and the kernel writes it in a
   *        layout whose slice of the concat's buffer is a contiguous run: give the kernel that
   *        run (a slice buffer, PrivateBuffer::parent) as its output.  The first producer decides
   *        the concat's buffer layout (its own); later ones must write the same.  In a
   *        channel-blocked layout, the slice's offset and extent must be whole blocks; in a
   *        channels-last buffer (ClaimChannelsLast) the run is strided and the kernel must write
   *        exactly that strided desc.
   */
  bool WriteIntoConcat(size_t n, const OperandLayout& layout, MemRef* out);

  /*!
   * \brief A concat some of whose producers wrote in place (WriteIntoConcat): the inputs they
   *        did not write (read elsewhere too, region inputs, constants, another layout) are
   *        reordered into their sub-memory of the buffer; the rest costs nothing.  Returns the
   *        plan's note on it (Plan::notes): which inputs were free, which were copied.
   */
  std::string PlanConcat(size_t n, const Kernel& kernel);

 private:
  /*! \brief A layout whose slices along one axis are contiguous runs of bytes, or (channels-last,
   *         axis 1) runs of channels at a stride: every slice is a strided view of the buffer. */
  enum class SliceLayout { kPlain, kBlocked8, kBlocked16, kChannelsLast };

  /*! \brief A concat input its producer may write straight into the concat's buffer. */
  struct SliceTarget {
    size_t concat;      // the concat node
    int64_t offset;     // where the input starts along the axis
  };
  /*! \brief The buffer of a concat some producer writes into (decided by the first such producer). */
  struct ConcatBuffer {
    memory::desc md;
    SliceLayout layout;
    int slot;
  };

  /*!
   * \brief Growing concats share one buffer (DenseNet: layer k concatenates the block's input and
   *        the k-1 features before it, so every concat's inputs are the first inputs of the next
   *        one's).  A concat whose inputs are the leading inputs of a longer considered concat (same
   *        axis) joins that one's family; the longest is the root.  The root's buffer is made here,
   *        in the channel-blocked layout when every input is whole 16 (or 8) channel blocks (then
   *        each member's output, a leading run of channels, is a dense tensor at offset 0 in the
   *        same layout), else plain; every member's output is a view of it.  An input is written
   *        in place by its producer when every reader is a concat of the family; the others are
   *        copied into the buffer once, by the first member that joins them.
   */
  void FindConcatFamilies(const std::vector<int>& reads);

  /*! \brief The SliceLayout \p md is in (f32, dims as they are), if any. */
  static std::optional<SliceLayout> SliceLayoutOf(const memory::desc& md, int64_t axis);
  static memory::desc SliceLayoutDesc(const memory::dims& dims, SliceLayout layout);
  /*! \brief Where an input lies in its concat's buffer: its desc (dense, or strided like a
   *         channels-last buffer), byte offset, and the bytes from there its elements span. */
  struct Run {
    memory::desc md;
    size_t offset;
    size_t bytes;
  };
  /*! \brief The Run of \p buffer holding an input of \p dims that starts \p offset along \p axis. */
  static Run SliceOf(const ConcatBuffer& buffer, const memory::dims& dims, int64_t axis, int64_t offset);
  /*! \brief Tensor t is written into \p slot (a run of its concat's buffer) under \p layout. */
  void PlaceInConcat(int t, const OperandLayout& layout, int slot, MemRef* out);

  const RegionGraph& g_;
  ValueTable& values_;
  Buffers& buffers_;
  Programs& programs_;
  LayoutResolver& layouts_;
  std::map<int, SliceTarget> slice_targets_;     // tensor -> the concat it may be written into
  std::map<size_t, int64_t> concat_axis_;        // concat node -> its axis (those considered)
  std::map<size_t, ConcatBuffer> concat_out_;    // concat node -> its buffer, once a producer wrote into it
  std::set<int> written_in_place_;               // tensors their producer wrote into a concat's buffer
  std::map<size_t, size_t> family_root_;         // a family member (not the root) -> its root
  std::set<std::pair<size_t, size_t>> family_copied_;  // (root, input index): already copied into its buffer
};

}  // namespace planning
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_PLAN_CONCAT_IN_PLACE_H_
