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

#include <string>

#include "kernels/kernel.h"
#include "region_graph.h"

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
