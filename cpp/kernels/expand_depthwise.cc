/*!
 * \file kernels/expand_depthwise.cc
 * \brief A 1x1 convolution followed by a depthwise convolution (MobileNet's expand -> depthwise),
 *        run together in row strips.
 *
 * Run one after the other, the 1x1 conv writes its whole output (6x wider than its input in
 * MobileNetV2) and the depthwise conv reads it back, on other cores and after it has left the
 * caches (bench/depthwise_in_chain.cc measures the cost).  Here each thread owns a band of
 * output rows and walks it in strips:
 *
 *   1. the 1x1 conv computes the expanded rows the strip needs (input rows are contiguous in
 *      nhwc) into the thread's strip buffer, which stays in its core's cache;
 *   2. the depthwise conv reads the strip buffer and writes the strip's output rows.
 *
 * Consecutive strips overlap by kh - stride rows (the window of the depthwise conv): those rows
 * are moved to the front of the buffer, not computed again.  Rows of the depthwise conv's
 * vertical padding are zero rows in the buffer, so its primitives pad only left and right.
 * Both convs are oneDNN primitives created for one thread and for each strip height the
 * schedule uses (a handful); each keeps its weights in the layout it prefers.
 *
 * Qualifies: expand = conv2d 1x1, stride 1, no padding, no dilation, one group, no residual;
 * depthwise = conv2d with groups = channels = the expand's output channels, no residual; any
 * activations.  Data and output are nhwc.
 */
#include <omp.h>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../threading.h"
#include "kernel.h"

namespace byoc_hetero {

namespace {

/*! \brief Bytes of expanded rows a thread keeps at once (its strip buffer): about half an L2. */
constexpr int64_t kStripBufferBytes = 256 << 10;

memory::desc Nhwc(const memory::dims& dims) {
  return memory::desc(dims, memory::data_type::f32, memory::format_tag::nhwc);
}

/*! \brief Thrown while scheduling when a strip shape has only a reference implementation. */
struct NoFastKernel {};

/*! \brief One step of a thread's walk over its band. */
struct StripOp {
  enum Kind { kExpand, kZero, kShift, kDepthwise } kind;
  int64_t image;
  int64_t row;    // kExpand: first input row; kShift: first buffer row kept; kDepthwise: first output row
  int64_t count;  // rows
  int64_t at;     // kExpand / kZero: first buffer row written
  size_t prim;    // kExpand / kDepthwise: index into the primitives
};

/*! \brief Primitives of one conv for several strip heights, and where each one's weights live. */
struct StripConvs {
  std::vector<dnnl::primitive> prims;
  std::vector<std::string> impls;
  std::vector<size_t> weight_layout;  // per primitive: index into layouts
  std::vector<memory::desc> srcs, dsts;
  std::vector<memory::desc> layouts;  // distinct weight layouts
  std::vector<size_t> offsets;        // byte offset of each layout in the packed weights
  size_t packed_bytes = 0;
  size_t scratch_bytes = 0;
  std::map<int64_t, size_t> by_rows;

  /*! \brief Index of the primitive for `rows`, creating it with `make(rows)` on first use. */
  template <typename Make>
  size_t Get(int64_t rows, Make&& make) {
    auto it = by_rows.find(rows);
    if (it != by_rows.end()) return it->second;
    dnnl::convolution_forward::primitive_desc pd = make(rows);
    const std::string impl = pd.impl_info_str();
    if (impl.rfind("ref", 0) == 0) throw NoFastKernel{};
    size_t layout = 0;
    while (layout < layouts.size() && layouts[layout] != pd.weights_desc()) ++layout;
    if (layout == layouts.size()) {
      layouts.push_back(pd.weights_desc());
      offsets.push_back(packed_bytes);
      packed_bytes += (pd.weights_desc().get_size() + 63) / 64 * 64;
    }
    scratch_bytes = std::max(scratch_bytes, pd.scratchpad_desc().get_size());
    prims.emplace_back(pd);
    impls.push_back(impl);
    weight_layout.push_back(layout);
    srcs.push_back(pd.src_desc());
    dsts.push_back(pd.dst_desc());
    by_rows.emplace(rows, prims.size() - 1);
    return prims.size() - 1;
  }

  /*! \brief Names the packed weights (the planner shares transformed values by name). */
  std::string Describe(const char* what) const {
    std::string name = std::string(what) + " weights packed for " + std::to_string(prims.size()) + " strip height(s):";
    for (const memory::desc& md : layouts) name += " " + DescribeDesc(md);
    return name;
  }

  /*! \brief The transform that fills the packed weights: one reorder per layout. */
  HostFn PackWeights(const dnnl::engine& engine, const memory::desc& plain) const {
    const std::vector<memory::desc> to = layouts;
    const std::vector<size_t> at = offsets;
    return [engine, plain, to, at](const std::vector<void*>& ptrs) {
      dnnl::stream stream(engine);
      dnnl::memory from(plain, engine, ptrs[0]);
      for (size_t i = 0; i < to.size(); ++i) {
        dnnl::memory dst(to[i], engine, static_cast<char*>(ptrs[1]) + at[i]);
        dnnl::reorder(from, dst).execute(stream, from, dst);
      }
      stream.wait();
    };
  }
};

/*! \brief Everything a call needs, shared read-only by all calls (the kernel object goes away after planning). */
struct Plan {
  std::string label;
  dnnl::engine engine;
  int threads = 1;
  int64_t c = 0, k = 0, h = 0, w = 0, oh = 0, ow = 0;
  bool expand_bias = false, depthwise_bias = false;
  StripConvs expand, depthwise;
  std::vector<std::vector<StripOp>> schedule;  // per thread
  size_t buffer_bytes = 0;   // one thread's strip buffer
  size_t thread_bytes = 0;   // strip buffer + scratchpad, 64-byte aligned

  size_t row_floats() const { return static_cast<size_t>(w * k); }

  void RunThread(int t, const float* x, const void* w_expand, const float* b_expand, const void* w_dw,
                 const float* b_dw, char* temp, float* out) const {
    dnnl::stream stream(engine);
    float* buffer = reinterpret_cast<float*>(temp + static_cast<size_t>(t) * thread_bytes);
    void* scratch = temp + static_cast<size_t>(t) * thread_bytes + buffer_bytes;
    const dnnl::memory::desc scratch_md =
        PlainDesc({static_cast<int64_t>(std::max<size_t>(4, std::max(expand.scratch_bytes, depthwise.scratch_bytes)) / 4)});
    dnnl::memory scratch_mem(scratch_md, engine, scratch);
    auto run = [&](const StripConvs& conv, size_t p, void* src, const void* wei, const float* bias, void* dst) {
      dnnl::memory s(conv.srcs[p], engine, src), d(conv.dsts[p], engine, dst);
      dnnl::memory wm(conv.layouts[conv.weight_layout[p]], engine,
                      const_cast<char*>(static_cast<const char*>(wei)) + conv.offsets[conv.weight_layout[p]]);
      std::vector<dnnl_exec_arg_t> args{{DNNL_ARG_SRC, s.get()},
                                        {DNNL_ARG_WEIGHTS, wm.get()},
                                        {DNNL_ARG_DST, d.get()},
                                        {DNNL_ARG_SCRATCHPAD, scratch_mem.get()}};
      dnnl::memory bm;
      if (bias != nullptr) {
        bm = dnnl::memory(PlainDesc({k}), engine, const_cast<float*>(bias));
        args.push_back({DNNL_ARG_BIAS, bm.get()});
      }
      const dnnl_status_t status =
          dnnl_primitive_execute(conv.prims[p].get(), stream.get(), static_cast<int>(args.size()), args.data());
      if (status != dnnl_success) {
        throw std::runtime_error("oneDNN failed to execute " + conv.impls[p] + " (status " +
                                 std::to_string(static_cast<int>(status)) + ")");
      }
    };
    const size_t row = row_floats();
    for (const StripOp& op : schedule[t]) {
      switch (op.kind) {
        case StripOp::kExpand:
          run(expand, op.prim, const_cast<float*>(x) + static_cast<size_t>((op.image * h + op.row) * w * c), w_expand,
              expand_bias ? b_expand : nullptr, buffer + static_cast<size_t>(op.at) * row);
          break;
        case StripOp::kZero:
          std::memset(buffer + static_cast<size_t>(op.at) * row, 0, sizeof(float) * row * static_cast<size_t>(op.count));
          break;
        case StripOp::kShift:
          std::memmove(buffer, buffer + static_cast<size_t>(op.row) * row, sizeof(float) * row * static_cast<size_t>(op.count));
          break;
        case StripOp::kDepthwise:
          run(depthwise, op.prim, buffer, w_dw, depthwise_bias ? b_dw : nullptr,
              out + static_cast<size_t>((op.image * oh + op.row) * ow * k));
          break;
      }
    }
    stream.wait();
  }

  void Run(const std::vector<void*>& p) const {
    size_t i = 0;
    const float* x = static_cast<const float*>(p[i++]);
    const void* w_expand = p[i++];
    const float* b_expand = expand_bias ? static_cast<const float*>(p[i++]) : nullptr;
    const void* w_dw = p[i++];
    const float* b_dw = depthwise_bias ? static_cast<const float*>(p[i++]) : nullptr;
    char* temp = static_cast<char*>(p[i++]);
    float* out = static_cast<float*>(p[i]);
    std::mutex mu;
    std::string error;
#pragma omp parallel num_threads(threads)
    {
      // The team may be smaller than asked (nested calls): every band still runs.
      for (int t = omp_get_thread_num(); t < threads; t += omp_get_num_threads()) {
        try {
          RunThread(t, x, w_expand, b_expand, w_dw, b_dw, temp, out);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          if (error.empty()) error = e.what();
        }
      }
    }
    if (!error.empty()) TVM_FFI_THROW(RuntimeError) << label << ": " << error;
  }
};

class ExpandDepthwiseKernel : public Kernel {
 public:
  ExpandDepthwiseKernel(std::shared_ptr<const Plan> plan, std::vector<OperandLayout> inputs, OperandLayout output)
      : plan_(std::move(plan)) {
    inputs_ = std::move(inputs);
    output_ = std::move(output);
    temps_ = {PlainDesc({static_cast<int64_t>(plan_->thread_bytes * plan_->threads / 4)})};
  }

  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& temps) const override {
    Step step;
    step.label = plan_->label;
    step.op = "conv2d";
    step.impl = "strips of " + plan_->expand.impls.front() + " + " + plan_->depthwise.impls.front() + " on " +
                std::to_string(plan_->threads) + " thread(s)";
    std::shared_ptr<const Plan> plan = plan_;
    step.host = [plan](const std::vector<void*>& ptrs) { plan->Run(ptrs); };
    int position = 0;
    for (const MemRef& in : inputs) step.args.emplace_back(position++, in);
    step.args.emplace_back(position++, temps[0]);
    step.args.emplace_back(position, output);
    return {std::move(step)};
  }

 private:
  std::shared_ptr<const Plan> plan_;
};

/*! \brief Whether the two convs qualify (shapes and attrs only). */
bool Qualifies(const ConvParams& e, const ConvParams& d) {
  const bool pointwise = e.kh == 1 && e.kw == 1 && e.strides[0] == 1 && e.strides[1] == 1 && e.pad_top == 0 &&
                         e.pad_left == 0 && e.pad_bottom == 0 && e.pad_right == 0 && e.groups == 1 &&
                         !e.epilogue.residual;
  const bool depthwise = d.groups == d.c && d.k == d.c && d.c == e.k && !d.epilogue.residual;
  return pointwise && depthwise && e.n == d.n && e.h == d.h && e.w == d.w;
}

/*! \brief Walk each thread's band of output rows in strips of at most `strip` rows. */
void Schedule(Plan& plan, const ConvParams& e, const ConvParams& d, int64_t strip) {
  const int64_t kh_eff = (d.kh - 1) * d.dilation[0] + 1, sh = d.strides[0];
  const int64_t total = d.n * d.oh;
  const dnnl::engine& engine = plan.engine;
  auto make_expand = [&](int64_t rows) {
    return dnnl::convolution_forward::primitive_desc(
        engine, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, Nhwc({1, e.c, rows, e.w}),
        AnyDesc({e.k, e.c, 1, 1}), e.has_bias ? PlainDesc({e.k}) : memory::desc(), Nhwc({1, e.k, rows, e.w}),
        {1, 1}, {0, 0}, {0, 0}, {0, 0}, [&] {
          dnnl::primitive_attr attr;
          attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
          dnnl::post_ops ops;
          if (!e.epilogue.act.none()) ops.append_eltwise(e.epilogue.act.alg, e.epilogue.act.alpha, e.epilogue.act.beta);
          if (ops.len() > 0) attr.set_post_ops(ops);
          return attr;
        }());
  };
  auto make_depthwise = [&](int64_t out_rows) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::post_ops ops;
    if (!d.epilogue.act.none()) ops.append_eltwise(d.epilogue.act.alg, d.epilogue.act.alpha, d.epilogue.act.beta);
    if (ops.len() > 0) attr.set_post_ops(ops);
    const int64_t in_rows = (out_rows - 1) * sh + kh_eff;
    return dnnl::convolution_forward::primitive_desc(
        engine, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, Nhwc({1, d.c, in_rows, d.w}),
        AnyDesc({d.k, 1, 1, d.kh, d.kw}), d.has_bias ? PlainDesc({d.k}) : memory::desc(),
        Nhwc({1, d.k, out_rows, d.ow}), {sh, d.strides[1]}, {d.dilation[0] - 1, d.dilation[1] - 1},
        {0, d.pad_left}, {0, d.pad_right}, attr);
  };
  plan.schedule.assign(static_cast<size_t>(plan.threads), {});
  for (int t = 0; t < plan.threads; ++t) {
    const int64_t begin = total * t / plan.threads, end = total * (t + 1) / plan.threads;
    std::vector<StripOp>& ops = plan.schedule[static_cast<size_t>(t)];
    int64_t prev_image = -1, prev_lo = 0, prev_hi = 0;
    for (int64_t g = begin; g < end;) {
      const int64_t image = g / d.oh, o0 = g % d.oh;
      const int64_t rows = std::min({strip, end - g, d.oh - o0});
      const int64_t lo = o0 * sh - d.pad_top, hi = (o0 + rows - 1) * sh - d.pad_top + kh_eff;
      int64_t from = lo;
      if (image == prev_image && prev_hi > lo && lo >= prev_lo) {
        ops.push_back({StripOp::kShift, image, lo - prev_lo, prev_hi - lo, 0, 0});
        from = prev_hi;
      }
      // Rows [from, hi): zero above the image, computed inside it, zero below it.
      const int64_t top = std::min(hi, int64_t{0}), bottom = std::max(from, e.h);
      if (top > from) ops.push_back({StripOp::kZero, image, from, top - from, from - lo, 0});
      const int64_t first = std::max(from, int64_t{0}), last = std::min(hi, e.h);
      if (last > first) {
        ops.push_back({StripOp::kExpand, image, first, last - first, first - lo, plan.expand.Get(last - first, make_expand)});
      }
      if (hi > bottom) ops.push_back({StripOp::kZero, image, bottom, hi - bottom, bottom - lo, 0});
      ops.push_back({StripOp::kDepthwise, image, o0, rows, 0, plan.depthwise.Get(rows, make_depthwise)});
      prev_image = image;
      prev_lo = lo;
      prev_hi = hi;
      g += rows;
    }
  }
  plan.buffer_bytes = static_cast<size_t>(((strip - 1) * sh + kh_eff) * e.w * e.k) * sizeof(float);
  plan.buffer_bytes = (plan.buffer_bytes + 63) / 64 * 64;
  const size_t scratch = std::max(plan.expand.scratch_bytes, plan.depthwise.scratch_bytes);
  plan.thread_bytes = plan.buffer_bytes + (std::max<size_t>(scratch, 64) + 63) / 64 * 64;
}

}  // namespace

std::unique_ptr<Kernel> TryBuildExpandDepthwise(const KernelContext& expand_ctx, const KernelContext& depthwise_ctx,
                                                int threads) {
  const std::string mode = EnvOr("BYOC_HETERO_DEPTHWISE_FUSION", "auto");
  if (mode == "off") return nullptr;
  if (mode != "auto" && mode != "on") {
    expand_ctx.Fail("BYOC_HETERO_DEPTHWISE_FUSION must be auto, on or off, got '" + mode + "'");
  }
  if (expand_ctx.node().op != "conv2d" || depthwise_ctx.node().op != "conv2d") return nullptr;
  const ConvParams e = ReadConv2D(expand_ctx), d = ReadConv2D(depthwise_ctx);
  if (!Qualifies(e, d)) return nullptr;
  const memory::dims src_dims{e.n, e.c, e.h, e.w};
  // auto: only when the data already is nhwc (what the neighbouring brgemm convolutions write);
  // elsewhere a reorder to nhwc would eat the gain.
  if (mode == "auto" && expand_ctx.InputLayout(0) != Nhwc(src_dims)) return nullptr;

  auto plan = std::make_shared<Plan>();
  plan->label = expand_ctx.where() + " + node " + std::to_string(depthwise_ctx.node_index) +
                " (conv2d): 1x1 expand + depthwise in row strips";
  plan->engine = expand_ctx.engine;
  plan->threads = std::max(1, threads);
  plan->c = e.c;
  plan->k = e.k;
  plan->h = e.h;
  plan->w = e.w;
  plan->oh = d.oh;
  plan->ow = d.ow;
  plan->expand_bias = e.has_bias;
  plan->depthwise_bias = d.has_bias;
  const int64_t kh_eff = (d.kh - 1) * d.dilation[0] + 1;
  const int64_t row_bytes = e.w * e.k * static_cast<int64_t>(sizeof(float));
  const int64_t budget = std::stoll(EnvOr("BYOC_HETERO_STRIP_KB", "256")) << 10;
  const int64_t strip = std::max<int64_t>(1, (budget / row_bytes - kh_eff) / d.strides[0] + 1);
  try {
    OmpThreadsScope one(1);  // each strip runs on one thread: its primitives are built for one
    Schedule(*plan, e, d, strip);
  } catch (const dnnl::error&) {
    return nullptr;  // a strip shape oneDNN cannot run: run the two convs apart
  } catch (const NoFastKernel&) {
    return nullptr;  // or has no fast kernel for
  }

  std::vector<OperandLayout> inputs;
  inputs.push_back({PlainDesc(src_dims), Nhwc(src_dims)});
  const memory::desc expand_weights = PlainDesc({e.k, e.c, 1, 1});
  OperandLayout we{expand_weights, PlainDesc({static_cast<int64_t>(plan->expand.packed_bytes / 4)})};
  we.transform = plan->expand.PackWeights(plan->engine, expand_weights);
  we.transform_name = plan->expand.Describe("expand");
  inputs.push_back(std::move(we));
  if (e.has_bias) inputs.push_back({PlainDesc({e.k}), PlainDesc({e.k})});
  const memory::desc dw_weights = PlainDesc({d.k, 1, 1, d.kh, d.kw});  // goihw: the same bytes as OIHW
  OperandLayout wd{dw_weights, PlainDesc({static_cast<int64_t>(plan->depthwise.packed_bytes / 4)})};
  wd.transform = plan->depthwise.PackWeights(plan->engine, dw_weights);
  wd.transform_name = plan->depthwise.Describe("depthwise");
  inputs.push_back(std::move(wd));
  if (d.has_bias) inputs.push_back({PlainDesc({d.k}), PlainDesc({d.k})});
  const memory::dims dst_dims{d.n, d.k, d.oh, d.ow};
  return std::make_unique<ExpandDepthwiseKernel>(std::move(plan), std::move(inputs),
                                                 OperandLayout{PlainDesc(dst_dims), Nhwc(dst_dims)});
}

}  // namespace byoc_hetero
