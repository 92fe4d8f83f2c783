#include "bindings/signals.h"

#include <pybind11/pybind11.h>

#include "comm/fault.h"
#include "common/lifecycle.h"

namespace py = pybind11;

namespace overlap::bindings {

namespace {

// Python's main thread, where signal handlers run (0 until install_signal_check).
unsigned long g_main_thread = 0;

// The exception a handler raised during this thread's wait, until the translator restores it
// (strong references, as PyErr_Fetch hands them over).
struct SignalError {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
};
thread_local SignalError t_error;

// NOTE [interrupting waits]: runs on a waiting thread that released the GIL.
bool check_python_signals() {
  if (PyThread_get_thread_ident() != g_main_thread || process_finalizing()) return false;
  const PyGILState_STATE state = PyGILState_Ensure();
  bool raised = false;
  if (PyErr_CheckSignals() != 0) {
    raised = true;
    if (t_error.type == nullptr) {
      PyErr_Fetch(&t_error.type, &t_error.value, &t_error.traceback);
    } else {
      PyErr_Clear();  // the first one is kept
    }
  }
  PyGILState_Release(state);
  return raised;
}

}  // namespace

void install_signal_check() {
  g_main_thread =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  comm::set_interrupt_check(&check_python_signals);
}

bool restore_signal_error() {
  if (t_error.type == nullptr) return false;
  PyErr_Restore(t_error.type, t_error.value, t_error.traceback);  // steals the references
  t_error = SignalError{};
  return true;
}

}  // namespace overlap::bindings
