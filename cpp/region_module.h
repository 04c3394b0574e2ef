/*!
 * \file region_module.h
 * \brief The TVM FFI runtime module of one offloaded region (kind "byoc_hetero").
 *
 * Functions (GetFunction):
 *   <symbol>(in_0, ..., in_{I-1}, out_0, ..., out_{O-1})  run, destination-passing style
 *   get_symbol() -> str
 *   get_const_vars() -> Array<str>          constant names, in __init_ order
 *   __init_<symbol>(Array<Tensor>) -> int   load constants (returns 0); placeholders (every one a tensor
 *                                           of no elements) load nothing: a later call brings them
 *   get_graph_json() -> str
 *   get_plan() -> Array<str>                the oneDNN steps (implementation and layouts)
 *
 * Globals (registered when the extension is loaded):
 *   byoc_hetero.runtime.create(graph_json: str) -> Module
 *   ffi.Module.load_from_bytes.byoc_hetero(bytes) -> Module
 *   byoc_hetero.runtime.save_to_bytes(Module) -> bytes
 *   byoc_hetero.runtime.supported_ops() -> Array<str>
 *   byoc_hetero.runtime.check_dim_ranges(tensor, where, shape, (axis, symbol, min, max)...) -> tensor
 */
#ifndef BYOC_HETERO_REGION_MODULE_H_
#define BYOC_HETERO_REGION_MODULE_H_

#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/string.h>

#include <string>

namespace byoc_hetero {

/*! \brief Magic prefix of SaveToBytes. */
// "02": the magic is followed by the document's digest (16 hex digits, digest.h), then the document.
constexpr const char kBytesMagic[] = "BYOCHG02";
/*! \brief The magic of libraries exported before documents carried digests (refused, by name). */
constexpr const char kBytesMagicV1[] = "BYOCHG01";

/*! \brief Parse, validate and compile a region document into a module. */
tvm::ffi::Module CreateRegionModule(const std::string& graph_json);

/*! \brief Inverse of the module's SaveToBytes (checks the magic, re-validates the JSON). */
tvm::ffi::Module LoadRegionModuleFromBytes(const tvm::ffi::Bytes& bytes);

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_REGION_MODULE_H_
