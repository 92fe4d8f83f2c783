// Driver API entry points, obtained through the CUDA runtime.
//
// NOTE [no libcuda link]: the extension must import on machines with no GPU and no driver, so
// it never links libcuda. Driver functions are looked up once, on first use, with
// cudaGetDriverEntryPointByVersion; a machine without a driver gets a kUnsupported error at
// that point instead of an ImportError at import time.
#pragma once

#include <cuda.h>

namespace overlap {

// X-macro table: (name, driver version the signature dates from). Add entry points here.
#define OVERLAP_DRIVER_ENTRY_POINTS(X)     \
  X(cuGetErrorName, 12000)                 \
  X(cuGetErrorString, 12000)               \
  X(cuDeviceGet, 12000)                    \
  X(cuDeviceGetAttribute, 12000)           \
  X(cuCtxGetDevice, 12000)                 \
  X(cuPointerGetAttribute, 12000)          \
  X(cuMemGetAllocationGranularity, 12000)  \
  X(cuMemCreate, 12000)                    \
  X(cuMemRelease, 12000)                   \
  X(cuMemAddressReserve, 12000)            \
  X(cuMemAddressFree, 12000)               \
  X(cuMemMap, 12000)                       \
  X(cuMemUnmap, 12000)                     \
  X(cuMemSetAccess, 12000)                 \
  X(cuMemExportToShareableHandle, 12000)   \
  X(cuMemImportFromShareableHandle, 12000) \
  X(cuStreamWriteValue32, 12000)           \
  X(cuStreamWaitValue32, 12000)            \
  X(cuStreamWriteValue64, 12000)           \
  X(cuStreamWaitValue64, 12000)            \
  X(cuGraphGetNodes, 12000)                \
  X(cuGraphNodeGetType, 12000)             \
  X(cuGraphBatchMemOpNodeGetParams, 12000) \
  X(cuGraphExecBatchMemOpNodeSetParams, 12000)

struct DriverApi {
#define OVERLAP_DECLARE_ENTRY(name, version) decltype(&::name) name = nullptr;
  OVERLAP_DRIVER_ENTRY_POINTS(OVERLAP_DECLARE_ENTRY)
#undef OVERLAP_DECLARE_ENTRY
};

// Returns the loaded table; throws Error(kUnsupported) naming the missing symbol when the
// installed driver lacks one (or when there is no driver at all).
const DriverApi& driver();

}  // namespace overlap
