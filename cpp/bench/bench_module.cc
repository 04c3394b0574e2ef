/*!
 * \file bench/bench_module.cc
 * \brief The pybind11 module byoc_hetero's benchmark loads (not part of the wheel): the bare oneDNN
 *        references (bench_primitives.h) and a C++ timing loop for TVM functions.
 *
 * Built only with -DBYOC_HETERO_BENCH=ON (bench/native.py does that on demand), so the shipped
 * extension carries no benchmark code.
 */
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <chrono>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../py_errors.h"
#include "bench_primitives.h"

namespace py = pybind11;
namespace ffi = tvm::ffi;

namespace {

/*! \brief Mean seconds per call of f(*args) over `number` calls made from C++ (no Python in the loop). */
double TimeCall(const ffi::Function& f, const ffi::Array<ffi::Any>& args, int number) {
  if (number < 1) TVM_FFI_THROW(ValueError) << "byoc_hetero.bench.time_call: number must be >= 1";
  std::vector<ffi::AnyView> views(args.begin(), args.end());
  ffi::Any rv;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < number; ++i) f.CallPacked(views.data(), static_cast<int32_t>(views.size()), &rv);
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / number;
}

}  // namespace

// A TVM global, because its argument is a TVM function (bench/run.py times a region's packed
// function); registered when the module is imported.
TVM_FFI_STATIC_INIT_BLOCK() {
  if (!ffi::Function::GetGlobal("byoc_hetero.bench.time_call").has_value()) {
    tvm::ffi::reflection::GlobalDef().def("byoc_hetero.bench.time_call", TimeCall);
  }
}

PYBIND11_MODULE(_bench, m) {
  m.doc() = "byoc_hetero benchmark helpers: bare oneDNN primitives; global byoc_hetero.bench.time_call";
  m.def(
      "bench_chain",
      [](const std::vector<py::dict>& layers, int threads, int number, int repeat) {
        std::vector<byoc_hetero::BareLayer> chain;
        for (const py::dict& d : layers) {
          static const std::set<std::string> known = {"op", "data_shape", "weight_shape", "strides",
                                                      "padding", "dilation", "groups", "m", "k", "n",
                                                      "bias", "activation", "clip", "residual"};
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
          if (d.contains("clip")) l.clip = d["clip"].cast<std::vector<double>>();
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

  byoc_hetero::RegisterFfiErrorTranslator();
}
