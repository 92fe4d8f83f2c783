// overlap._C.comm: transports, symmetric buffers and collectives.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/dlpack.h"
#include "bindings/registry.h"
#include "bindings/signals.h"
#include "bindings/tensor_arg.h"
#include "comm/collectives.h"
#include "comm/host/shm_region.h"
#include "comm/op_protocol.h"
#ifdef OVERLAP_WITH_CUDA
#include "comm/cuda/graph_log.h"
#endif
#include "comm/symmetric_buffer.h"
#include "comm/transport.h"
#include "common/errors.h"

namespace py = pybind11;

namespace overlap::bindings {

using comm::SymmetricBuffer;
using comm::Transport;

void register_comm(py::module_& m) {
  py::module_ c = m.def_submodule("comm", "Userbuffers runtime (use overlap.comm instead).");
  install_signal_check();  // NOTE [interrupting waits] in comm/fault.h

  py::class_<Transport, std::shared_ptr<Transport>>(c, "Transport")
      .def_property_readonly("name", [](const Transport& t) { return transport_name(t.kind()); })
      .def_property_readonly("device", &Transport::device)
      .def("raise_if_failed", &Transport::raise_if_failed)
      .def_property_readonly("failed", &Transport::failed)
      .def_property_readonly("failure", &Transport::failure)
      // NOTE [abort] in comm/fault.h: atomics only, so the GIL stays (nothing blocks).
      .def("abort", &Transport::request_abort)
      .def(
          "fail",
          [](Transport& t, const std::string& kind, const std::string& message) {
            const ErrorKind k = kind == "timeout" ? ErrorKind::kTimeout : ErrorKind::kBootstrap;
            t.fail(k, message);
          },
          py::arg("kind"), py::arg("message"),
          "Fails the transport (NOTE [failed transport]) with a set-up fault found in Python: "
          "kind 'timeout' or 'bootstrap'.")
      .def(
          "synchronize",
          [](Transport& t, std::uintptr_t stream) {
            py::gil_scoped_release release;
            t.synchronize(stream_from_py(stream));
          },
          py::kw_only(), py::arg("stream") = 0);
  c.def("make_host_transport",
        [] { return std::shared_ptr<Transport>(comm::make_host_transport()); });
  c.def(
      "make_cuda_transport",
      [](int device) -> std::shared_ptr<Transport> {
#ifdef OVERLAP_WITH_CUDA
        return comm::make_cuda_transport(device);
#else
        OVERLAP_THROW(kUnsupported,
                      "this overlap build has no CUDA support (built with "
                      "OVERLAP_BUILD_CUDA=OFF or without nvcc); the cuda "
                      "transport needs it. Rebuild with CUDA, or use the host "
                      "transport");
#endif
      },
      py::arg("device"));

  c.def(
      "unlink_region_name", [](const std::string& tag) { comm::unlink_shm(comm::shm_name(tag)); },
      py::arg("tag"),
      "Removes the shared-memory name of the region tagged `tag` (any rank's), where it exists: "
      "a failed rendezvous leaves none behind, a dead rank's included (NOTE [shm names]).");

  c.attr("max_buffer_bytes") = SymmetricBuffer::kMaxBytes;
  c.attr("max_timeout_s") = SymmetricBuffer::kMaxTimeoutS;
  c.attr("window_align") = SymmetricBuffer::kWindowAlign;

  py::class_<SymmetricBuffer, std::shared_ptr<SymmetricBuffer>>(c, "SymmetricBuffer")
      .def(
          py::init<std::shared_ptr<Transport>, int, int, std::size_t, const std::string&, double>(),
          py::kw_only(), py::arg("transport"), py::arg("rank"), py::arg("size"), py::arg("nbytes"),
          py::arg("tag"), py::arg("timeout_s"))
      .def("local_handle", [](const SymmetricBuffer& b) { return py::bytes(b.local_handle()); })
      .def(
          "connect",
          [](SymmetricBuffer& b, const std::vector<py::bytes>& handles) {
            std::vector<std::string> hs(handles.begin(), handles.end());
            b.connect(hs);
          },
          py::arg("handles"))
      .def("finish_rendezvous", &SymmetricBuffer::finish_rendezvous)
      // NOTE [destroy while in use]: may wait for an op on another thread, which may need the
      // GIL to finish (its interrupt check).
      .def("destroy", &SymmetricBuffer::destroy, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("ready", &SymmetricBuffer::ready)
      .def_property_readonly("destroyed", &SymmetricBuffer::destroyed)
      .def_property_readonly("rank", &SymmetricBuffer::rank)
      .def_property_readonly("size", &SymmetricBuffer::size)
      .def_property_readonly("nbytes", &SymmetricBuffer::bytes)
      .def_property_readonly("allocated_bytes", &SymmetricBuffer::allocated_bytes)
      .def_static("window", &SymmetricBuffer::window, py::arg("parent"), py::arg("offset"),
                  py::arg("nbytes"),
                  "A window over bytes [offset, offset + nbytes) of `parent` (NOTE [buffer "
                  "windows])")
      .def_property_readonly("is_window", &SymmetricBuffer::is_window)
      .def_property_readonly("window_offset", &SymmetricBuffer::window_offset)
      .def_property_readonly("epoch", &SymmetricBuffer::epoch,
                             "The last epoch taken by an op on this buffer (0 before the first)")
      .def_property("timeout_s", &SymmetricBuffer::timeout_s, &SymmetricBuffer::set_timeout_s)
      .def_property("put_split", &SymmetricBuffer::put_split, &SymmetricBuffer::set_put_split)
      .def_property("pull_gather", &SymmetricBuffer::pull_gather, &SymmetricBuffer::set_pull_gather)
      .def_property("serial_puts", &SymmetricBuffer::serial_puts, &SymmetricBuffer::set_serial_puts)
      .def_property_readonly("sm_percent", &SymmetricBuffer::sm_percent)
      .def_property_readonly("sm_blocks", &SymmetricBuffer::sm_blocks)
      .def("set_sm_share", &SymmetricBuffer::set_sm_share, py::arg("percent"), py::arg("blocks"))
      .def(
          "_skip_epochs_for_test",
          [](SymmetricBuffer& b, std::uint64_t count) { b.take_epochs(count); }, py::arg("count"),
          "Test hook: take `count` epochs without an op, putting this rank's op sequence out "
          "of step with its peers' (NOTE [op sequence] in op_protocol.cpp).")
      .def(
          "all_gather",
          [](SymmetricBuffer& b, py::handle input, std::uintptr_t stream) {
            std::uint64_t type = 0;  // NOTE [gather dtypes]: any dtype
            const TensorRef in = tensor_bytes_from_py(input, "all_gather input", &type);
            b.check_tensor(in, "all_gather input");
            py::gil_scoped_release release;
            comm::run_op(b, [&] {
              comm::all_gather(b, in.data, in.nbytes(), stream_from_py(stream), type);
            });
          },
          py::arg("input"), py::kw_only(), py::arg("stream") = 0)
      .def(
          "all_gather_parts",
          [](SymmetricBuffer& b, const std::vector<std::pair<py::handle, std::size_t>>& parts,
             std::uintptr_t stream) {
            std::vector<comm::GatherPart> ps;
            for (const auto& [input, offset] : parts) {
              std::uint64_t type = 0;  // NOTE [gather dtypes]: any dtype
              const TensorRef in = tensor_bytes_from_py(input, "all_gather part", &type);
              b.check_tensor(in, "all_gather part");
              ps.push_back({in.data, offset, static_cast<std::size_t>(in.nbytes()), type});
            }
            py::gil_scoped_release release;
            comm::run_op(b, [&] { comm::all_gather_parts(b, ps, stream_from_py(stream)); });
          },
          py::arg("parts"), py::kw_only(), py::arg("stream") = 0)
      .def(
          "reduce_scatter",
          [](SymmetricBuffer& b, py::handle input, py::handle output, std::uintptr_t stream) {
            const TensorRef in = tensor_ref_from_py(input, "reduce_scatter input");
            const TensorRef out = tensor_ref_from_py(output, "reduce_scatter output");
            b.check_tensor(in, "reduce_scatter input");
            b.check_tensor(out, "reduce_scatter output");
            OVERLAP_CHECK_ARG(in.dtype == out.dtype, "reduce_scatter: input "
                                                         << in.describe() << " and output "
                                                         << out.describe() << " differ in dtype");
            OVERLAP_CHECK_ARG(in.numel() == out.numel() * b.size(),
                              "reduce_scatter: input " << in.describe() << " must hold group size ("
                                                       << b.size() << ") x output "
                                                       << out.describe() << " elements");
            py::gil_scoped_release release;
            comm::run_op(b, [&] {
              comm::reduce_scatter(b, in.data, out.data, static_cast<std::size_t>(out.numel()),
                                   in.dtype, stream_from_py(stream));
            });
          },
          py::arg("input"), py::arg("output"), py::kw_only(), py::arg("stream") = 0)
      .def(
          "barrier",
          [](SymmetricBuffer& b, std::uintptr_t stream) {
            py::gil_scoped_release release;
            comm::run_op(b, [&] { comm::barrier(b, stream_from_py(stream)); });
          },
          py::kw_only(), py::arg("stream") = 0)
      .def(
          "view",
          [](SymmetricBuffer& b, int peer, std::size_t offset, std::size_t nbytes) {
            const SymmetricBuffer::Use use(b, "view");  // NOTE [destroy while in use]
            b.check_ready("view");
            OVERLAP_CHECK_ARG(offset <= b.bytes() && nbytes <= b.bytes() - offset,
                              "view: bytes [" << offset << ", " << offset + nbytes
                                              << ") are outside the buffer's " << b.bytes()
                                              << " bytes");
            return byte_view_capsule(b.data(peer) + offset, nbytes, b.transport().device(),
                                     b.keep_alive(peer));
          },
          py::arg("peer"), py::arg("offset"), py::arg("nbytes"))
      .def(
          "copy_out",
          [](SymmetricBuffer& b, py::handle output, std::size_t offset, std::uintptr_t stream) {
            std::uint64_t type = 0;  // bytes: any dtype (NOTE [gather dtypes])
            const TensorRef out = tensor_bytes_from_py(output, "copy_out output", &type);
            const SymmetricBuffer::Use use(b, "copy_out");  // NOTE [destroy while in use]
            b.check_ready("copy_out");
            b.check_tensor(out, "copy_out output");
            OVERLAP_CHECK_ARG(offset <= b.bytes() && out.nbytes() <= b.bytes() - offset,
                              "copy_out: bytes [" << offset << ", " << offset + out.nbytes()
                                                  << ") are outside the buffer's " << b.bytes()
                                                  << " bytes");
            py::gil_scoped_release release;
            b.transport().put(out.data, b.data(b.rank()) + offset, out.nbytes(),
                              stream_from_py(stream), 0);
          },
          py::arg("output"), py::arg("offset"), py::kw_only(), py::arg("stream") = 0);

  // CUDA-graph capture of comm ops (NOTE [graph capture] in comm/cuda/graph_log.h); absent
  // from builds without CUDA (overlap.CudaGraph says so).
#ifdef OVERLAP_WITH_CUDA
  using comm::cuda::GraphLog;
  py::class_<GraphLog, std::shared_ptr<GraphLog>>(c, "GraphLog")
      .def_property_readonly("ops", &GraphLog::ops)
      .def(
          "prepare_replay",
          [](GraphLog& log, std::uintptr_t graph, std::uintptr_t exec, std::uintptr_t stream) {
            py::gil_scoped_release release;
            log.prepare_replay(reinterpret_cast<CUgraph>(graph),
                               reinterpret_cast<CUgraphExec>(exec), stream_from_py(stream));
          },
          py::arg("graph"), py::arg("exec"), py::kw_only(), py::arg("stream"));
  c.def(
      "begin_graph_log",
      [](std::uintptr_t stream) { return comm::cuda::begin_graph_log(stream_from_py(stream)); },
      py::kw_only(), py::arg("stream"));
  c.def("end_graph_log", &comm::cuda::end_graph_log, py::arg("log"));
#endif
}

}  // namespace overlap::bindings
