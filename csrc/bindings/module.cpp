// overlap._C: the single extension module. Each subsystem registers itself.
#include "bindings/registry.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "overlap C++/CUDA core (torch-free); use the `overlap` package, not this module.";
  overlap::bindings::register_errors(m);
  overlap::bindings::register_common(m);
  overlap::bindings::register_kernels(m);
  overlap::bindings::register_comm(m);
  overlap::bindings::register_comm_ops(m);
  overlap::bindings::register_comm_bulk_ops(m);
  overlap::bindings::register_gemm(m);
}
