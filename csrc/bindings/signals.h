// Python signals during the core's waits (NOTE [interrupting waits] in comm/fault.h).
#pragma once

namespace overlap::bindings {

// Installs the core's interrupt check: on Python's main thread, every kInterruptPeriod of a
// wait, it reacquires the GIL and runs the pending signal handlers; where one raises, it keeps
// the exception for this thread and tells the wait to stop. Called once, at import.
void install_signal_check();

// Sets the exception a signal handler raised during this thread's last interrupted wait as
// the current Python error and returns true, or returns false where there is none. Called
// with the GIL held by the exception translator, in place of the core's kAborted error.
bool restore_signal_error();

}  // namespace overlap::bindings
