/*!
 * \file python_module.cc
 * \brief The pybind11 module byoc_hetero._C: build information and small introspection helpers.
 *
 * The runtime itself is reached through TVM globals (see region_module.h), which this shared
 * library registers when it is loaded.
 */
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <tvm/ffi/error.h>

#include <set>
#include <string>

#include "bench_primitives.h"
#include "kernels/kernel.h"
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

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "byoc_hetero native extension: oneDNN runtime for offloaded Relax regions";
  m.attr("__version__") = BYOC_HETERO_VERSION;
  m.attr("REGION_FORMAT") = byoc_hetero::kRegionFormat;
  m.attr("REGION_VERSION") = byoc_hetero::kRegionVersion;

  m.def("onednn_version", &OneDnnVersion, "oneDNN version of the loaded library, e.g. '3.2.0'.");
  m.def("onednn_commit", []() { return std::string(dnnl::version()->hash); },
        "Git hash of the loaded oneDNN build.");
  m.def("isa", []() { return IsaName(dnnl::get_effective_cpu_isa()); },
        "Effective CPU ISA oneDNN dispatches to (e.g. 'avx512_core').");
  m.def("kernels", &byoc_hetero::SupportedOps, "Node ops the runtime can execute.");
  m.def(
      "validate",
      [](const std::string& graph_json) {
        byoc_hetero::RegionGraph g = byoc_hetero::ParseRegionGraph(graph_json);
        return g.symbol;
      },
      py::arg("graph_json"),
      "Structurally validate a region document (no op checks, no oneDNN); returns its symbol. "
      "Raises ValueError naming the field on failure.");

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
        py::dict d;
        d["calls"] = s.calls;
        d["waited"] = s.waited;
        d["max_active"] = s.max_active;
        d["max_active_threads"] = s.max_active_threads;
        return d;
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
        py::dict d;
        d["watched"] = s.watched;
        d["contended"] = s.contended;
        d["reduced"] = s.reduced;
        d["probes"] = s.probes;
        d["level"] = s.level;
        return d;
      },
      "Counters of the adaptation to contention since the last reset: watched, contended, reduced "
      "(calls run with fewer threads), probes (tries of a larger count), level (now: threads = "
      "module's >> level).");
  m.def("reset_adaptation", &byoc_hetero::ResetAdaptation,
        "Back to full threads and zero counters (the mode stays).");
  m.def(
      "bench_chain",
      [](const std::vector<py::dict>& layers, int threads, int number, int repeat) {
        std::vector<byoc_hetero::BareLayer> chain;
        for (const py::dict& d : layers) {
          static const std::set<std::string> known = {"op", "data_shape", "weight_shape", "strides",
                                                      "padding", "dilation", "groups", "m", "k", "n",
                                                      "bias", "activation", "residual"};
          for (const auto& item : d) {
            const std::string key = py::str(item.first);
            if (!known.count(key)) throw py::value_error("bench_chain: unknown layer key '" + key + "'");
          }
          if (!d.contains("op")) throw py::value_error("bench_chain: a layer needs 'op' (conv2d or dense)");
          byoc_hetero::BareLayer l;
          l.op = d["op"].cast<std::string>();
          auto ints = [&](const char* key, std::vector<int64_t>* out) {
            if (d.contains(key)) *out = d[key].cast<std::vector<int64_t>>();
          };
          ints("data_shape", &l.data_shape);
          ints("weight_shape", &l.weight_shape);
          ints("strides", &l.strides);
          ints("padding", &l.padding);
          ints("dilation", &l.dilation);
          if (d.contains("groups")) l.groups = d["groups"].cast<int64_t>();
          if (d.contains("m")) l.m = d["m"].cast<int64_t>();
          if (d.contains("k")) l.k = d["k"].cast<int64_t>();
          if (d.contains("n")) l.n = d["n"].cast<int64_t>();
          if (d.contains("bias")) l.bias = d["bias"].cast<bool>();
          if (d.contains("activation")) l.activation = d["activation"].cast<std::string>();
          if (d.contains("residual")) l.residual = d["residual"].cast<bool>();
          chain.push_back(std::move(l));
        }
        py::gil_scoped_release release;
        std::vector<std::pair<double, std::string>> out;
        for (const auto& t : byoc_hetero::TimeBareChain(chain, threads, number, repeat)) {
          out.emplace_back(t.seconds, t.impl);
        }
        return out;
      },
      py::arg("layers"), py::arg("threads") = 1, py::arg("number") = 10, py::arg("repeat") = 5,
      "Bare oneDNN primitives run one after the other (each reading the previous one's output "
      "where the layouts agree), as in a network: per layer the median seconds per execution and "
      "the implementation name. A layer is a dict: op 'conv2d' (data_shape, weight_shape, strides, "
      "padding, dilation, groups, bias, activation, residual) or 'dense' (m, k, n, bias, activation).");

  // tvm::ffi::Error derives from std::exception; report ValueErrors as Python ValueError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tvm::ffi::Error& e) {
      if (e.kind() == "ValueError") {
        PyErr_SetString(PyExc_ValueError, e.message().c_str());
      } else {
        PyErr_SetString(PyExc_RuntimeError, (e.kind() + ": " + e.message()).c_str());
      }
    }
  });
}
