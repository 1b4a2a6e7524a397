// _moe_engine: the extension module behind the moe_engine package (docs/python.md). Tensors cross
// by DLPack (interop.h); the engine runs with the GIL released; moe::Error becomes
// moe_engine.MoeError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <cstdlib>

#include "engine_layer.h"
#include "interop.h"
#include "moe/thread_pool.h"

namespace py = pybind11;
using namespace moe;
using namespace moe::python;

namespace {

using TensorDict = std::map<std::string, Tensor>;

TensorDict dict_in(const py::dict& d, const std::string& what) {
  TensorDict out;
  for (auto [k, v] : d) {
    std::string name = py::str(k);
    out[name] = from_dlpack(v, what + " '" + name + "'");
  }
  return out;
}

py::dict dict_out(const TensorDict& m) {
  py::dict d;
  for (const auto& [k, t] : m) d[py::str(k)] = to_dlpack(t);
  return d;
}

py::tuple forward(const EngineLayer& l, const py::dict& params, const py::handle& x, bool keep_state) {
  TensorDict p = dict_in(params, "MoELayer: parameter");
  Tensor xt = from_dlpack(x, "MoELayer: x");
  ForwardResult r;
  {
    py::gil_scoped_release nogil;
    r = l.forward(p, xt, keep_state);
  }
  py::object state = r.state ? py::cast(r.state) : py::none();
  return py::make_tuple(to_dlpack(r.y), r.load_balance_loss, r.z_loss, to_dlpack(r.group_sizes),
                        to_dlpack(r.topk_idx), to_dlpack(r.topk_weights), r.dropped, state);
}

py::tuple backward(const EngineLayer& l, std::shared_ptr<ForwardState>& st, const py::handle& dy, double cot_lb,
                   double cot_z, const py::dict& accumulate) {
  if (!st) fail("MoELayer: backward: no forward state (the forward ran without gradients)");
  Tensor dyt = from_dlpack(dy, "MoELayer: dy");
  TensorDict acc = dict_in(accumulate, "MoELayer: gradient");
  std::pair<Tensor, TensorDict> g;
  {
    py::gil_scoped_release nogil;
    g = l.backward(*st, dyt, AuxCotangents{cot_lb, cot_z}, acc);
    // The activations go now, not when Python drops the state object.
    st->local.reset();
    st->dist.reset();
  }
  return py::make_tuple(to_dlpack(g.first), dict_out(g.second));
}

// In place: t := the rank-order f32 sum of t over every rank of the job.
void all_reduce(const py::handle& t) {
  Tensor v = from_dlpack(t, "all_reduce_: tensor");
  if (v.dtype() != DType::f32) fail("all_reduce_: tensor: expected float32, got ", dtype_name(v.dtype()));
  if (!launched_by_mpi()) return;
  std::shared_ptr<Communicator> w = world();
  if (w->size() == 1) return;
  py::gil_scoped_release nogil;
  run_collectively(*w, [&] { w->all_reduce_sum(v.data<float>(), v.data<float>(), size_t(v.numel())); });
}

// Ends the job (every rank under mpirun) with "moe: fatal on rank R: <msg>".
[[noreturn]] void abort_job(const std::string& msg) {
  std::fflush(stdout);
  Communicator* w = world_if_made();
  if (w && w->size() > 1) w->abort(msg);
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  std::fprintf(stderr, "moe: fatal on rank %s: %s\n", r ? r : "0", msg.c_str());
  std::fflush(stderr);
  std::_Exit(1);  // not started MPI: mpirun ends the other ranks when one exits non-zero
}

void set_num_threads(int n) {
  if (n < 1) fail("set_num_threads: expected n >= 1, got ", n);
  py::gil_scoped_release nogil;
  ThreadPool::compute().resize(n);
}

}  // namespace

PYBIND11_MODULE(_moe_engine, m) {
  m.doc() = "MoE Engine: the routed Mixture-of-Experts layer (C++ engine); see docs/python.md";
  m.attr("__version__") = MOE_VERSION;
  // moe::Error and its subclasses (ConfigError) -> MoeError (a RuntimeError).
  py::register_exception<Error>(m, "MoeError", PyExc_RuntimeError);

  m.def("launched_by_mpi", &launched_by_mpi, "True when started by mpirun/srun.");
  m.def("world_size", [] { return launched_by_mpi() ? world()->size() : 1; }, "Ranks of the job (1 without mpirun).");
  m.def("rank", [] { return launched_by_mpi() ? world()->rank() : 0; }, "This process's rank (0 without mpirun).");
  m.def("all_reduce_", &all_reduce, py::arg("tensor"));
  m.def("abort", &abort_job, py::arg("message"));
  m.def("set_num_threads", &set_num_threads, py::arg("n"));
  m.def("get_num_threads", [] { return ThreadPool::compute().size(); });
  m.def("tensor_memory_bytes", [] { return tensor_memory_stats().current_bytes; },
        "Bytes of live engine-allocated tensor storage (zero-copy views of caller memory are not counted).");

  m.def("view_address", [](py::handle o) { return uintptr_t(from_dlpack(o, "tensor").raw()); },
        "The address the engine reads `o` at (zero-copy check).");
  m.def("config_key_types", [] {
    py::dict d;
    for (const ConfigKeyInfo& k : config_key_infos()) d[py::str(k.name)] = k.type;
    return d;
  });

  py::class_<ForwardState, std::shared_ptr<ForwardState>>(m, "ForwardState");
  py::class_<EngineLayer>(m, "EngineLayer")
      .def(py::init<const std::vector<std::string>&, std::optional<bool>>(), py::arg("overrides"),
           py::arg("distributed") = py::none())
      .def_property_readonly("distributed", &EngineLayer::distributed)
      .def("config_table",
           [](const EngineLayer& l) {
             py::list out;
             for (const auto& e : l.table()) out.append(py::make_tuple(e.key, e.value, e.source));
             return out;
           })
      .def("param_shapes", &EngineLayer::param_shapes)
      .def("shard", [](const EngineLayer& l, const py::dict& full) { return dict_out(l.shard(dict_in(full, "weight"))); })
      .def("unshard", [](const EngineLayer& l, const py::dict& parts) {
        TensorDict p = dict_in(parts, "parameter");
        TensorDict full;
        {
          py::gil_scoped_release nogil;
          full = l.unshard(p);
        }
        return dict_out(full);
      })
      .def("init_params", [](const EngineLayer& l) {
        TensorDict full;
        init_weights(l.config(), uint64_t(l.config().seed)).for_each(l.config(), [&](const std::string& n, const Tensor& t) { full[n] = t; });
        return dict_out(l.shard(full));
      })
      .def("forward", &forward, py::arg("params"), py::arg("x"), py::arg("keep_state"))
      .def("backward", &backward, py::arg("state"), py::arg("dy"), py::arg("cot_load_balance"), py::arg("cot_z_loss"),
           py::arg("accumulate") = py::dict());
}
