/*!
 * \file executor.cc
 * \brief See executor.h.
 */
#include "executor.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "slab_fold.h"
#include "threading.h"

namespace byoc_hetero {

namespace {
struct Counter {
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> nanos{0};
};
}  // namespace

/*! \brief The primitives of one of the plan's programs and their timings. */
struct Executor::Program {
  const std::vector<PlannedStep>* steps = nullptr;
  std::vector<dnnl::primitive> prims;  // per step; empty for host steps (and skipped init steps)
  std::unique_ptr<Counter[]> counters;
  const char* phase;

  Program(const std::vector<PlannedStep>& s, const char* p)
      : steps(&s), prims(s.size()), counters(std::make_unique<Counter[]>(s.size())), phase(p) {}
  void MakePrimitives(const std::vector<bool>* skip) {
    for (size_t i = 0; i < steps->size(); ++i) {
      const PlannedStep& s = (*steps)[i];
      if (s.host || (skip != nullptr && (*skip)[i])) continue;
      prims[i] = GuardDnnl(s.label, "create the primitive", [&] { return dnnl::primitive(s.pd.get()); });
    }
  }
};

/*! \brief Everything a running call writes. */
struct Executor::Context {
  dnnl::stream stream;
  AlignedBuffer arena;  // the private buffers, at their plan offsets
  AlignedBuffer scratch;
  struct Bound {
    std::vector<dnnl::memory> mems;
    std::vector<dnnl_exec_arg_t> cargs;
    std::vector<void*> ptrs;  // host steps
  };
  std::vector<Bound> execs;
  std::vector<std::pair<int, dnnl::memory>> bindings;  // (run/const arg position, memory)
  int64_t bytes = 0;
};

Executor::Executor(std::shared_ptr<const Plan> plan, const dnnl::engine& engine, std::vector<void*> weights)
    : plan_(std::move(plan)), engine_(engine), weights_(std::move(weights)) {
  init_ = std::make_unique<Program>(plan_->init_steps, "init");
  run_ = std::make_unique<Program>(plan_->run_steps, "run");
  OmpThreadsScope omp(plan_->threads);
  GuardDnnl(plan_->where, "allocate buffers or create a primitive", [&] {
    run_->MakePrimitives(nullptr);
    std::unique_ptr<Context> first = MakeContext(*run_, plan_->run_scratch_bytes, /*with_private=*/true, weights_);
    context_bytes_ = first->bytes;
    pool_.push_back(std::move(first));
  });
  contexts_created_ = 1;
}

Executor::~Executor() = default;

std::unique_ptr<Executor::Context> Executor::MakeContext(const Program& prog, size_t scratch_bytes,
                                                         bool with_private,
                                                         const std::vector<void*>& weights) const {
  const Plan& p = *plan_;
  auto ctx = std::make_unique<Context>();
  ctx->stream = dnnl::stream(engine_);
  if (with_private) {
    ctx->arena = AlignedBuffer(p.arena_bytes, p.where + " (intermediates)");
    ctx->bytes += static_cast<int64_t>(p.arena_bytes);
  }
  ctx->scratch = AlignedBuffer(scratch_bytes, p.where + " (scratchpad)");
  ctx->bytes += static_cast<int64_t>(scratch_bytes);
  for (const PlannedStep& s : *prog.steps) {
    Context::Bound b;
    for (const auto& [arg, ref] : s.args) {
      const Slot& slot = p.slots[ref.slot];
      void* ptr = nullptr;
      switch (slot.kind) {
        case SlotKind::kShared:
          ptr = weights[slot.index];
          break;
        case SlotKind::kPrivate:
          if (!with_private) {
            TVM_FFI_THROW(InternalError) << p.where << ": step '" << s.label
                                         << "' of the init program uses a per-call buffer";
          }
          ptr = static_cast<char*>(ctx->arena.get()) + p.privates[slot.index].offset;
          break;
        case SlotKind::kScratch:
          ptr = ctx->scratch.get();
          break;
        default:
          break;  // bound per call
      }
      dnnl::memory mem(ref.md, engine_, ptr);
      if (slot.kind == SlotKind::kRunArg || slot.kind == SlotKind::kConstArg) {
        ctx->bindings.emplace_back(slot.index, mem);
      }
      b.mems.push_back(mem);
      b.cargs.push_back({arg, mem.get()});
    }
    b.ptrs.resize(b.mems.size());
    ctx->execs.push_back(std::move(b));
  }
  return ctx;
}

void Executor::RunProgram(const Program& prog, Context& ctx, const std::vector<bool>* skip,
                          const std::function<void(size_t)>& after, const std::function<bool(size_t)>& instead) {
  const bool timed = profiling_.load(std::memory_order_relaxed);
  const std::vector<PlannedStep>& steps = *prog.steps;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (skip != nullptr && (*skip)[i]) continue;
    if (instead && instead(i)) {
      if (after) after(i);
      continue;
    }
    const PlannedStep& s = steps[i];
    Context::Bound& b = ctx.execs[i];
    std::chrono::steady_clock::time_point start;
    if (timed) start = std::chrono::steady_clock::now();
    if (s.host) {
      for (size_t k = 0; k < b.mems.size(); ++k) b.ptrs[k] = b.mems[k].get_data_handle();
      s.host(b.ptrs);
    } else {
      dnnl_status_t status = dnnl_primitive_execute(prog.prims[i].get(), ctx.stream.get(),
                                                    static_cast<int>(b.cargs.size()), b.cargs.data());
      if (status != dnnl_success) {
        TVM_FFI_THROW(RuntimeError) << s.label << ": oneDNN failed to execute (" << DnnlStatusName(status) << ")";
      }
    }
    if (timed) {
      const auto ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
      prog.counters[i].calls.fetch_add(1, std::memory_order_relaxed);
      prog.counters[i].nanos.fetch_add(ns, std::memory_order_relaxed);
    }
    if (after) after(i);
  }
  dnnl_status_t status = dnnl_stream_wait(ctx.stream.get());
  if (status != dnnl_success) {
    TVM_FFI_THROW(RuntimeError) << plan_->where << ": oneDNN failed to wait for the stream ("
                                << DnnlStatusName(status) << ")";
  }
}

namespace {

/*!
 * \brief The init steps to run so that every buffer the run program reads holds its value, given
 *        which buffers do (\p filled), and in \p used the buffers those steps touch.  Backwards:
 *        a step completing a buffer runs when that buffer is wanted and not filled; a step that
 *        completes none (a kernel's temps) when it touches a wanted buffer not filled; every
 *        buffer a running step touches is wanted (its inputs must hold their values).
 */
std::vector<bool> InitStepsToRun(const Plan& p, const std::vector<bool>& filled, std::vector<bool>* used) {
  std::vector<bool> want(p.shared.size());
  for (size_t b = 0; b < want.size(); ++b) want[b] = p.shared[b].run;
  auto pending = [&](int b) { return want[b] && !filled[b]; };
  std::vector<bool> run(p.init_steps.size(), false);
  for (size_t i = p.init_steps.size(); i-- > 0;) {
    const PlannedStep& s = p.init_steps[i];
    std::vector<int> touched;
    for (const auto& [arg, ref] : s.args) {
      if (p.slots[ref.slot].kind == SlotKind::kShared) touched.push_back(p.slots[ref.slot].index);
    }
    bool needed = s.writes >= 0 && pending(s.writes);
    for (int b : touched) needed = needed || (s.writes < 0 && pending(b));
    if (!needed) continue;
    run[i] = true;
    for (int b : touched) want[b] = true;
  }
  used->assign(p.shared.size(), false);
  for (size_t i = 0; i < run.size(); ++i) {
    if (!run[i]) continue;
    for (const auto& [arg, ref] : p.init_steps[i].args) {
      if (p.slots[ref.slot].kind == SlotKind::kShared) (*used)[p.slots[ref.slot].index] = true;
    }
  }
  return run;
}

/*! \brief Per init step, what it is the last running step to touch (the first call's peak was the
 *         prepared weights plus every layer's folded intermediate and every constant's pages). */
struct InitLastUses {
  std::vector<std::vector<size_t>> shared;  // buffers PreparedWeights::DiscardInitOnly may hand back
  std::vector<std::vector<std::pair<size_t, size_t>>> constants;  // (constant, bytes read): ReleaseFilePages
};

InitLastUses LastInitUses(const Plan& p, const std::vector<bool>& run) {
  std::vector<int> last(p.shared.size(), -1), last_const(p.num_constants, -1);
  std::vector<size_t> const_bytes(p.num_constants, 0);
  for (size_t i = 0; i < run.size(); ++i) {
    if (!run[i]) continue;
    for (const auto& [arg, ref] : p.init_steps[i].args) {
      const Slot& slot = p.slots[ref.slot];
      if (slot.kind == SlotKind::kShared) last[slot.index] = static_cast<int>(i);
      if (slot.kind == SlotKind::kConstArg && static_cast<size_t>(slot.index) < last_const.size()) {
        last_const[slot.index] = static_cast<int>(i);
        const_bytes[slot.index] = std::max(const_bytes[slot.index], ref.md.get_size());
      }
    }
  }
  InitLastUses out{std::vector<std::vector<size_t>>(run.size()),
                   std::vector<std::vector<std::pair<size_t, size_t>>>(run.size())};
  for (size_t b = 0; b < last.size(); ++b) {
    if (last[b] >= 0) out.shared[last[b]].push_back(b);
  }
  for (size_t c = 0; c < last_const.size(); ++c) {
    if (last_const[c] >= 0) out.constants[last_const[c]].emplace_back(c, const_bytes[c]);
  }
  return out;
}

}  // namespace

void Executor::PointAtConstants(const PreparedWeights& store) {
  const Plan& p = *plan_;
  bool any = false;
  for (size_t b = 0; b < p.shared.size(); ++b) {
    if (p.shared[b].constant < 0) continue;
    weights_[b] = store.Constant(p, b);
    any = true;
  }
  if (!any) return;
  std::lock_guard<std::mutex> lock(pool_mu_);
  for (const auto& ctx : pool_) {
    for (size_t i = 0; i < p.run_steps.size(); ++i) {
      const auto& args = p.run_steps[i].args;
      for (size_t k = 0; k < args.size(); ++k) {
        const Slot& slot = p.slots[args[k].second.slot];
        if (slot.kind == SlotKind::kShared && p.shared[slot.index].constant >= 0) {
          ctx->execs[i].mems[k].set_data_handle(weights_[slot.index]);
        }
      }
    }
  }
}

void Executor::FillWeights(PreparedWeights& store) {
  const Plan& p = *plan_;
  const std::vector<const void*>& constants = store.constants();
  if (constants.size() != p.num_constants) {
    TVM_FFI_THROW(InternalError) << p.where << ": FillWeights got " << constants.size() << " buffers for "
                                 << p.num_constants << " constants";
  }
  // A step whose weight another plan (or an earlier load) already filled is skipped, and so is one
  // only such steps read from; init-only buffers are allocated for this call (weights.h).
  std::vector<bool> used;
  const std::vector<bool> run = InitStepsToRun(p, store.Filled(p), &used);
  std::vector<bool> skip(run.size());
  for (size_t i = 0; i < run.size(); ++i) skip[i] = !run[i];
  const std::vector<void*> weights = store.ForInit(p, used);
  PointAtConstants(store);
  OmpThreadsScope omp(p.threads);
  // The init primitives and context live for this call only: they run once per set of constants.
  // a constant folded into a dense's weight and reordered runs a slab at a time (slab_fold.h): the binary step is
  // skipped, and the reorder's place runs both
  const std::map<size_t, SlabFold> folds =
      GuardDnnl(p.where, "plan the slab folds", [&] { return SlabFolds(p, run, engine_, InitSlabBytes()); });
  std::vector<bool> no_primitive = skip;
  for (const auto& [j, f] : folds) {
    skip[f.binary] = true;
    no_primitive[f.binary] = true;
    no_primitive[j] = true;
  }
  std::unique_ptr<Context> ctx;
  GuardDnnl(p.where, "allocate buffers or create a primitive", [&] {
    init_->MakePrimitives(&no_primitive);
    ctx = MakeContext(*init_, p.init_scratch_bytes, /*with_private=*/false, weights);
  });
  for (auto& [index, mem] : ctx->bindings) mem.set_data_handle(const_cast<void*>(constants[index]));
  // an init-only intermediate (an RMSNorm weight folded into a dense, before its reorder) hands its pages
  // back once its last reader ran, and so do the pages of a constant mapped read-only from a file (a
  // weights file: bh.llm), read again from it if a later plan wants them: neither the intermediates nor
  // the constants are all resident at once beside the prepared copy
  const InitLastUses last = LastInitUses(p, run);
  const std::vector<std::pair<uintptr_t, uintptr_t>> mapped = ReadOnlyFileMappings();
  auto discard = [&](size_t i) {
    if (last.shared[i].empty() && last.constants[i].empty()) return;
    if (dnnl_stream_wait(ctx->stream.get()) != dnnl_success) return;  // RunProgram's own wait reports it
    for (size_t b : last.shared[i]) store.DiscardInitOnly(p, b);
    for (const auto& [c, bytes] : last.constants[i]) ReleaseFilePages(constants[c], bytes, mapped);
  };
  auto slabs = [&](size_t j) {
    const auto it = folds.find(j);
    if (it == folds.end()) return false;
    RunSlabs(it->second, *ctx, mapped);
    discard(it->second.binary);  // what the skipped binary step read last
    return true;
  };
  try {
    RunProgram(*init_, *ctx, &skip, discard, slabs);
  } catch (...) {
    init_->prims.assign(init_->prims.size(), dnnl::primitive());
    throw;
  }
  init_->prims.assign(init_->prims.size(), dnnl::primitive());
  std::vector<bool> done(p.shared.size(), false);
  for (size_t i = 0; i < run.size(); ++i) {
    if (run[i] && p.init_steps[i].writes >= 0) done[p.init_steps[i].writes] = true;
  }
  store.MarkFilled(p, done);
}

void Executor::RunSlabs(const SlabFold& fold, Context& ctx,
                        const std::vector<std::pair<uintptr_t, uintptr_t>>& mapped) {
  auto handle = [&](size_t step, int arg) -> void* {
    const auto& args = plan_->init_steps[step].args;
    for (size_t k = 0; k < args.size(); ++k) {
      if (args[k].first == arg) return ctx.execs[step].mems[k].get_data_handle();
    }
    return nullptr;
  };
  void* const src[2] = {handle(fold.binary, DNNL_ARG_SRC_0), handle(fold.binary, DNNL_ARG_SRC_1)};
  void* to = handle(fold.reorder, DNNL_ARG_TO);
  GuardDnnl(plan_->init_steps[fold.reorder].label, "fold a weight a slab at a time",
            [&] { RunSlabFold(fold, engine_, ctx.stream, src, to, mapped); });
}

void Executor::Run(const std::vector<void*>& buffers) {
  if (buffers.size() != plan_->num_buffers()) {
    TVM_FFI_THROW(InternalError) << plan_->where << ": Execute got " << buffers.size() << " buffers, expected "
                                 << plan_->num_buffers();
  }
  std::unique_ptr<Context> ctx;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!pool_.empty()) {
      ctx = std::move(pool_.back());
      pool_.pop_back();
    }
  }
  if (!ctx) {
    contexts_created_.fetch_add(1);
    ctx = MakeContext(*run_, plan_->run_scratch_bytes, /*with_private=*/true, weights_);
  }
  struct GiveBack {
    Executor& e;
    std::unique_ptr<Context>& ctx;
    ~GiveBack() {
      std::lock_guard<std::mutex> lock(e.pool_mu_);
      e.pool_.push_back(std::move(ctx));
    }
  } give_back{*this, ctx};
  for (auto& [index, mem] : ctx->bindings) mem.set_data_handle(buffers[index]);
  OmpThreadsScope omp(plan_->threads);
  ExecutionSlot slot(plan_->threads);
  RunProgram(*run_, *ctx, nullptr);
}

std::vector<StepProfile> Executor::Profile() const {
  std::vector<StepProfile> out;
  for (const Program* prog : {init_.get(), run_.get()}) {
    for (size_t i = 0; i < prog->steps->size(); ++i) {
      const PlannedStep& s = (*prog->steps)[i];
      StepProfile p{prog->phase, s.label, s.op, s.impl, s.layouts};
      p.calls = prog->counters[i].calls.load();
      p.seconds = static_cast<double>(prog->counters[i].nanos.load()) * 1e-9;
      out.push_back(std::move(p));
    }
  }
  return out;
}

void Executor::ResetProfile() {
  for (Program* prog : {init_.get(), run_.get()}) {
    for (size_t i = 0; i < prog->steps->size(); ++i) {
      prog->counters[i].calls = 0;
      prog->counters[i].nanos = 0;
    }
  }
}

}  // namespace byoc_hetero
