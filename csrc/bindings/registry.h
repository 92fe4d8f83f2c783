// Each subsystem registers its own functions into the one extension module.
#pragma once

#include <pybind11/pybind11.h>

namespace overlap::bindings {

void register_errors(pybind11::module_& m);
void register_common(pybind11::module_& m);
void register_kernels(pybind11::module_& m);
void register_comm(pybind11::module_& m);
void register_comm_ops(pybind11::module_& m);
void register_comm_bulk_ops(pybind11::module_& m);  // after register_comm_ops
void register_gemm(pybind11::module_& m);

}  // namespace overlap::bindings
