// _moe_engine: the extension module behind the moe_engine package (docs/python.md). Tensors cross
// by DLPack (interop.h); the engine runs with the GIL released; moe::Error becomes
// moe_engine.MoeError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <cstdlib>

#include "engine_layer.h"
#include "interop.h"
#include "moe/dtype.h"
#include "moe/error.h"
#include "moe/layer.h"
#include "moe/memory_estimate.h"
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
                        to_dlpack(r.topk_idx), to_dlpack(r.topk_weights), r.dropped, r.nonfinite_tokens,
                        state);
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
    // The activations go now, not when Python drops the state object; an f64 layer keeps them for
    // another backward through the same forward (retain_graph: torch.autograd.gradcheck).
    if (l.config().dtype != DType::f64) {
      st->local.reset();
      st->dist.reset();
    }
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
  auto moe_error = py::register_exception<Error>(m, "MoeError", PyExc_RuntimeError);
  moe_error.attr("__doc__") =
      "Every error the engine reports: bad input (the tensor, its shape, dtype or device), an invalid config "
      "(every problem, one per line, each naming its key), files and runtime failures. A RuntimeError; the "
      "message names the key, tensor or file and what was expected.";

  m.def("launched_by_mpi", &launched_by_mpi, "True when started by mpirun/srun.");
  m.def("world_size", [] { return launched_by_mpi() ? world()->size() : 1; }, "Ranks of the job (1 without mpirun).");
  m.def("rank", [] { return launched_by_mpi() ? world()->rank() : 0; }, "This process's rank (0 without mpirun).");
  m.def(
      "all_reduce_", &all_reduce, py::arg("tensor"),
      "In place: tensor := the rank-order float32 sum of `tensor` over every rank (a no-op without mpirun).");
  m.def("abort", &abort_job, py::arg("message"),
        "Ends the job (every rank under mpirun) with 'moe: fatal on rank R: <message>'.");
  m.def("set_num_threads", &set_num_threads, py::arg("n"),
        "Resizes the engine's compute pool to n threads (counting the caller; n >= 1).");
  m.def(
      "get_num_threads", [] { return ThreadPool::compute().size(); },
      "Threads of the engine's compute pool.");
  m.def("tensor_memory_bytes", [] { return tensor_memory_stats().current_bytes; },
        "Bytes of live engine-allocated tensor storage (zero-copy views of caller memory are not counted).");

  m.def(
      "view_address", [](py::handle o) { return uintptr_t(from_dlpack(o, "tensor").raw()); }, py::arg("o"),
      "The address the engine reads `o` at (zero-copy check).");
  m.def(
      "config_key_types",
      [] {
        py::dict d;
        for (const ConfigKeyInfo& k : config_key_infos()) d[py::str(k.name)] = k.type;
        return d;
      },
      "{key: type} for every config key (type: int, float, bool, string, ...).");
  m.def(
      "config_key_defaults",
      [] {
        py::dict d;
        for (const ConfigKeyInfo& k : config_key_infos()) d[py::str(k.name)] = k.default_value;
        return d;
      },
      "{key: default value as the config table prints it} for every config key.");

  py::class_<ForwardState, std::shared_ptr<ForwardState>>(
      m, "ForwardState", "The activations one forward keeps for its backward (opaque; used once).");
  py::class_<EngineLayer>(m, "EngineLayer",
                          "A resolved config and the engine's layer (single-process or distributed) behind "
                          "moe_engine.torch.MoELayer; parameters are passed in on every call.")
      .def(py::init<const std::vector<std::string>&, std::optional<bool>>(), py::arg("overrides"),
           py::arg("distributed") = py::none(),
           "overrides: 'key=value' config tokens; distributed: None = when the job has several ranks or a "
           "parallelism key is not 1 (collective then).")
      .def_property_readonly("distributed", &EngineLayer::distributed,
                             "True when the layer runs over the MPI ranks.")
      .def(
          "config_table",
          [](const EngineLayer& l) {
            py::list out;
            for (const auto& e : l.table()) out.append(py::make_tuple(e.key, e.value, e.source));
            return out;
          },
          "[(key, value, source)] for every config key, in documentation order.")
      .def("param_shapes", &EngineLayer::param_shapes,
           "[(SPEC name, shape)] of this rank's parameters, in file order.")
      .def(
          "shard",
          [](const EngineLayer& l, const py::dict& full) {
            return dict_out(l.shard(dict_in(full, "weight")));
          },
          py::arg("full"),
          "This rank's part of full weights {SPEC name: tensor} (all of them on one process).")
      .def(
          "unshard",
          [](const EngineLayer& l, const py::dict& parts) {
            TensorDict p = dict_in(parts, "parameter");
            TensorDict full;
            {
              py::gil_scoped_release nogil;
              full = l.unshard(p);
            }
            return dict_out(full);
          },
          py::arg("parts"),
          "Full weights from every rank's parts, on every rank (collective when distributed).")
      .def(
          "init_params",
          [](const EngineLayer& l) {
            TensorDict full;
            init_weights(l.config(), uint64_t(l.config().seed))
                .for_each(l.config(), [&](const std::string& n, const Tensor& t) { full[n] = t; });
            return dict_out(l.shard(full));
          },
          "This rank's part of init_weights(seed), {SPEC name: tensor}.")
      .def("forward", &forward, py::arg("params"), py::arg("x"), py::arg("keep_state"),
           "(y, load_balance_loss, z_loss, group_sizes, topk_idx, topk_weights, dropped, state): the "
           "engine's forward "
           "of x [T, D]; state (None unless keep_state) is for backward.")
      .def("backward", &backward, py::arg("state"), py::arg("dy"), py::arg("cot_load_balance"),
           py::arg("cot_z_loss"), py::arg("accumulate") = py::dict(),
           "(dx, {SPEC name: gradient}): the engine's backward of one forward's state (used once; an f64 "
           "layer's may be used again). accumulate: {SPEC name: f32 gradient} to add this step's into in "
           "place (single-process only), returned as the gradients.")
      .def(
          "step_minimum",
          [](const EngineLayer& l, int64_t tokens, const std::string& x_dtype) {
            if (tokens < 0) throw Error("step_minimum: tokens must be >= 0, got " + std::to_string(tokens));
            const std::optional<DType> xd = dtype_from_name(x_dtype);
            if (!xd) throw Error("step_minimum: x_dtype: expected f32, bf16 or f64, got '" + x_dtype + "'");
            const StepMinimum m = step_minimum(l.config(), tokens, *xd);
            py::dict d;
            d["weights"] = double(m.weights), d["weight_copies"] = double(m.weight_copies);
            d["gradients"] = double(m.gradients), d["saved"] = double(m.saved), d["io"] = double(m.step_io);
            d["total"] = double(m.total());
            return d;
          },
          py::arg("tokens"), py::arg("x_dtype"),
          "{term: bytes} that one forward + backward of `tokens` tokens cannot do without on one process "
          "(step_minimum, docs/architecture.md 'Memory of one step'): weights, weight_copies, gradients, "
          "saved, io and their total.")
      .def(
          "permutes_in_gemm", [](const EngineLayer& l) { return layer_permutes_in_gemm(l.config()); },
          "True where the kernel level's GEMMs gather the permuted rows themselves (the fused permute, "
          "amx_bf16, "
          "bf16): xs [T*K, D] is never written, and the saved tensors hold its i32 index instead.");
}
