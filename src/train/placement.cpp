#include "train/placement.h"

#include <algorithm>

#include "distributed/dist_weights.h"
#include "moe/comm_tensor.h"

namespace moe::train {
namespace {

// "layers.3.experts.wo" -> "experts.wo"
std::string weight_name(const std::string& param) {
  const size_t dot = param.find('.', param.find('.') + 1);
  return param.substr(dot + 1);
}

// True when this rank's coordinate is 0 on every axis `spec` does not shard over.
bool owns(const Mesh& mesh, const ShardSpec& spec) {
  for (MeshAxis a : {MeshAxis::data, MeshAxis::fsdp, MeshAxis::expert}) {
    const bool sharded = std::any_of(spec.begin(), spec.end(), [&](const std::vector<std::string>& axes) {
      return std::find(axes.begin(), axes.end(), mesh_axis_name(a)) != axes.end();
    });
    if (!sharded && mesh.coord(a) != 0) return false;
  }
  return true;
}

void broadcast_model(Communicator& comm, const Config& cfg, Model& m) {
  for (Param& p : parameters(cfg, m)) *p.tensor = broadcast_tensor(comm, *p.tensor, 0);
}

}  // namespace

void CommSync::sum(float* data, int64_t n) { comm_.all_reduce_sum(data, data, size_t(n)); }

void CommSync::sum(double* data, int64_t n) {
  const int W = comm_.size();
  std::vector<double> all(size_t(n) * size_t(W));
  comm_.all_gather(data, all.data(), size_t(n) * sizeof(double));
  for (int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (int r = 0; r < W; ++r) s += all[size_t(r) * size_t(n) + size_t(i)];
    data[i] = s;
  }
}

int64_t CommSync::bytes_moved() const {
  int64_t b = 0;
  for (int k = 0; k < kNumCollKinds; ++k) b += comm_.counters().get(CollKind(k)).bytes;
  return b;
}

Placement::Placement(const Config& cfg, Communicator* comm) : cfg_(cfg), comm_(comm) {
  if (!comm_) {
    sync_ = std::make_unique<LocalSync>();
    own_trace_ = std::make_unique<StepTrace>(0);
    trace_ = own_trace_.get();
  } else {
    if (cfg.batch_tokens % comm_->size() != 0)
      fail("batch_tokens=", cfg.batch_tokens, " is not divisible by the ", comm_->size(),
           " ranks (every rank trains on batch_tokens / ranks rows)");
    rt_ = std::make_unique<DistRuntime>(cfg, *comm_, /*training=*/true);
    rt_->enable_trace(true);
    trace_ = rt_->trace();
    layer_ = std::make_unique<DistLayer>(cfg, *rt_);
    sync_ = std::make_unique<CommSync>(*comm_);
  }
  env_.sync = sync_.get();
  env_.student = {layer_.get(), trace_};
  env_.teacher = env_.student;  // the teacher runs sharded too: targets bit-equal to one process's
  if (comm_) build_masks();
}

Placement::~Placement() = default;

void Placement::build_masks() {
  const Mesh& mesh = rt_->mesh();
  for (const auto& [name, shape] : parameter_shapes(cfg_)) {
    const std::string w = weight_name(name);
    const bool replicated = w == "norm.scale" || w == "router.kernel";
    env_.summed.push_back(w == "norm.scale");  // the layer reduces its own gradients
    env_.norm_owner.push_back(replicated ? rank() == 0 : owns(mesh, stored_spec(cfg_, mesh, w)));
  }
}

std::pair<int64_t, int64_t> Placement::rows() const {
  const int64_t T = cfg_.batch_tokens;
  return {row_begin(T, rank(), size()), row_begin(T, rank() + 1, size())};
}

TrainState Placement::map_moe(const TrainState& st, bool to_root) const {
  TrainState out = st;
  for (Model* m : {&out.params, &out.m, &out.v})
    for (Block& b : m->blocks) b.moe = to_root ? layer_->unshard_to_root(b.moe) : layer_->shard(b.moe);
  return out;
}

Model Placement::shard(const Model& whole) const {
  Model out = whole;
  if (comm_)
    for (Block& b : out.blocks) b.moe = layer_->shard(b.moe);
  return out;
}

TrainState Placement::shard(const TrainState& whole) const {
  return comm_ ? map_moe(whole, /*to_root=*/false) : whole;
}

TrainState Placement::from_root(TrainState root) const {
  if (!comm_) return root;
  int64_t step = root.step;
  comm_->broadcast(&step, sizeof step, 0);
  root.step = step;
  for (Model* m : {&root.params, &root.m, &root.v}) broadcast_model(*comm_, cfg_, *m);
  return map_moe(root, /*to_root=*/false);
}

TrainState Placement::to_root(const TrainState& local) const {
  if (!comm_) return local;
  TrainState whole = map_moe(local, /*to_root=*/true);
  return rank() == 0 ? whole : TrainState();
}

bool Placement::all_ranks(bool local) const {
  if (!comm_) return local;
  const int32_t flag = local ? 1 : 0;
  std::vector<int32_t> all(static_cast<size_t>(size()));
  comm_->all_gather(&flag, all.data(), sizeof flag);
  return std::all_of(all.begin(), all.end(), [](int32_t f) { return f != 0; });
}

}  // namespace moe::train
