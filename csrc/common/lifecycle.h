// Process-wide lifecycle facts shared by every RAII owner.
//
// NOTE [finalizing]: when the Python interpreter shuts down, the CUDA runtime may already be
// torn down by the time our objects' destructors run. Python marks the process as finalizing
// from an atexit hook; from then on, owners skip driver/runtime calls and let the OS reclaim.
#pragma once

namespace overlap {

void mark_process_finalizing();
bool process_finalizing();

}  // namespace overlap
