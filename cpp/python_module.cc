/*!
 * \file python_module.cc
 * \brief The pybind11 module byoc_hetero._C: build information and small introspection helpers.
 *
 * The runtime itself is reached through TVM globals (see region_module.h), which this shared
 * library registers when it is loaded.
 */
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "digest.h"
#include "enums.h"
#include "kernels/kernel.h"
#include "kernels/winograd.h"
#include "executor.h"
#include "compiled_region.h"
#include "planner.h"
#include "py_errors.h"
#include "region_graph.h"
#include "threading.h"

namespace py = pybind11;

namespace {

std::string OneDnnVersion() {
  const dnnl_version_t* v = dnnl::version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

std::string IsaName(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx2_vnni_2:
      return "avx2_vnni_2";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_fp16:
      return "avx512_core_fp16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_amx_fp16:
      return "avx512_core_amx_fp16";
    case dnnl::cpu_isa::isa_default:
      return "default";
  }
  return "unknown(" + std::to_string(static_cast<int>(isa)) + ")";
}

py::dict StepDict(const byoc_hetero::PlannedStep& s) {
  return py::dict(py::arg("label") = s.label, py::arg("op") = s.op, py::arg("impl") = s.impl,
                  py::arg("layouts") = s.layouts, py::arg("writes") = s.writes);
}

/*! \brief A plan as Python data (for tests and inspection; nothing is executed). */
py::dict PlanDict(const byoc_hetero::Plan& plan) {
  py::dict d;
  d["symbol"] = plan.symbol;
  d["threads"] = plan.threads;
  d["precision"] = plan.precision;
  d["precision_note"] = plan.precision_note;
  d["input_shapes"] = plan.input_shapes;
  d["output_shapes"] = plan.output_shapes;
  d["slots"] = plan.slots.size();
  d["arena_bytes"] = plan.arena_bytes;
  d["init_scratch_bytes"] = plan.init_scratch_bytes;
  d["run_scratch_bytes"] = plan.run_scratch_bytes;
  d["shared_bytes"] = plan.shared_bytes();
  py::list shared, priv, init, run;
  for (const auto& b : plan.shared) shared.append(py::dict(py::arg("key") = b.key, py::arg("bytes") = b.bytes, py::arg("run") = b.run,
                                             py::arg("constant") = b.constant));
  for (const auto& b : plan.privates) {
    priv.append(py::dict(py::arg("bytes") = b.bytes, py::arg("offset") = b.offset, py::arg("first") = b.first,
                         py::arg("last") = b.last, py::arg("padded") = b.padded));
  }
  for (const auto& s : plan.init_steps) init.append(StepDict(s));
  for (const auto& s : plan.run_steps) run.append(StepDict(s));
  d["shared"] = shared;
  d["private"] = priv;
  d["init_steps"] = init;
  d["run_steps"] = run;
  return d;
}

byoc_hetero::PlanRequest Request(const std::optional<std::vector<std::vector<int64_t>>>& input_shapes,
                                 std::optional<int> threads) {
  byoc_hetero::PlanRequest request;
  if (input_shapes) request.input_shapes = *input_shapes;
  request.threads = threads ? *threads : byoc_hetero::RegionThreads();
  request.max_bytes = byoc_hetero::PhysicalMemoryBytes();
  if (request.threads < 1) throw py::value_error("threads must be >= 1");
  return request;
}

/*! \brief A dict of named counters (the stats functions below). */
py::dict Counters(std::initializer_list<std::pair<const char*, int64_t>> items) {
  py::dict d;
  for (const auto& [name, value] : items) d[name] = value;
  return d;
}

/*! \brief The runtime's facts: versions, ISA, kernels and their traits, precisions, enums, validation. */
void DefineInfo(py::module_& m) {
  m.def(
      "digest",
      [](const pybind11::array& data) {
        if (!(data.flags() & pybind11::array::c_style)) throw pybind11::value_error("digest: expected C-contiguous data");
        const void* ptr = data.data();
        const size_t bytes = static_cast<size_t>(data.nbytes());
        pybind11::gil_scoped_release release;
        return byoc_hetero::DigestHex(byoc_hetero::Digest(ptr, bytes));
      },
      pybind11::arg("data"),
      "The integrity digest (16 hex digits, cpp/digest.h) of a C-contiguous array's bytes, as region "
      "documents record it for each constant.");
  m.def("onednn_version", &OneDnnVersion, "oneDNN version of the loaded library, e.g. '3.2.0'.");
  m.def("onednn_commit", []() { return std::string(dnnl::version()->hash); },
        "Git hash of the loaded oneDNN build.");
  m.def("isa", []() { return IsaName(dnnl::get_effective_cpu_isa()); },
        "Effective CPU ISA oneDNN dispatches to (e.g. 'avx512_core').");
  m.def("kernels", &byoc_hetero::SupportedOps, "Node ops the runtime can execute.");
  m.def(
      "kernel_traits",
      []() {
        py::dict out;
        for (const std::string& op : byoc_hetero::SupportedOps()) {
          const byoc_hetero::KernelTraits& t = byoc_hetero::FindKernelTraits(op);
          py::dict d;
          d["bf16_input"] = t.bf16_input != nullptr;
          d["joins_inputs"] = t.joins_inputs_along != nullptr;
          d["accepts_int8"] = t.accepts_int8;
          d["dynamic_int8_source"] = t.dynamic_int8_source;
          d["accepts_float16"] = t.accepts_float16;
          d["writes_inputs"] = t.writes_inputs;
          d["strided_input"] = t.strided_input != nullptr;
          out[py::str(op)] = d;
        }
        return out;
      },
      "Per op, what its kernel declared when it registered (kernel.h, KernelTraits): bf16_input (it "
      "says how a bf16 region reads its inputs), joins_inputs (its output is its inputs laid end to "
      "end, planned in place), accepts_int8, dynamic_int8_source, accepts_float16, writes_inputs, "
      "strided_input (it says how it reads a value held under strides: a slice is viewed only where "
      "every reader reads it in place).");
  m.def("winograd_auto_max_taps", &byoc_hetero::WinogradAutoMaxTaps,
        "The most input taps (C x 3 x 3) a conv2d may have for algorithm 'auto' to run Winograd "
        "F(4x4, 3x3): above it float32 would drift past 1e-5 of float64, so 'auto' runs direct.");
  m.def("bf16_native", &byoc_hetero::Bf16Native,
        "Whether oneDNN runs bf16 natively here (effective ISA avx512_core_bf16 or later).");
  m.def(
      "effective_precision",
      [](const std::string& requested) {
        if (requested != byoc_hetero::kPrecisionF32 && requested != byoc_hetero::kPrecisionBf16) {
          throw py::value_error("precision must be 'f32' or 'bf16', got '" + requested + "'");
        }
        std::string reason;
        std::string effective = byoc_hetero::EffectivePrecision(requested, &reason);
        return py::make_tuple(effective, reason);
      },
      py::arg("requested"),
      "(precision a region requesting `requested` computes in now, why it differs or ''); reads "
      "BYOC_HETERO_BF16 (auto | off) as module creation does.");
  m.def("activation_names", &byoc_hetero::ActivationNames,
        "Activation names a region's activation/algorithm attrs may take ('none' first).");
  m.def("enum_names", &byoc_hetero::EnumNames,
        "Every string enum of the region format: {'activation', 'pool_algorithm', "
        "'binary_algorithm', 'dense_weight_layout'} -> names.");
  m.def(
      "validate",
      [](const std::string& graph_json) {
        byoc_hetero::RegionGraph g = byoc_hetero::ParseRegionGraph(graph_json);
        return g.symbol;
      },
      py::arg("graph_json"),
      "Structurally validate a region document (no op checks, no oneDNN); returns its symbol. "
      "Raises ValueError naming the field on failure.");
}

/*! \brief Planning a region without running it, and preparing its weights. */
void DefinePlanning(py::module_& m) {
  m.def(
      "plan_region",
      [](const std::string& graph_json, std::optional<std::vector<std::vector<int64_t>>> input_shapes,
         std::optional<int> threads) {
        const byoc_hetero::RegionGraph g = byoc_hetero::ParseRegionGraph(graph_json);
        const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
        return PlanDict(*byoc_hetero::MakePlan(g, Request(input_shapes, threads), engine));
      },
      py::arg("graph_json"), py::arg("input_shapes") = py::none(), py::arg("threads") = py::none(),
      "Plan a region without running it: {symbol, threads, input_shapes, output_shapes, slots, "
      "arena_bytes, init/run_scratch_bytes, shared_bytes, shared: [{key, bytes, run, constant}], private: [{bytes, "
      "offset, first, last, padded}], init_steps/run_steps: [{label, op, impl, layouts, writes}]}. "
      "input_shapes: one per region input (default: the declared ones). Raises ValueError naming "
      "the node and field for attrs/shapes the ops reject.");
  m.def(
      "prepare_weights",
      [](const std::string& graph_json,
         const std::vector<py::array_t<float, py::array::c_style | py::array::forcecast>>& constants, int plans) {
        const byoc_hetero::RegionGraph g = byoc_hetero::ParseRegionGraph(graph_json);
        if (constants.size() != g.constants.size()) {
          throw py::value_error("prepare_weights: expected " + std::to_string(g.constants.size()) +
                                " constants, got " + std::to_string(constants.size()));
        }
        std::vector<const void*> data;
        for (const auto& c : constants) data.push_back(c.data());
        const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
        byoc_hetero::PreparedWeights store;
        store.SetConstants(data, nullptr);
        py::list init_steps_run;
        for (int i = 0; i < plans; ++i) {
          auto plan = byoc_hetero::MakePlan(g, Request(std::nullopt, std::nullopt), engine);
          byoc_hetero::Executor executor(plan, engine, store.Reserve(*plan));
          executor.SetProfiling(true);
          executor.FillWeights(store);
          int64_t ran = 0;
          for (const auto& p : executor.Profile()) ran += p.phase == "init" ? p.calls : 0;
          init_steps_run.append(ran);
        }
        py::dict d;
        d["buffers"] = store.count();
        d["bytes"] = store.bytes();
        d["init_steps_run"] = init_steps_run;
        return d;
      },
      py::arg("graph_json"), py::arg("constants"), py::arg("plans") = 2,
      "Plan a region `plans` times into one store of prepared weights and fill it from `constants` "
      "(float32 arrays): {buffers, bytes, init_steps_run: per plan}. Shows that plans share weights.");
}

/*! \brief Threads per region call, the plan cache, the admission gate and the adaptation to contention. */
void DefineThreads(py::module_& m) {
  m.def("plan_cache_limit", &byoc_hetero::PlanCacheLimit,
        "Most plans a symbolic region keeps (least recently used evicted): BYOC_HETERO_PLAN_CACHE, default 8.");
  m.def("set_plan_cache_limit", &byoc_hetero::SetPlanCacheLimit, py::arg("n"),
        "Set the plan cache limit (>= 1) for every module, from its next new shape on.");
  m.def("num_threads", &byoc_hetero::RegionThreads,
        "OpenMP threads oneDNN uses per region call, for modules created from now on "
        "(default: BYOC_HETERO_NUM_THREADS, else OMP_NUM_THREADS, else the CPUs available).");
  m.def("set_num_threads", &byoc_hetero::SetRegionThreads, py::arg("n"),
        "Set the threads per region call for modules created from now on (existing modules keep "
        "theirs).");
  m.def("available_cpus", &byoc_hetero::AvailableCpus, "CPUs this process may run on.");
  m.def("max_concurrent_calls", &byoc_hetero::MaxConcurrentCalls, py::arg("threads"),
        "How many region calls of `threads` threads each may execute at once (the admission gate "
        "keeps the busy OpenMP threads within the available CPUs).");
  m.def(
      "concurrency_stats",
      []() {
        byoc_hetero::ConcurrencyStats s = byoc_hetero::GetConcurrencyStats();
        return Counters({{"calls", s.calls},
                         {"waited", s.waited},
                         {"max_active", s.max_active},
                         {"max_active_threads", s.max_active_threads}});
      },
      "Counters of the admission gate since the last reset: calls, waited, max_active, "
      "max_active_threads.");
  m.def("reset_concurrency_stats", &byoc_hetero::ResetConcurrencyStats);
  m.def(
      "thread_adaptation",
      []() { return std::string(byoc_hetero::ThreadAdaptationName(byoc_hetero::GetThreadAdaptation())); },
      "How region calls react to other processes on the cores: 'auto' (default: fewer threads "
      "while calls are found contended), 'off', or 'reduced' (always half the module's threads).");
  m.def(
      "set_thread_adaptation",
      [](const std::string& mode) {
        byoc_hetero::SetThreadAdaptation(byoc_hetero::ParseThreadAdaptation(mode));
      },
      py::arg("mode"), "Set it ('auto', 'off' or 'reduced'); applies to the next calls of every module.");
  m.def(
      "adaptation_stats",
      []() {
        byoc_hetero::AdaptationStats s = byoc_hetero::GetAdaptationStats();
        return Counters({{"watched", s.watched},
                         {"contended", s.contended},
                         {"reduced", s.reduced},
                         {"probes", s.probes},
                         {"level", s.level}});
      },
      "Counters of the adaptation to contention since the last reset: watched, contended, reduced "
      "(calls run with fewer threads), probes (tries of a larger count), level (now: threads = "
      "module's >> level).");
  m.def("reset_adaptation", &byoc_hetero::ResetAdaptation,
        "Back to full threads and zero counters (the mode stays).");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "byoc_hetero native extension: oneDNN runtime for offloaded Relax regions";
  m.attr("__version__") = BYOC_HETERO_VERSION;
  m.attr("REGION_FORMAT") = byoc_hetero::kRegionFormat;
  m.attr("REGION_VERSION") = byoc_hetero::kRegionVersion;
  DefineInfo(m);
  DefinePlanning(m);
  DefineThreads(m);
  byoc_hetero::RegisterFfiErrorTranslator();
}
