// loom_torch._C: the C++ half of the loom_torch package. It exposes the creator torch calls for
// backend "loom" (loom_torch/__init__.py registers it) and turns Loom's exceptions into
// loom_torch.LoomError (a RuntimeError) carrying Loom's message.
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <string>

#include "loom/common/error.h"
#include "process_group_loom.h"

namespace py = pybind11;

namespace {

c10::intrusive_ptr<c10d::ProcessGroup> createProcessGroupLoom(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int64_t timeoutMs,
    const std::string& storeHost) {
  loom::torch_backend::BackendOptions options;
  options.timeout = std::chrono::milliseconds(timeoutMs);
  options.storeHost = storeHost;
  return c10::make_intrusive<loom::torch_backend::ProcessGroupLoom>(store, rank, size, options);
}

std::string transportSummary(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  auto* loomGroup = dynamic_cast<loom::torch_backend::ProcessGroupLoom*>(group.get());
  LOOM_CHECK(loomGroup != nullptr, "not a loom process group (backend ", group->getBackendName(),
             ")");
  return loomGroup->loomGroup().transportSummary();
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Loom's torch.distributed backend (C++ part)";
  py::register_exception<loom::Error>(m, "LoomError", PyExc_RuntimeError);
  m.def("_create_process_group", &createProcessGroupLoom, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout_ms"), py::arg("store_host"),
        py::call_guard<py::gil_scoped_release>(),
        "Creates the loom ProcessGroup of one rank (collective over the group).");
  m.def("_transport_summary", &transportSummary, py::arg("group"),
        "What carries a loom group's data: 'shm (all 2 ranks on this host)', 'tcp', ...");
}
