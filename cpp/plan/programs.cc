/*!
 * \file plan/programs.cc
 * \brief Programs (see programs.h): reorders, host byte copies, compilation.
 */
#include "programs.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <utility>

namespace byoc_hetero {
namespace planning {
namespace {

/*!
 * \brief A host step copying src's elements into dst as raw bytes: both plain strided (no
 *        blocking), same dims and element type; dense equal layouts copy in one memcpy.
 */
Step MakeHostCopy(const MemRef& src, const MemRef& dst, const std::string& label) {
  const memory::desc& s = src.md;
  const memory::desc& d = dst.md;
  if (s.get_data_type() != d.get_data_type() || s.get_dims() != d.get_dims() ||
      s.get_format_kind() != memory::format_kind::blocked || d.get_format_kind() != memory::format_kind::blocked ||
      s.get_inner_nblks() != 0 || d.get_inner_nblks() != 0) {
    TVM_FFI_THROW(InternalError) << label << ": a copy of integer/bool bytes needs two plain strided "
                                 << "descriptors of one type and shape, got " << DescribeDesc(s) << " -> "
                                 << DescribeDesc(d);
  }
  const size_t esize = memory::data_type_size(s.get_data_type());
  const memory::dims dims = s.get_dims();
  const memory::dims ss = s.get_strides();
  const memory::dims ds = d.get_strides();
  const int64_t s_off = s.get_submemory_offset();
  const int64_t d_off = d.get_submemory_offset();
  int64_t numel = 1;
  for (auto x : dims) numel *= x;
  // Dense row-major on both sides: one memcpy.
  bool dense = true;
  int64_t expect = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    if (dims[i] != 1 && (ss[i] != expect || ds[i] != expect)) dense = false;
    expect *= dims[i];
  }
  Step step;
  step.label = label;
  step.args = {{0, src}, {1, dst}};
  step.host = [=](const std::vector<void*>& ptrs) {
    const char* from = static_cast<const char*>(ptrs[0]) + s_off * esize;
    char* to = static_cast<char*>(ptrs[1]) + d_off * esize;
    if (numel == 0) return;
    if (dense) {
      std::memcpy(to, from, static_cast<size_t>(numel) * esize);
      return;
    }
    std::vector<int64_t> idx(dims.size(), 0);
    for (int64_t e = 0; e < numel; ++e) {
      int64_t so = 0, dof = 0;
      for (size_t i = 0; i < dims.size(); ++i) {
        so += idx[i] * ss[i];
        dof += idx[i] * ds[i];
      }
      std::memcpy(to + dof * esize, from + so * esize, esize);
      for (size_t i = dims.size(); i-- > 0;) {
        if (++idx[i] < dims[i]) break;
        idx[i] = 0;
      }
    }
  };
  return step;
}

/*! \brief " src=... wei=... dst=..." for a primitive, " in=... out=..." for a host step. */
std::string StepLayouts(const PlannedStep& s) {
  std::ostringstream os;
  if (s.host) {
    for (size_t k = 0; k < s.args.size(); ++k) {
      os << (k + 1 == s.args.size() ? " out=" : " in=") << DescribeDesc(s.args[k].second.md);
    }
    return os.str();
  }
  const std::pair<int, const char*> names[] = {{DNNL_ARG_SRC, "src"},     {DNNL_ARG_SRC_1, "src1"},
                                               {DNNL_ARG_WEIGHTS, "wei"}, {DNNL_ARG_BIAS, "bia"},
                                               {DNNL_ARG_DST, "dst"}};
  for (const auto& [arg, name] : names) {
    for (const auto& [a, ref] : s.args) {
      if (a == arg) os << " " << name << "=" << DescribeDesc(ref.md);
    }
  }
  return os.str();
}

}  // namespace

Step Programs::MakeReorder(const MemRef& src, const MemRef& dst, const std::string& label) const {
  const memory::data_type dt = src.md.get_data_type();
  // u8 / s8 bytes: oneDNN reorders them (an int8 weight into its blocked layout with the
  // compensation the int8 conv reads; activations between layouts)
  const bool int8 = dt == memory::data_type::u8 || dt == memory::data_type::s8;
  if (dt != memory::data_type::f32 && dt != memory::data_type::bf16 && !(int8 && dst.md.get_data_type() == dt)) {
    // int64 / int32 / bool bytes (f64 / s32 / u8 descriptors, PlainDescOf): oneDNN 3.2 has no
    // reorder for f64 (an int64 constant failed to plan with "unimplemented"), and a value
    // conversion is never wanted here: the bytes are copied as they are, on the host.
    return MakeHostCopy(src, dst, label);
  }
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  Step step;
  step.label = label;
  step.pd = GuardDnnl(label, "create a reorder", [&] {
    return dnnl::reorder::primitive_desc(engine_, src.md, engine_, dst.md, attr);
  });
  step.args = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
  return step;
}

void Programs::Add(bool at_init, Step step, int writes_slot) {
  if (at_init) {
    init_.push_back({std::move(step), writes_slot >= 0 ? buffers_.SharedIndex(writes_slot) : -1});
  } else {
    run_.push_back({std::move(step), -1});
  }
}

void Programs::Compile(Plan* plan) {
  CompileProgram(&init_, &plan->init_steps, &plan->init_scratch_bytes);
  CompileProgram(&run_, &plan->run_steps, &plan->run_scratch_bytes);
}

void Programs::CompileProgram(std::vector<Pending>* pending, std::vector<PlannedStep>* out, size_t* scratch) const {
  for (Pending& p : *pending) {
    PlannedStep s;
    s.label = std::move(p.step.label);
    s.op = std::move(p.step.op);
    s.args = std::move(p.step.args);
    s.writes = p.writes;
    if (p.step.host) {
      s.host = std::move(p.step.host);
      s.impl = "host";
    } else {
      s.pd = std::move(p.step.pd);
      s.impl = s.pd.impl_info_str();
    }
    s.layouts = StepLayouts(s);
    if (!s.host) {
      const memory::desc sp = s.pd.scratchpad_desc();
      if (sp.get_size() > 0) {
        *scratch = std::max(*scratch, sp.get_size());
        s.args.emplace_back(DNNL_ARG_SCRATCHPAD, MemRef{sp, buffers_.scratch()});
      }
    }
    out->push_back(std::move(s));
  }
  pending->clear();
}

}  // namespace planning
}  // namespace byoc_hetero
