// DLPack export of raw memory (buffer regions) as framework tensors without a copy.
//
// The structs below are the DLPack ABI (dlpack.h v0.8, the unversioned "dltensor" capsule
// every framework's from_dlpack accepts), spelled out here so that the core and the bindings
// need no framework headers. Only what we export is declared.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace overlap::bindings {

// A 1-D uint8 tensor of `nbytes` at `data` on `device` (-1: host memory). `owner` is kept
// alive until the consumer frees the tensor (NOTE [views outlive destroy]). Consumers view
// the bytes as the dtype and shape they need.
pybind11::capsule byte_view_capsule(void* data, std::size_t nbytes, int device,
                                    std::shared_ptr<const void> owner);

}  // namespace overlap::bindings
