/*!
 * \file env_switch.h
 * \brief A two-valued switch read from the environment when a plan is made (BYOC_HETERO_DENSE_IP,
 *        BYOC_HETERO_MATMUL_PLAIN_A, BYOC_HETERO_MATMUL_SPLIT_EPILOGUE, BYOC_HETERO_ATTENTION_OUT_VIEW,
 *        BYOC_HETERO_BF16): one reader, so every such switch rejects a bad value the same way.
 */
#ifndef BYOC_HETERO_KERNELS_ENV_SWITCH_H_
#define BYOC_HETERO_KERNELS_ENV_SWITCH_H_

#include <tvm/ffi/error.h>

#include <cstdlib>
#include <string>

namespace byoc_hetero {

/*! \brief \p variable's state: \p on or \p off, \p unset_on where it is unset or empty; any other value is a
 *         ValueError "<variable> must be <on> or <off>, got '<value>'". */
inline bool EnvSwitch(const char* variable, const char* on, const char* off, bool unset_on) {
  const char* env = std::getenv(variable);
  const std::string value = env == nullptr ? "" : env;
  if (value.empty()) return unset_on;
  if (value != on && value != off) {
    TVM_FFI_THROW(ValueError) << variable << " must be " << on << " or " << off << ", got '" << value << "'";
  }
  return value == on;
}

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_ENV_SWITCH_H_
