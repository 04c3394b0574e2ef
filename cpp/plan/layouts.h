/*!
 * \file plan/layouts.h
 * \brief Layout resolution: which slot and layout each value lives in, and the reorders (or
 *        zero-copy views) that hand a consumer the layout it wants.
 *
 * Every tensor of the region gets a ValueState (values.h):
 *   storage     the slot its value lives in during a run, in storage_md (the producer's layout,
 *               possibly blocked; plain for region inputs and constants);
 *   plain       a slot holding the same value in plain row-major bytes (plain_md), when one
 *               exists: region inputs/outputs (the caller's buffers), constants, intermediates
 *               whose producer writes plain, or a plain copy made on demand.
 * A consumer asks for (view, want).  The planner hands it the storage directly when the layouts
 * agree, and otherwise inserts one reorder.  A value known at __init_ (a constant, or the output
 * of a node whose inputs are all such values) is converted in the init program, once; everything
 * else goes to the run program, in node order.
 *
 * The planner owns one LayoutResolver; it places values in the planner's ValueTable, asks the
 * planner's Buffers for slots and appends the reorders to its Programs.  What it has resolved
 * (one conversion serves every reader) is its own.
 */
#ifndef BYOC_HETERO_PLAN_LAYOUTS_H_
#define BYOC_HETERO_PLAN_LAYOUTS_H_

#include <string>
#include <vector>

#include "buffers.h"
#include "programs.h"
#include "values.h"

namespace byoc_hetero {
namespace planning {

class LayoutResolver {
 public:
  LayoutResolver(const RegionGraph& g, ValueTable* values, Buffers* buffers, Programs* programs)
      : g_(g), values_(*values), buffers_(*buffers), programs_(*programs) {}

  /*!
   * \brief A memory with layout.want holding tensor t, for node `consumer`.
   * \param init_consumer The consumer runs in the init program: a constant's own data may be
   *        handed over without a copy.
   */
  MemRef Resolve(int t, const OperandLayout& layout, size_t consumer, bool init_consumer);

  /*!
   * \brief Decide where node n's output lives; returns the memory the kernel writes.
   * \param reuse A private slot the output may take over (a dying residual), or -1.
   * \param trailing Receives the steps to run after the kernel's (a copy into the caller's buffer).
   */
  MemRef DefineOutput(size_t n, const OperandLayout& layout, bool at_init, int reuse, std::vector<Step>* trailing);

  /*!
   * \brief Plan a node that only views its input (Kernel::alias_input: a reshape) with no step:
   *        its output is the input's plain bytes (a region output: copied out).  A value stored
   *        bf16 (only where every reader rounds it: OutputOnlyFeedsBf16Convs) is aliased as plain
   *        bf16 bytes, so the readers of the reshape still read it without a reorder.
   */
  void Alias(size_t n, const Kernel& kernel);

  /*!
   * \brief Plan a permute (Kernel::relabel_axes) as a new descriptor over its input's buffer,
   *        with no step: returns false (plan it as a reorder) for a value known at __init_ (a
   *        constant's data is reachable only there, and the reorder runs once anyway), a non-f32
   *        value, or one whose storage has other dims (a dense's [B*S, N]) and no plain copy.
   *        The output's storage is the input's storage (blocked or not) with its axes permuted;
   *        it counts as plain only when that is row-major for the output's dims (NHWC bytes read
   *        as [N,H,W,C]).  A consumer wanting another layout pays one reorder, the one the
   *        permute's own step would have cost.
   */
  bool Relabel(size_t n, const Kernel& kernel);

  /*!
   * \brief Plan a slice (Kernel::view_box) as a view with no step: its output is the input's bytes from
   *        the box's first element (a slot inside the input's buffer, Buffers::Slice) under the input's
   *        strides times the box's steps.  Only for a float32 run-time value in a private buffer, stored
   *        plain or under strides (no blocks), whose slice is no region output and is read only by
   *        kernels reading strided input in place, through views (ReadersTakeStrides); false
   *        otherwise (plan the slice's copy).  Swin's q, k, v = qkv[0], qkv[1], qkv[2] of the qkv
   *        dense's output relabelled [3, windows, heads, N, d]: the matmuls read them where they lie.
   *        Opt-in: only with BYOC_HETERO_SLICE_VIEWS=on (read when a region is planned); otherwise every
   *        slice is copied as before.  A loaded A/B on torchvision Swin-T (bench/swin_torchvision.py
   *        --ab, bench/ZOO.md session 15) was level (0.99x): the views remove the 42 Q / K / V copies,
   *        but oneDNN 3.2's brgemm matmul takes only dense strides, so the attention's matmuls move to
   *        gemm:jit; the default waits for a quiet A/B.
   */
  bool SliceView(size_t n, const Kernel& kernel);

  /*!
   * \brief A layout to offer node n's kernel for its output (KernelContext::output_hint): where
   *        the output is a float32 intermediate read only by one permute, or only by one reshape
   *        read only by one permute, the layout under which that permute's result is row-major,
   *        so that Relabel makes it a view with plain bytes and its readers (a reshape merging
   *        dims) need no copy: attention's (P @ V) [B, heads, N, d] permuted to [B, N, heads, d]
   *        and merged to [B, N, C] before the output dense.  Through a reshape that only splits
   *        the output's leading dims, the layout is given under the reshape's dims (torchvision
   *        Swin's P @ V [windows * heads, N, d], reshaped [windows, heads, N, d] before the
   *        permute: no strides over [windows * heads, N, d] put heads inside N); a kernel taking
   *        that writes its output under those dims, which the reshape then views (ViewWithoutCopy).
   *        Through another reshape, under the output's own dims where strides can say it.  Only
   *        the matmul takes it, where a jit kernel writes it (splitting its batch dims for the
   *        first form).  An empty desc otherwise.
   */
  memory::desc PermutedOutputLayout(size_t n) const;

 private:
  /*!
   * \brief A reshape of a value held only in a permuted plain layout (a dense's tokens [1, S, C]
   *        relabelled [1, C, S]:acb) that splits or merges dims lying next to each other there:
   *        the output is the same bytes under strides (ReshapedView), no copy; false where it
   *        cannot (a constant, a value with plain bytes, a region output, dims not adjacent).
   *        SegFormer's tokens <-> NHWC images around Mix-FFN's depthwise conv and its resizes.
   */
  bool ViewWithoutCopy(int t_in, int t_out);
  /*! \brief Every node reading tensor \p t (at least one) reads it in place under strides, or views it
   *         (a reshape, a permute: KernelTraits::strided_input kPassesOn) into a value read so in turn;
   *         none computes bf16 (it converts its operands anyway) and t is no region output. */
  bool ReadersTakeStrides(int t) const;
  /*! \brief Tensor t is a float32 intermediate of at least one dim, no region output. */
  bool PrivateF32(int t) const;
  /*! \brief The bytes an earlier Resolve of the same bytes (tensor t, or a reshape of it sharing
   *         its storage) in \p layout gave, or null: one conversion serves every reader. */
  const MemRef* FindResolved(int t, const OperandLayout& layout, size_t consumer, bool init_consumer) const;
  /*! \brief What tells \p layout's transformed value apart (Resolved::transform, the buffer's key): its name, and the
   *         tensors its transform also reads (OperandLayout::also_reads) of node \p consumer. */
  std::string TransformKey(const OperandLayout& layout, size_t consumer) const;
  /*! \brief Resolve for a kernel reading a tensor computed from the plain value (OperandLayout::transform). */
  MemRef ResolveTransformed(int t, const OperandLayout& layout, size_t consumer);
  /*! \brief Resolve for a constant: its own data, read in place, or one reorder at __init_. */
  MemRef ResolveConstant(int t, const OperandLayout& layout, const std::string& label, bool init_consumer,
                         bool* init_only);
  /*! \brief \p src, or a copy of it in \p want (one reorder) when that is another layout. */
  MemRef InLayout(const MemRef& src, const memory::desc& want, bool at_init, const std::string& key,
                  const std::string& label);

  struct Resolved {
    int tensor;
    memory::desc view, want;
    std::string transform;
    MemRef mem;
    bool init_only;
  };

  const RegionGraph& g_;
  ValueTable& values_;
  Buffers& buffers_;
  Programs& programs_;
  std::vector<Resolved> resolved_;
};

}  // namespace planning
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_PLAN_LAYOUTS_H_
