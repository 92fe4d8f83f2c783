// Kernel entry points. Each takes tensors (via tensor_arg) and a stream handle.
#include <pybind11/pybind11.h>

#include "bindings/registry.h"
#include "bindings/tensor_arg.h"
#include "kernels/amax.h"

namespace py = pybind11;

namespace overlap::bindings {

void register_kernels(py::module_& m) {
  py::module_ k = m.def_submodule("kernels", "Quantization and reduction kernels.");
  k.def(
      "amax",
      [](py::handle x, py::handle out, std::uintptr_t stream) {
        const TensorRef xr = tensor_ref_from_py(x, "amax input");
        const TensorRef outr = tensor_ref_from_py(out, "amax out");
        py::gil_scoped_release release;
        kernels::amax(xr, outr, stream_from_py(stream));
      },
      py::arg("x"), py::arg("out"), py::kw_only(), py::arg("stream") = 0,
      "out[0] = max(|x|) (NaN propagates). x: contiguous fp32/fp16/bf16 on cpu or cuda; "
      "out: float32[1] on the same device; stream: CUDA stream handle (ignored on cpu).");
}

}  // namespace overlap::bindings
