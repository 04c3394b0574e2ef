/*!
 * \file compiled_region.cc
 * \brief See compiled_region.h.
 */
#include "compiled_region.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <mutex>
#include <utility>

namespace byoc_hetero {

CompiledRegion::CompiledRegion(const RegionGraph& graph, int threads)
    : where_(graph.where()), symbol_(graph.symbol) {
  PlanRequest request;
  request.threads = std::max(1, threads);
  std::shared_ptr<const Plan> plan = MakePlan(graph, request, engine_);
  std::vector<void*> weights = weights_.Reserve(*plan);
  executor_ = std::make_unique<Executor>(std::move(plan), engine_, std::move(weights));
  ready_ = graph.constants.empty();
}

void CompiledRegion::LoadConstants(const std::vector<const void*>& data) {
  std::unique_lock<std::shared_mutex> lock(consts_mu_);
  ready_ = false;
  weights_.Invalidate();
  executor_->FillWeights(weights_, data);
  ready_ = true;
}

void CompiledRegion::Execute(const std::vector<void*>& buffers) {
  std::shared_lock<std::shared_mutex> lock(consts_mu_);
  if (!ready_) {
    TVM_FFI_THROW(RuntimeError) << where_ << ": the region has " << plan().num_constants
                                << " constants but __init_" << symbol_
                                << " was never called (or failed); initialize the module with "
                                   "its constants before running it";
  }
  executor_->Run(buffers);
}

}  // namespace byoc_hetero
