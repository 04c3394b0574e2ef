/*!
 * \file py_errors.h
 * \brief How the pybind11 modules (_C, _bench) report tvm::ffi errors to Python.
 */
#ifndef BYOC_HETERO_PY_ERRORS_H_
#define BYOC_HETERO_PY_ERRORS_H_

#include <pybind11/pybind11.h>
#include <tvm/ffi/error.h>

namespace byoc_hetero {

/*! \brief tvm::ffi InputError -> byoc_hetero.errors.InputError, ValueError -> ValueError, any other kind -> RuntimeError("<kind>: ..."). */
inline void RegisterFfiErrorTranslator() {
  pybind11::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tvm::ffi::Error& e) {
      if (e.kind() == "InputError") {
        // The runtime's rejection of a call's shapes: byoc_hetero.errors.InputError (a ValueError).
        pybind11::object cls = pybind11::module_::import("byoc_hetero.errors").attr("InputError");
        PyErr_SetString(cls.ptr(), e.message().c_str());
      } else if (e.kind() == "ValueError") {
        PyErr_SetString(PyExc_ValueError, e.message().c_str());
      } else {
        PyErr_SetString(PyExc_RuntimeError, (e.kind() + ": " + e.message()).c_str());
      }
    }
  });
}

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_PY_ERRORS_H_
