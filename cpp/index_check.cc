/*!
 * \file index_check.cc
 * \brief byoc_hetero.runtime.check_indices: the bounds check the imports put before every gather
 *        that runs on TVM's llvm (byoc_hetero/passes/checked_take.py).
 *
 * TVM's ONNX importer emits Relax `take` in its default "fast" mode, which reads whatever address an
 * index gives: an index of 100 into a 10-row table returned garbage rows, 2**40 killed the process
 * with SIGSEGV (issue 27).  Relax has no take mode that raises, so the check is a separate step on
 * the indices as the model wrote them (before the importer's negative-index adjustment, so a message
 * names -11, not -1): a TIR extern (call_tir, so every Relax pass treats it as an ordinary op) that
 * calls this function, which copies the indices to its output once they pass; the gather reads that
 * output, so no pass drops the check or moves the gather before it.  Regions check their own
 * indices (kernels/take.cc); this covers the gathers left on llvm.
 */
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

namespace byoc_hetero {

namespace ffi = tvm::ffi;

namespace {

DLTensor* TensorArg(const ffi::PackedArgs& args, int i, const char* what) {
  std::optional<DLTensor*> dl = args[i].try_cast<DLTensor*>();
  if (!dl.has_value() || *dl == nullptr) {
    TVM_FFI_THROW(ValueError) << "byoc_hetero.runtime.check_indices: expected a Tensor as " << what << ", got "
                              << args[i].GetTypeKey();
  }
  return *dl;
}

template <typename Index>
void CheckRange(const Index* ids, int64_t count, int64_t lo, int64_t hi, int64_t rows, const std::string& where) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t v = static_cast<int64_t>(ids[i]);
    if (v < lo || v >= hi) {
      TVM_FFI_THROW(InputError) << where << ": index " << v << " at position " << i
                                << " of the indices is out of range for an axis of " << rows
                                << " (expected " << lo << " <= index < " << hi << ")";
    }
  }
}

/*!
 * \brief check_indices(indices, out, table, axis, where, negative): every index must lie in [0, n),
 *        or in [-n, n) when `negative` is 1 (ONNX Gather counts negative indices from the end),
 *        n = table.shape[axis]; otherwise an InputError naming `where`, the index, its position and
 *        n.  The indices are then copied to `out` (same shape and dtype, the call_tir's output).
 */
void CheckIndices(ffi::PackedArgs args, ffi::Any* rv) {
  if (args.size() != 6) {
    TVM_FFI_THROW(ValueError) << "byoc_hetero.runtime.check_indices: expected (indices, out, table, axis, "
                                 "where, negative), got "
                              << args.size() << " arguments";
  }
  const DLTensor* ids = TensorArg(args, 0, "indices");
  DLTensor* out = TensorArg(args, 1, "out");
  const DLTensor* table = TensorArg(args, 2, "table");
  const int64_t axis = args[3].cast<int64_t>();
  const std::string where = args[4].cast<ffi::String>();
  const bool negative = args[5].cast<int64_t>() != 0;
  if (axis < 0 || axis >= table->ndim) {
    TVM_FFI_THROW(ValueError) << where << ": the index check names axis " << axis << " of a rank-" << table->ndim
                              << " table";
  }
  if (ids->device.device_type != kDLCPU) {
    TVM_FFI_THROW(ValueError) << where << ": the index check reads indices on the host, got device type "
                              << ids->device.device_type;
  }
  const int64_t rows = table->shape[axis];
  int64_t count = 1;
  for (int d = 0; d < ids->ndim; ++d) count *= ids->shape[d];
  const char* base = static_cast<const char*>(ids->data) + ids->byte_offset;
  const int64_t lo = negative ? -rows : 0;
  if (ids->dtype.code == kDLInt && ids->dtype.bits == 64 && ids->dtype.lanes == 1) {
    CheckRange(reinterpret_cast<const int64_t*>(base), count, lo, rows, rows, where);
  } else if (ids->dtype.code == kDLInt && ids->dtype.bits == 32 && ids->dtype.lanes == 1) {
    CheckRange(reinterpret_cast<const int32_t*>(base), count, lo, rows, rows, where);
  } else {
    TVM_FFI_THROW(ValueError) << where << ": the index check reads int32 or int64 indices, got dtype code "
                              << static_cast<int>(ids->dtype.code) << " bits " << static_cast<int>(ids->dtype.bits);
  }
  if (out->ndim != ids->ndim || out->dtype.code != ids->dtype.code || out->dtype.bits != ids->dtype.bits) {
    TVM_FFI_THROW(ValueError) << where << ": the index check's output does not match its indices";
  }
  char* dst = static_cast<char*>(out->data) + out->byte_offset;
  if (dst != base && count > 0) std::memcpy(dst, base, static_cast<size_t>(count) * (ids->dtype.bits / 8));
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  if (!ffi::Function::GetGlobal("byoc_hetero.runtime.check_indices").has_value()) {
    tvm::ffi::reflection::GlobalDef().def_packed("byoc_hetero.runtime.check_indices", CheckIndices);
  }
}

}  // namespace byoc_hetero
