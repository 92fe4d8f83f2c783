// Error plumbing for the whole C++ core.
//
// NOTE [errors]: every failure in the core is an overlap::Error carrying an ErrorKind. The
// binding layer maps each kind onto one Python exception class of overlap.errors, so a C++
// timeout surfaces as overlap.CommTimeoutError, a bad argument as overlap.InvalidArgumentError,
// and so on. Messages carry file:line, the failed expression and the values involved.
// Nothing in the core calls exit() or abort(); destructors use the OVERLAP_WARN_* forms,
// which log instead of throwing.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace overlap {

enum class ErrorKind {
  kInternal,         // a bug in overlap itself
  kInvalidArgument,  // bad tensor, shape, dtype, pointer or size from the caller
  kConfig,           // invalid configuration (options, group layout, environment)
  kState,            // wrong lifecycle state: use after destroy, before rendezvous, ...
  kTimeout,          // a wait passed its deadline
  kUnsupported,      // the hardware or the build cannot do this
  kCuda,             // a CUDA runtime / driver / cuBLAS call failed
  kBootstrap,        // ranks disagree during a collective rendezvous
  kSystem,           // an OS call failed (shm_open, mmap, ...)
  kAborted,          // a wait was cut short: the communicator was aborted or interrupted
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {

// Builds "<message> [<expr>] (at file:line in function)".
[[noreturn]] void throw_error(ErrorKind kind, const char* file, int line, const char* func,
                              const char* expr, const std::string& message);

// Writes one warning line to stderr (or the installed sink); used where throwing is forbidden.
void emit_warning(const char* file, int line, const std::string& message);

}  // namespace detail

// Log sink and level, set by Python (the core never reads the environment).
enum class LogLevel { kDebug = 10, kInfo = 20, kWarning = 30, kError = 40 };
void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, const std::string& message);

}  // namespace overlap

#define OVERLAP_STRINGIFY_(x) #x
#define OVERLAP_STRINGIFY(x) OVERLAP_STRINGIFY_(x)

// Throws overlap::Error(kind) with a streamed message: OVERLAP_THROW(kConfig, "bad " << x).
#define OVERLAP_THROW(kind, msg_stream)                                                      \
  do {                                                                                       \
    std::ostringstream overlap_oss_;                                                         \
    overlap_oss_ << msg_stream;                                                              \
    ::overlap::detail::throw_error(::overlap::ErrorKind::kind, __FILE__, __LINE__, __func__, \
                                   nullptr, overlap_oss_.str());                             \
  } while (0)

// OVERLAP_CHECK(cond, kind, msg_stream): throws when cond is false; the message names cond.
#define OVERLAP_CHECK(cond, kind, msg_stream)                                                  \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::ostringstream overlap_oss_;                                                         \
      overlap_oss_ << msg_stream;                                                              \
      ::overlap::detail::throw_error(::overlap::ErrorKind::kind, __FILE__, __LINE__, __func__, \
                                     #cond, overlap_oss_.str());                               \
    }                                                                                          \
  } while (0)

#define OVERLAP_CHECK_ARG(cond, msg_stream) OVERLAP_CHECK(cond, kInvalidArgument, msg_stream)

// Binary comparisons that print both operands' values.
#define OVERLAP_CHECK_OP_(a, b, op, kind, msg_stream)                                          \
  do {                                                                                         \
    const auto& overlap_a_ = (a);                                                              \
    const auto& overlap_b_ = (b);                                                              \
    if (!(overlap_a_ op overlap_b_)) {                                                         \
      std::ostringstream overlap_oss_;                                                         \
      overlap_oss_ << msg_stream << " (" #a " = " << overlap_a_ << ", " #b " = " << overlap_b_ \
                   << ")";                                                                     \
      ::overlap::detail::throw_error(::overlap::ErrorKind::kind, __FILE__, __LINE__, __func__, \
                                     #a " " #op " " #b, overlap_oss_.str());                   \
    }                                                                                          \
  } while (0)
#define OVERLAP_CHECK_EQ(a, b, kind, msg) OVERLAP_CHECK_OP_(a, b, ==, kind, msg)
#define OVERLAP_CHECK_NE(a, b, kind, msg) OVERLAP_CHECK_OP_(a, b, !=, kind, msg)
#define OVERLAP_CHECK_LE(a, b, kind, msg) OVERLAP_CHECK_OP_(a, b, <=, kind, msg)
#define OVERLAP_CHECK_LT(a, b, kind, msg) OVERLAP_CHECK_OP_(a, b, <, kind, msg)
#define OVERLAP_CHECK_GE(a, b, kind, msg) OVERLAP_CHECK_OP_(a, b, >=, kind, msg)
#define OVERLAP_CHECK_GT(a, b, kind, msg) OVERLAP_CHECK_OP_(a, b, >, kind, msg)

// POSIX calls returning -1 and setting errno.
#define OVERLAP_CHECK_ERRNO(expr, msg_stream)                                                     \
  do {                                                                                            \
    if ((expr) == -1) {                                                                           \
      const int overlap_errno_ = errno;                                                           \
      std::ostringstream overlap_oss_;                                                            \
      overlap_oss_ << msg_stream << ": " << ::overlap::detail::errno_string(overlap_errno_);      \
      ::overlap::detail::throw_error(::overlap::ErrorKind::kSystem, __FILE__, __LINE__, __func__, \
                                     #expr, overlap_oss_.str());                                  \
    }                                                                                             \
  } while (0)

// Logs instead of throwing: for destructors and cleanup paths.
#define OVERLAP_WARN(msg_stream)                                             \
  do {                                                                       \
    std::ostringstream overlap_oss_;                                         \
    overlap_oss_ << msg_stream;                                              \
    ::overlap::detail::emit_warning(__FILE__, __LINE__, overlap_oss_.str()); \
  } while (0)

namespace overlap::detail {
std::string errno_string(int err);
}  // namespace overlap::detail
