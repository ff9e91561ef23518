// loom_torch._C: the C++ half of the loom_torch package. It exposes the creator torch calls for
// backend "loom" (loom_torch/__init__.py registers it) and turns Loom's exceptions into
// loom_torch.LoomError (a RuntimeError) carrying Loom's message.
#include <ATen/Functions.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/window.h"
#include "loom/common/error.h"
#include "loom/process_group/factory.h"
#include "process_group_loom.h"
#include "store_adapter.h"

namespace py = pybind11;

namespace {

using loom::torch_backend::C10dBase;

// The creator torch calls: a ProcessGroup on torch 1.13, the backend for "cpu" on 2.x.
c10::intrusive_ptr<C10dBase> createProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size, int64_t timeoutMs,
                                                    const std::string& storeHost, bool reproducible,
                                                    int storePort, const std::string& name,
                                                    const std::vector<int>& parentRanks) {
  loom::torch_backend::BackendOptions options;
  options.groupName = name;
  options.parentRanks = parentRanks;
  options.reproducible = reproducible;
  options.timeout = std::chrono::milliseconds(timeoutMs);
  options.storeHost = storeHost;
  options.storePort = storePort;
  return c10::make_intrusive<loom::torch_backend::ProcessGroupLoom>(store, rank, size, options);
}

// The backend behind a group as Python passes it: on torch 1.13 the ProcessGroup is the
// backend; on 2.x a ProcessGroup dispatches to one backend per device type, and loom's is its
// backend for "cpu" (a Backend object is taken as it is).
c10::intrusive_ptr<C10dBase> backendOf(py::handle group) {
#if LOOM_TORCH_AT_LEAST(2, 1)
  if (py::isinstance<c10d::ProcessGroup>(group)) {
    return group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>()->getBackend(c10::DeviceType::CPU);
  }
#endif
  return group.cast<c10::intrusive_ptr<C10dBase>>();
}

loom::torch_backend::ProcessGroupLoom& loomOf(const c10::intrusive_ptr<C10dBase>& group,
                                              const char* what) {
  auto* loomGroup = dynamic_cast<loom::torch_backend::ProcessGroupLoom*>(group.get());
  LOOM_CHECK(loomGroup != nullptr, what, ": not a loom process group (backend ",
             group->getBackendName(), ")");
  return *loomGroup;
}

std::string transportSummary(const c10::intrusive_ptr<C10dBase>& group) {
  return loomOf(group, "transport_summary").loomGroup().transportSummary();
}

// This rank's flight record as JSON (docs/diagnostics.md), also published in the group's store.
std::string flightRecord(const c10::intrusive_ptr<C10dBase>& group) {
  return loomOf(group, "flight_record").loomGroup().dumpFlightRecord();
}

// How many requests the group sent to torch's store so far (docs/torch.md, "Store load").
uint64_t storeRequests(const c10::intrusive_ptr<C10dBase>& group) {
  return loomOf(group, "_store_requests").storeRequests();
}

// A key of the group's store as Loom reads it (under the group's prefixes, whatever the torch
// version nests them as), waiting for it with the group's timeout; for tests.
py::bytes storeGet(const c10::intrusive_ptr<C10dBase>& group, const std::string& key) {
  const auto value = loomOf(group, "_store_get").store().get(key);
  return py::bytes(reinterpret_cast<const char*>(value.data()), value.size());
}

// A uint8 CPU tensor of `bytes` whose storage is a Loom window (loom/comm/window.h); the
// window lives until the storage is freed (the tensor and every view of it).
at::Tensor windowTensor(int64_t bytes) {
  LOOM_CHECK(bytes > 0, "window tensor: ", bytes, " bytes; expected at least 1");
  std::shared_ptr<loom::comm::Window> window =
      loom::comm::Window::allocate(static_cast<size_t>(bytes));
  auto* holder = new std::shared_ptr<loom::comm::Window>(window);
  return at::from_blob(
      window->data(), {bytes}, [holder](void*) { delete holder; },
      at::TensorOptions().dtype(at::kByte).device(at::kCPU));
}

// Seconds for `iters` all-reduces (sum) of `tensor` over `group`, each issued and waited for
// from C++: ProcessGroupLoom's own path without Python or c10d's dispatcher. The benchmark
// (bench/torch/allreduce_vs_gloo.py --layers) sets it between loom-bench and dist.all_reduce.
double allreduceLoop(const c10::intrusive_ptr<C10dBase>& group, at::Tensor tensor, int64_t iters) {
  LOOM_CHECK(iters >= 0, "_allreduce_loop: ", iters, " iterations; expected 0 or more");
  auto& loomGroup = loomOf(group, "_allreduce_loop");
  std::vector<at::Tensor> tensors{std::move(tensor)};
  const c10d::AllreduceOptions opts;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) loomGroup.allreduce(tensors, opts)->wait();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Loom's torch.distributed backend (C++ part)";
  // The torch this module was compiled against ("2.15.0"); loom_torch compares it with the
  // torch it runs under.
  m.attr("TORCH_VERSION") = loom::torch_backend::kTorchVersion;
  py::register_exception<loom::Error>(m, "LoomError", PyExc_RuntimeError);
  m.def("_create_process_group", &createProcessGroupLoom, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout_ms"), py::arg("store_host"),
        py::arg("reproducible") = false, py::arg("store_port") = 0, py::arg("name") = "",
        py::arg("parent_ranks") = std::vector<int>{}, py::call_guard<py::gil_scoped_release>(),
        "Creates the loom ProcessGroup of one rank (collective over the group).");
  // The functions that take a group resolve its backend holding the GIL, then release it.
  m.def(
      "_transport_summary",
      [](py::handle group) {
        auto backend = backendOf(group);
        py::gil_scoped_release nogil;
        return transportSummary(backend);
      },
      py::arg("group"),
      "What carries a loom group's data: 'shm (all 2 ranks on this host)', 'tcp', ...");
  m.def(
      "_reproducible",
      [](py::handle group) { return loomOf(backendOf(group), "is_reproducible").reproducible(); },
      py::arg("group"), "Whether the group's reductions run in reproducible mode.");
  m.def(
      "_allreduce_loop",
      [](py::handle group, at::Tensor tensor, int64_t iters) {
        auto backend = backendOf(group);
        py::gil_scoped_release nogil;
        return allreduceLoop(backend, std::move(tensor), iters);
      },
      py::arg("group"), py::arg("tensor"), py::arg("iters"),
      "Seconds for `iters` sum all-reduces of `tensor`, issued and waited for from C++.");
  m.def(
      "_flight_record",
      [](py::handle group) {
        auto backend = backendOf(group);
        py::gil_scoped_release nogil;
        return flightRecord(backend);
      },
      py::arg("group"),
      "This rank's flight record of a loom group, as JSON (docs/diagnostics.md).");
  m.def(
      "_store_get",
      [](py::handle group, const std::string& key) { return storeGet(backendOf(group), key); },
      py::arg("group"), py::arg("key"),
      "A key of a loom group's store, read as Loom reads it (for tests).");
  m.def(
      "_store_requests", [](py::handle group) { return storeRequests(backendOf(group)); },
      py::arg("group"), "Requests a loom group has sent to torch's store so far (for tests).");
  m.def(
      "_transports",
      [] {
        // Each Loom backend this build knows, with why it cannot run here ("" when it can).
        std::vector<std::pair<std::string, std::string>> out;
        for (const auto& name : loom::backendNames()) {
          std::string why;
          try {
            loom::checkAvailable(name);
          } catch (const loom::Error& e) {
            why = e.what();
          }
          out.emplace_back(name, why);
        }
        return out;
      },
      "Loom's backends as (name, why not available here: '' when available). The loom torch "
      "backend runs on 'tcp' (shared memory between ranks on one host).");
  m.def("_window_tensor", &windowTensor, py::arg("bytes"),
        "A uint8 CPU tensor of `bytes` in a Loom window (zero-copy shared memory).");
}
