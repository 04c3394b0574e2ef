/*!
 * \file compiled_region.cc
 * \brief See compiled_region.h.
 */
#include "compiled_region.h"

#include <tvm/ffi/error.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <utility>

namespace byoc_hetero {

namespace {

constexpr int kDefaultPlanCacheLimit = 8;

int InitialPlanCacheLimit() {
  const char* env = std::getenv("BYOC_HETERO_PLAN_CACHE");
  if (env == nullptr || *env == '\0') return kDefaultPlanCacheLimit;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < 1 || n > 1 << 20) {
    TVM_FFI_THROW(ValueError) << "BYOC_HETERO_PLAN_CACHE: expected an integer >= 1, got '" << env << "'";
  }
  return static_cast<int>(n);
}

std::atomic<int64_t>& OneTimeWork() {
  static std::atomic<int64_t> count{0};
  return count;
}

std::atomic<int>& PlanCacheLimitRef() {
  static std::atomic<int> limit{InitialPlanCacheLimit()};
  return limit;
}

}  // namespace

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return INT64_MAX;
  return static_cast<int64_t>(pages) * static_cast<int64_t>(page);
}

int PlanCacheLimit() { return PlanCacheLimitRef().load(); }

int64_t OneTimeWorkCount() { return OneTimeWork().load(std::memory_order_relaxed); }

void SetPlanCacheLimit(int n) {
  if (n < 1) TVM_FFI_THROW(ValueError) << "plan cache limit must be >= 1, got " << n;
  PlanCacheLimitRef() = n;
}

CompiledRegion::CompiledRegion(const RegionGraph& graph, int threads, std::shared_ptr<PreparedWeights> weights)
    : graph_(graph), where_(graph.where()), symbol_(graph.symbol), threads_(std::max(1, threads)),
      max_bytes_(PhysicalMemoryBytes()), weights_(std::move(weights)) {
  std::shared_ptr<const Plan> plan = graph.symbolic() ? nullptr : PlanFor({});  // planning reads only the graph
  std::unique_lock<std::shared_mutex> lock(weights_->mutex());
  if (graph.constants.empty()) weights_->set_ready(true);
  if (plan) cache_.push_front(MakeEntry({}, std::move(plan)));
}

std::shared_ptr<const Plan> CompiledRegion::PlanFor(const std::vector<std::vector<int64_t>>& shapes,
                                                    bool with_output_shapes) const {
  PlanRequest request;
  request.threads = threads_;
  request.input_shapes = shapes;
  request.with_output_shapes = with_output_shapes;
  request.max_bytes = max_bytes_;
  // MakePlan raises InputError for shapes a symbolic region's ops reject (planner.h)
  return MakePlan(graph_, request, engine_);
}

std::shared_ptr<CompiledRegion::Entry> CompiledRegion::MakeEntry(const std::vector<int64_t>& key,
                                                                 std::shared_ptr<const Plan> plan) {
  auto entry = std::make_shared<Entry>();
  entry->key = key;
  std::vector<void*> weights = weights_->Reserve(*plan);  // the caller holds the weights' mutex exclusively
  entry->executor = std::make_shared<Executor>(std::move(plan), engine_, std::move(weights));
  entry->executor->SetProfiling(profiling_);
  ++plans_made_;
  OneTimeWork().fetch_add(1, std::memory_order_relaxed);
  return entry;
}

void CompiledRegion::Fill(Entry& entry) {
  OneTimeWork().fetch_add(1, std::memory_order_relaxed);
  if (!weights_->constants().empty() || graph_.constants.empty()) {
    entry.executor->FillWeights(*weights_);
  }
  entry.generation = weights_->generation();
}

void CompiledRegion::LoadConstants(const std::vector<const void*>& data, std::shared_ptr<const void> keep_alive) {
  std::unique_lock<std::shared_mutex> lock(weights_->mutex());
  weights_->set_ready(false);
  weights_->SetConstants(data, std::move(keep_alive));
  std::lock_guard<std::mutex> cache_lock(cache_mu_);
  for (const auto& entry : cache_) Fill(*entry);
  weights_->set_ready(true);
}

std::shared_ptr<CompiledRegion::Entry> CompiledRegion::Find(const std::vector<int64_t>& key) {
  std::lock_guard<std::mutex> lock(cache_mu_);
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    if ((*it)->key == key) {
      if (it != cache_.begin()) cache_.splice(cache_.begin(), cache_, it);
      return cache_.front();
    }
  }
  return nullptr;
}

std::shared_ptr<CompiledRegion::Entry> CompiledRegion::LastFor(const std::vector<std::vector<int64_t>>& arg_shapes) {
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (!last_entry_) return nullptr;
  size_t k = 0;
  for (const auto& shape : arg_shapes) {
    if (k + 1 + shape.size() > last_shapes_.size() || last_shapes_[k] != static_cast<int64_t>(shape.size()) ||
        !std::equal(shape.begin(), shape.end(), last_shapes_.begin() + k + 1)) {
      return nullptr;
    }
    k += 1 + shape.size();
  }
  return k == last_shapes_.size() ? last_entry_ : nullptr;
}

void CompiledRegion::Remember(const std::vector<std::vector<int64_t>>& arg_shapes, std::shared_ptr<Entry> entry) {
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (std::find(cache_.begin(), cache_.end(), entry) == cache_.end()) return;  // evicted meanwhile
  last_shapes_.clear();
  for (const auto& shape : arg_shapes) {
    last_shapes_.push_back(static_cast<int64_t>(shape.size()));
    last_shapes_.insert(last_shapes_.end(), shape.begin(), shape.end());
  }
  last_entry_ = std::move(entry);
}

void CompiledRegion::Execute(const std::vector<void*>& buffers,
                             const std::vector<std::vector<int64_t>>& arg_shapes) {
  if (graph_.symbolic()) {
    // Shapes equal to the last call's bind the same symbols (binding is a function of the
    // shapes), so that call's checks and plan hold: one compare instead of binding and search.
    if (std::shared_ptr<Entry> hit = LastFor(arg_shapes)) {
      std::shared_lock<std::shared_mutex> lock(weights_->mutex());
      if (weights_->ready() && hit->generation == weights_->generation()) {
        hit->executor->Run(buffers);
        return;
      }
    }
  }
  const std::vector<int64_t> key = graph_.symbolic() ? graph_.BindSymbols(arg_shapes) : std::vector<int64_t>{};
  for (;;) {
    {
      std::shared_lock<std::shared_mutex> lock(weights_->mutex());
      if (!weights_->ready()) {
        TVM_FFI_THROW(RuntimeError) << where_ << ": the region has " << graph_.constants.size()
                                    << " constants but __init_" << symbol_
                                    << " was never called (or failed); initialize the module with "
                                       "its constants before running it";
      }
      std::shared_ptr<Entry> entry = Find(key);
      if (entry && entry->generation == weights_->generation()) {
        if (graph_.symbolic()) Remember(arg_shapes, entry);
        entry->executor->Run(buffers);
        return;
      }
    }
    // A new binding (or a plan whose weights predate the constants): plan it (no lock: planning
    // reads only the graph), then reserve and prepare its weights with the calls held, as
    // __init_ does.
    std::shared_ptr<const Plan> plan;
    if (!Find(key)) {
      plan = PlanFor(arg_shapes, /*with_output_shapes=*/true);  // an output may bind a symbol
    }
    std::unique_lock<std::shared_mutex> lock(weights_->mutex());
    std::shared_ptr<Entry> entry = Find(key);
    if (!entry) {
      if (!plan) continue;  // evicted meanwhile: plan again
      std::shared_ptr<Entry> made = MakeEntry(key, std::move(plan));
      std::lock_guard<std::mutex> cache_lock(cache_mu_);
      cache_.push_front(made);
      const size_t limit = static_cast<size_t>(std::max(1, PlanCacheLimit()));
      // Evicted plans die with their last running call (held by shared_ptr); their weights stay,
      // shared by key: a weight's layouts are few whatever the shapes (docs/region-format.md).
      while (cache_.size() > limit) {
        if (cache_.back() == last_entry_) last_entry_.reset();
        cache_.pop_back();
      }
      entry = made;
    }
    if (entry->generation != weights_->generation()) Fill(*entry);
  }
}

std::vector<std::string> CompiledRegion::Describe() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.empty()) return {};
  return cache_.front()->executor->plan().Describe();
}

int CompiledRegion::contexts() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  int n = 0;
  for (const auto& e : cache_) n += e->executor->contexts();
  return n;
}

int64_t CompiledRegion::shared_bytes() const {
  std::shared_lock<std::shared_mutex> lock(weights_->mutex());
  return weights_->bytes();
}

int64_t CompiledRegion::context_bytes() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  int64_t n = 0;
  for (const auto& e : cache_) n = std::max(n, e->executor->context_bytes());
  return n;
}

int CompiledRegion::plans() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  return static_cast<int>(cache_.size());
}

std::vector<std::vector<int64_t>> CompiledRegion::cached_bindings() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  std::vector<std::vector<int64_t>> keys;
  for (const auto& e : cache_) keys.push_back(e->key);
  return keys;
}

void CompiledRegion::SetProfiling(bool on) {
  profiling_ = on;
  std::lock_guard<std::mutex> lock(cache_mu_);
  for (const auto& e : cache_) e->executor->SetProfiling(on);
}

std::vector<StepProfile> CompiledRegion::Profile() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  std::vector<StepProfile> all;
  for (const auto& e : cache_) {
    for (StepProfile p : e->executor->Profile()) {
      if (graph_.symbolic()) p.label += " @ " + graph_.DescribeBinding(e->key);
      all.push_back(std::move(p));
    }
  }
  return all;
}

void CompiledRegion::ResetProfile() {
  std::lock_guard<std::mutex> lock(cache_mu_);
  for (const auto& e : cache_) e->executor->ResetProfile();
}

}  // namespace byoc_hetero
